#include "tests/fault_testing.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "common/subprocess.h"
#include "model/tiny_model.h"
#include "tests/cluster_testing.h"

namespace pdserve::testing {

void FaultTest::Start(
    const std::string& name, int prefill, int decode,
    const std::vector<std::string>& worker_args,
    const std::vector<std::string>& router_args,
    const std::map<std::string, std::vector<std::string>>& process_args) {
  cli::LocalClusterOptions cluster;
  cluster.bin_dir = BinDir();
  cluster.work_dir = MakeWorkDir(name);
  cluster.model_path = model_path_.empty() ? SlowTinyModelPath() : model_path_;
  cluster.num_prefill = prefill;
  cluster.num_decode = decode;
  cluster.lease = absl::Milliseconds(1500);
  cluster.heartbeat = absl::Milliseconds(200);
  cluster.startup_timeout = absl::Seconds(60);
  cluster.router_args = {"--routing_policy=round_robin",
                         "--reservation_timeout_ms=20000"};
  cluster.router_args.insert(cluster.router_args.end(), router_args.begin(),
                             router_args.end());
  cluster.worker_args = {"--threads=1", "--kv_cache_mb=64"};
  cluster.worker_args.insert(cluster.worker_args.end(), worker_args.begin(),
                             worker_args.end());
  cluster.process_args = process_args;
  for (int i = 0; i < decode; ++i) {
    cluster.process_args[absl::StrCat("decode-", i)].push_back(
        "--kv_quarantine_ms=500");
  }
  auto started = cli::LocalCluster::Start(cluster);
  ASSERT_TRUE(started.ok()) << started.status();
  cluster_ = std::move(started).value();
}

void FaultTest::TearDown() {
  if (cluster_ == nullptr) return;
  // A stopped process would never exit: let it go on first.
  for (const std::string& name : disturbed_) {
    cli::LocalProcess* p = cluster_->Find(name);
    if (p != nullptr) p->process->Signal(SIGCONT);
  }
  if (!HasFatalFailure()) {
    // No leaked blocks, sequences or transfers anywhere. Blocks of a
    // transfer cut short wait at most the reservation (20 s) plus the
    // quarantine (0.5 s).
    AwaitIdle(absl::Seconds(25));
  }
  (void)cluster_->Stop(absl::Seconds(20));
  // Every process not disturbed on purpose drained and exited 0: none had
  // a thread that would not stop, none was left behind.
  for (cli::LocalProcess& p : cluster_->processes()) {
    if (disturbed_.contains(p.name)) continue;
    const absl::StatusOr<int> status = p.process->Wait(absl::ZeroDuration());
    ASSERT_TRUE(status.ok()) << p.name << " still runs";
    EXPECT_EQ(*status, 0) << p.name << " " << DescribeWaitStatus(*status)
                          << "; log: " << cli::TailOfFile(p.log_path);
  }
  cluster_.reset();
}

std::vector<Outcome> FaultTest::SendAll(
    const std::vector<v1::GenerateRequest>& requests,
    const std::function<void(const std::vector<int>&)>& on_progress) {
  std::vector<Outcome> got(requests.size());
  std::vector<int> received(requests.size(), 0);
  absl::Mutex mu;
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      got[i] = Generate(cluster_->router_address(), requests[i],
                        absl::Seconds(120), [&](const Outcome& so_far) {
                          absl::MutexLock lock(&mu);
                          received[i] = so_far.tokens.size();
                          if (on_progress) on_progress(received);
                        });
    });
  }
  for (std::thread& t : clients) t.join();
  return got;
}

FaultTest::FaultedLoad FaultTest::SendAllWithFault(
    const std::vector<v1::GenerateRequest>& requests, const Progress& ready,
    const std::vector<std::string>& targets, int signal) {
  FaultedLoad load;
  std::atomic<bool> fired{false};
  load.got = SendAll(requests, [&](const std::vector<int>& received) {
    if (!ready(received) || fired.exchange(true)) return;
    load.fault_at = absl::Now();
    for (const std::string& name : targets) Signal(name, signal);
  });
  return load;
}

FaultTest::Progress FaultTest::EveryStreamHas(int tokens) {
  return [tokens](const std::vector<int>& received) {
    return std::all_of(received.begin(), received.end(),
                       [tokens](int n) { return n >= tokens; });
  };
}

FaultTest::Progress FaultTest::StreamsStarted(int streams) {
  return [streams](const std::vector<int>& received) {
    return std::count_if(received.begin(), received.end(),
                         [](int n) { return n > 0; }) >= streams;
  };
}

FaultTest::Progress FaultTest::AnyAnswer() {
  return [](const std::vector<int>&) { return true; };
}

void FaultTest::Signal(const std::string& name, int signal) {
  cli::LocalProcess* p = cluster_->Find(name);
  ASSERT_NE(p, nullptr) << name;
  if (signal == SIGKILL || signal == SIGSTOP) disturbed_.insert(name);
  p->process->Signal(signal);
}

std::map<std::string, v1::WorkerInfo> FaultTest::Workers() {
  std::map<std::string, v1::WorkerInfo> workers;
  auto listed = cli::ListWorkers(cluster_->control_address(),
                                 v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5));
  EXPECT_TRUE(listed.ok()) << listed.status();
  if (!listed.ok()) return workers;
  for (const v1::WorkerInfo& w : listed->workers()) workers[w.worker_id()] = w;
  return workers;
}

double FaultTest::Metric(const std::string& process, const std::string& family,
                         const metrics::Labels& labels) {
  const cli::LocalProcess* p = cluster_->Find(process);
  if (p == nullptr || p->metrics_address.empty()) {
    ADD_FAILURE() << process << " has no metrics address";
    return -1;
  }
  absl::StatusOr<double> value = ScrapeSum(p->metrics_address, family, labels);
  EXPECT_TRUE(value.ok()) << process << ": " << value.status();
  return value.value_or(-1);
}

double FaultTest::AwaitMetric(const std::string& process,
                              const std::string& family,
                              const metrics::Labels& labels, double at_least) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  double value = Metric(process, family, labels);
  while (value >= 0 && value < at_least && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
    value = Metric(process, family, labels);
  }
  return value;
}

absl::Duration FaultTest::AwaitIdle(absl::Duration timeout) {
  // Every worker the cluster started, but those killed or stopped on
  // purpose, must be listed: an empty listing (a router that lost its
  // workers, or whose workers have not registered again) is not idle.
  std::vector<std::string> expected;
  for (const cli::LocalProcess& p : cluster_->processes()) {
    if (p.name != "router" && !disturbed_.contains(p.name)) {
      expected.push_back(p.name);
    }
  }
  return AwaitWorkersIdle(cluster_->control_address(), expected, timeout);
}

absl::Duration AwaitWorkersIdle(const std::string& control_address,
                                const std::vector<std::string>& expected,
                                absl::Duration timeout) {
  const absl::Time start = absl::Now();
  std::string busy;
  while (absl::Now() - start < timeout) {
    busy.clear();
    std::map<std::string, v1::WorkerInfo> workers;
    auto listed = cli::ListWorkers(control_address, v1::WORKER_ROLE_UNSPECIFIED,
                                   absl::Seconds(5));
    if (!listed.ok()) {
      busy = absl::StrCat("no listing: ", listed.status().ToString());
    } else {
      for (const v1::WorkerInfo& w : listed->workers()) {
        workers[w.worker_id()] = w;
      }
    }
    for (const std::string& name : expected) {
      auto it = workers.find(name);
      if (it == workers.end()) {
        absl::StrAppend(&busy, name, " (not listed) ");
      } else if (it->second.state() != v1::WORKER_STATE_SERVING) {
        absl::StrAppend(&busy, name, " (",
                        v1::WorkerState_Name(it->second.state()), ") ");
      }
    }
    for (const auto& [id, w] : workers) {
      const v1::WorkerLoad& load = w.load();
      if (w.inflight_requests() != 0 || load.queued_prefill_tokens() != 0 ||
          load.running_sequences() != 0 || load.reserved_kv_blocks() != 0 ||
          load.inflight_transfers() != 0 ||
          load.free_kv_blocks() != load.total_kv_blocks()) {
        absl::StrAppend(&busy, id, " (", w.load().ShortDebugString(),
                        " inflight ", w.inflight_requests(), ") ");
      }
    }
    if (busy.empty()) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(25));
  }
  ADD_FAILURE() << "not idle after " << timeout << ": " << busy;
  return absl::InfiniteDuration();
}

FaultRow FaultTest::Score(const std::string& fault,
                          const std::vector<v1::GenerateRequest>& requests,
                          const std::vector<Outcome>& got,
                          OfflineEngine& offline,
                          const std::set<absl::StatusCode>& clear_errors) {
  FaultRow row;
  row.fault = fault;
  row.sent = static_cast<int>(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (got[i].status.ok()) {
      const Outcome expected = offline.Run(requests[i]);
      if (IsSameAnswer(got[i], expected)) {
        ++row.completed;
      } else {
        ++row.lost;
        ExpectSameAnswer(got[i], expected, absl::StrCat("request ", i));
      }
    } else if (clear_errors.contains(got[i].status.code()) &&
               !got[i].status.message().empty()) {
      ++row.rejected;
    } else {
      ++row.lost;
      ADD_FAILURE() << "request " << i << " lost: " << got[i].status;
    }
  }
  return row;
}

void FaultTest::Report(const FaultRow& row) {
  EXPECT_EQ(row.lost, 0) << row.fault;
  std::printf("FAULT-TABLE|%s|%d|%d|%d|%d|%.0f|%s\n", row.fault.c_str(),
              row.sent, row.completed, row.rejected, row.lost,
              absl::ToDoubleMilliseconds(row.recovery),
              row.recovery_what.c_str());
  std::fflush(stdout);
}

}  // namespace pdserve::testing
