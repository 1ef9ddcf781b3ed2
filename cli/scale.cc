#include "cli/scale.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "common/subprocess.h"

namespace pdserve::cli {
namespace {

constexpr absl::Duration kPollEvery = absl::Milliseconds(100);
constexpr absl::Duration kRpcTimeout = absl::Seconds(5);
// Beyond its drain deadline and hand-back grace, the time a removed worker
// gets to deregister and stop before it is killed.
constexpr absl::Duration kExitMargin = absl::Seconds(30);
// kHandBackGrace (worker/worker_process.h; pdctl does not link the
// worker runtime, whose flags would clash with its own): after its drain
// deadline a worker waits this long for the requests it handed back.
constexpr absl::Duration kHandBackGrace = absl::Seconds(5);

// Index I of a worker named POOL-I (-1 if none).
int WorkerIndex(const std::string& name) {
  const size_t dash = name.rfind('-');
  int index = -1;
  if (dash == std::string::npos ||
      !absl::SimpleAtoi(name.substr(dash + 1), &index)) {
    return -1;
  }
  return index;
}

// Writes `content` to `path` whole: readers see the old file or the new.
void WriteWhole(const std::string& path, const std::string& content) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp);
    out << content;
  }
  std::rename(tmp.c_str(), path.c_str());
}

std::optional<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

std::string FormatScaleRequest(const ScaleRequest& request) {
  return absl::StrCat("scale ", request.id, " ", request.pool, " ",
                      request.replicas, " ",
                      absl::ToInt64Milliseconds(request.drain_deadline), "\n");
}

absl::StatusOr<ScaleRequest> ParseScaleRequest(const std::string& line) {
  const std::vector<std::string> f =
      absl::StrSplit(line, ' ', absl::SkipWhitespace());
  ScaleRequest request;
  int64_t deadline_ms = 0;
  if (f.size() != 5 || f[0] != "scale") {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed scale request '", line, "'"));
  }
  request.id = f[1];
  request.pool = f[2];
  if (!absl::SimpleAtoi(f[3], &request.replicas) || request.replicas < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the number of workers must be a whole number >= 0, not '", f[3], "'"));
  }
  if (!absl::SimpleAtoi(f[4], &deadline_ms) || deadline_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the drain deadline must be > 0 ms, not '", f[4], "'"));
  }
  request.drain_deadline = absl::Milliseconds(deadline_ms);
  if (absl::Status pool = CheckPoolName(request.pool); !pool.ok()) {
    return pool;
  }
  return request;
}

absl::Status CheckPoolName(const std::string& pool) {
  if (pool == "prefill" || pool == "decode" || pool == "colocated") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no pool '", pool, "': the pools are prefill, decode and colocated"));
}

std::string PoolOfWorker(const std::string& name) {
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos || WorkerIndex(name) < 0) return "";
  const std::string pool = name.substr(0, dash);
  return CheckPoolName(pool).ok() ? pool : "";
}

absl::Status CheckPoolSizes(const std::map<std::string, int>& sizes) {
  auto size = [&](const std::string& pool) {
    auto it = sizes.find(pool);
    return it == sizes.end() ? 0 : it->second;
  };
  for (const auto& [pool, n] : sizes) {
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a pool cannot have ", n, " workers"));
    }
  }
  // Every request ends on a worker that decodes; a prefill worker only
  // ever computes prompts for one. With no prefill worker, decode and
  // colocated workers prefill prompts themselves.
  if (size("decode") + size("colocated") == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refused: the cluster would have no decode or colocated worker, and "
        "every request needs one to generate its tokens (it has ",
        size("prefill"),
        " prefill workers, which only compute prompts); add a worker to "
        "the other pool first"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ChooseVictims(std::vector<ScaleCandidate> candidates,
                                       int count) {
  auto key = [](const ScaleCandidate& c) {
    return std::make_tuple(!c.down, !c.draining, c.inflight,
                           -WorkerIndex(c.name), c.name);
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const ScaleCandidate& a, const ScaleCandidate& b) {
                     return key(a) < key(b);
                   });
  std::vector<std::string> victims;
  for (int i = 0; i < count && i < static_cast<int>(candidates.size()); ++i) {
    victims.push_back(candidates[i].name);
  }
  return victims;
}

absl::StatusOr<std::string> ScaleLocalCluster(
    LocalCluster& cluster, Supervisor& supervisor, const ScaleRequest& request,
    absl::Duration startup_timeout, const std::function<void()>& tick) {
  if (absl::Status pool = CheckPoolName(request.pool); !pool.ok()) return pool;
  if (request.replicas < 0) {
    return absl::InvalidArgumentError("the number of workers must be >= 0");
  }
  // The pools as the supervisor keeps them: a worker backing off or
  // crash-looping is still a member (and the first to go on a scale-down);
  // one leaving or gone is not.
  std::map<std::string, int> sizes = {
      {"prefill", 0}, {"decode", 0}, {"colocated", 0}};
  std::vector<std::string> members;
  for (const SupervisedProcess& r : supervisor.processes()) {
    const std::string pool = PoolOfWorker(r.name);
    if (pool.empty() || r.state == SupervisedState::kLeft ||
        r.state == SupervisedState::kLeaving) {
      continue;
    }
    ++sizes[pool];
    if (pool == request.pool) members.push_back(r.name);
  }
  const int current = sizes[request.pool];
  const std::string from_to = absl::StrCat(request.pool, ": ", current, " -> ",
                                           request.replicas, " workers");
  if (request.replicas == current) {
    return absl::StrCat(request.pool, " already has ", current, " workers");
  }
  std::map<std::string, int> target = sizes;
  target[request.pool] = request.replicas;
  if (absl::Status fits = CheckPoolSizes(target); !fits.ok()) return fits;

  if (request.replicas > current) {
    std::vector<std::string> started;
    for (int i = current; i < request.replicas; ++i) {
      absl::StatusOr<std::string> name =
          cluster.AddWorker(request.pool, startup_timeout);
      // A worker that started but did not register in time is still
      // supervised (and counted): it may yet register.
      supervisor.AdoptNew(absl::Now());
      tick();
      if (!name.ok()) {
        return absl::Status(
            name.status().code(),
            absl::StrCat(
                from_to, ": started ",
                started.empty() ? "none" : absl::StrJoin(started, ", "),
                ", then failed: ", name.status().message()));
      }
      started.push_back(*name);
    }
    return absl::StrCat(from_to, "; started ", absl::StrJoin(started, ", "),
                        " (each SERVING, registered with the router)");
  }

  // Scale down: pick, drain, wait for the exits.
  absl::StatusOr<v1::ListWorkersResponse> listed =
      ListWorkers(cluster.live_control_address(), v1::WORKER_ROLE_UNSPECIFIED,
                  kRpcTimeout, cluster.credential());
  std::vector<ScaleCandidate> candidates;
  for (const std::string& name : members) {
    ScaleCandidate c;
    c.name = name;
    const SupervisedProcess* record = supervisor.Find(name);
    c.down = record->state != SupervisedState::kRunning ||
             !cluster.Find(name)->process->running();
    if (listed.ok()) {
      for (const v1::WorkerInfo& w : listed->workers()) {
        if (w.worker_id() != name) continue;
        c.draining = w.state() == v1::WORKER_STATE_DRAINING;
        c.inflight = w.inflight_requests();
      }
    }
    candidates.push_back(c);
  }
  const std::vector<std::string> victims =
      ChooseVictims(candidates, current - request.replicas);
  std::vector<std::string> notes;
  for (const std::string& name : victims) {
    supervisor.Retire(name);
    LocalProcess* p = cluster.Find(name);
    if (!p->process->running()) continue;
    absl::StatusOr<v1::DrainWorkerResponse> drained =
        DrainWorker(cluster.live_control_address(), name,
                    request.drain_deadline, kRpcTimeout, cluster.credential());
    if (drained.ok()) continue;
    // The router did not take the command: the worker drains on SIGTERM
    // within its own --drain_timeout_ms.
    notes.push_back(absl::StrCat(name, ": router drain failed (",
                                 drained.status().message(),
                                 "), sent SIGTERM"));
    p->process->Signal(SIGTERM);
  }
  const absl::Duration allowed =
      request.drain_deadline + kHandBackGrace + kExitMargin;
  const absl::Time give_up = absl::Now() + allowed;
  auto any_running = [&] {
    for (const std::string& name : victims) {
      if (cluster.Find(name)->process->running()) return true;
    }
    return false;
  };
  while (any_running() && absl::Now() < give_up) {
    tick();
    absl::SleepFor(kPollEvery);
  }
  bool clean = true;
  std::vector<std::string> removed;
  for (const std::string& name : victims) {
    LocalProcess* p = cluster.Find(name);
    if (p->process->running()) {
      p->process->Signal(SIGKILL);
      p->process->Wait(absl::Seconds(5)).IgnoreError();
      clean = false;
      removed.push_back(absl::StrCat(name, " (did not exit within ",
                                     absl::FormatDuration(allowed),
                                     " of its drain; killed)"));
    } else {
      const absl::StatusOr<int> status = p->process->Wait(absl::ZeroDuration());
      const bool zero = status.ok() && *status == 0;
      clean &= zero;
      removed.push_back(absl::StrCat(
          name, " (drained, ",
          status.ok() ? DescribeWaitStatus(*status) : "exited", ")"));
    }
  }
  tick();
  for (const std::string& name : victims) {
    supervisor.Forget(name);
    cluster.Remove(name).IgnoreError();
  }
  std::string report =
      absl::StrCat(from_to, "; removed ", absl::StrJoin(removed, ", "));
  if (!notes.empty())
    absl::StrAppend(&report, "; ", absl::StrJoin(notes, "; "));
  if (!clean) return absl::InternalError(report);
  return report;
}

std::string ScaleRequestPath(const std::string& work_dir) {
  return work_dir + "/scale.request";
}
std::string ScaleResultPath(const std::string& work_dir) {
  return work_dir + "/scale.result";
}
std::string ScaleLockPath(const std::string& work_dir) {
  return work_dir + "/scale.lock";
}

std::optional<absl::StatusOr<ScaleRequest>> TakeScaleRequest(
    const std::string& work_dir, std::string* id) {
  const std::string path = ScaleRequestPath(work_dir);
  std::optional<std::string> content = ReadWhole(path);
  if (!content.has_value()) return std::nullopt;
  std::remove(path.c_str());
  std::string line = content->substr(0, content->find('\n'));
  const std::vector<std::string> f =
      absl::StrSplit(line, ' ', absl::SkipWhitespace());
  *id = f.size() >= 2 ? f[1] : "";
  return ParseScaleRequest(line);
}

void WriteScaleResult(const std::string& work_dir, const std::string& id,
                      const absl::StatusOr<std::string>& result) {
  WriteWhole(
      ScaleResultPath(work_dir),
      absl::StrCat("result ", id, " ", static_cast<int>(result.status().code()),
                   "\n", result.ok() ? *result : result.status().message(),
                   "\n"));
}

absl::StatusOr<std::string> RequestScale(
    const std::string& work_dir, const ScaleRequest& request,
    absl::Duration timeout, const std::function<bool()>& supervisor_alive,
    std::ostream& waiting) {
  const absl::Time give_up = absl::Now() + timeout;
  const int lock = ::open(ScaleLockPath(work_dir).c_str(),
                          O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open ", ScaleLockPath(work_dir)));
  }
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // Closing releases the flock.
  } unlock{lock};
  bool said = false;
  while (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    if (!said) {
      waiting << "waiting for another pdctl scale to finish" << std::endl;
      said = true;
    }
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          "another pdctl scale is still running");
    }
    absl::SleepFor(kPollEvery);
  }
  // A result left by a scale whose pdctl gave up is nobody's.
  std::remove(ScaleResultPath(work_dir).c_str());
  WriteWhole(ScaleRequestPath(work_dir), FormatScaleRequest(request));
  while (true) {
    if (std::optional<std::string> result =
            ReadWhole(ScaleResultPath(work_dir))) {
      const size_t newline = result->find('\n');
      const std::vector<std::string> f = absl::StrSplit(
          result->substr(0, newline), ' ', absl::SkipWhitespace());
      int code = 0;
      if (f.size() == 3 && f[0] == "result" && f[1] == request.id &&
          absl::SimpleAtoi(f[2], &code)) {
        std::remove(ScaleResultPath(work_dir).c_str());
        std::string message =
            newline == std::string::npos ? "" : result->substr(newline + 1);
        while (!message.empty() && message.back() == '\n') message.pop_back();
        if (code == 0) return message;
        return absl::Status(static_cast<absl::StatusCode>(code), message);
      }
    }
    if (!supervisor_alive()) {
      std::remove(ScaleRequestPath(work_dir).c_str());
      return absl::UnavailableError(
          "the cluster's supervisor exited before answering");
    }
    if (absl::Now() >= give_up) {
      // Not taken yet: withdraw it. Taken: it goes on without us.
      std::remove(ScaleRequestPath(work_dir).c_str());
      return absl::DeadlineExceededError(absl::StrCat(
          "no answer from the cluster's supervisor within ",
          absl::FormatDuration(timeout), "; see its log (pdctl.log)"));
    }
    absl::SleepFor(kPollEvery);
  }
}

}  // namespace pdserve::cli
