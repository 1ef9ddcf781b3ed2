#include "cli/local_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "common/status_macros.h"
#include "rpc/health_client.h"

namespace pdserve::cli {
namespace {

// Reads the ports a process wrote to `port_file` once it was serving (the
// router writes three on one line, workers one).
absl::StatusOr<std::vector<int>> AwaitPortFile(const std::string& port_file,
                                               LocalProcess& process,
                                               absl::Time give_up) {
  while (absl::Now() < give_up) {
    std::ifstream in(port_file);
    std::vector<int> ports;
    for (int port = 0; in >> port;) ports.push_back(port);
    if (!ports.empty() && ports[0] > 0) return ports;
    if (!process.process->running()) {
      absl::StatusOr<int> status = process.process->Wait(absl::ZeroDuration());
      return absl::UnavailableError(
          absl::StrCat(process.name, " ",
                       status.ok() ? DescribeWaitStatus(*status) : "exited",
                       " during start-up; end of ", process.log_path, ":\n",
                       TailOfFile(process.log_path)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(process.name, " did not start serving in time; end of ",
                   process.log_path, ":\n", TailOfFile(process.log_path)));
}

std::string Ms(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Milliseconds(d));
}

}  // namespace

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string content = buffer.str();
  return content.size() <= max_bytes
             ? content
             : content.substr(content.size() - max_bytes);
}

absl::StatusOr<std::string> FindBinary(const std::string& bin_dir,
                                       const std::string& relative) {
  const std::string nested = absl::StrCat(bin_dir, "/", relative);
  if (::access(nested.c_str(), X_OK) == 0) return nested;
  const size_t slash = relative.rfind('/');
  const std::string flat = absl::StrCat(
      bin_dir, "/",
      slash == std::string::npos ? relative : relative.substr(slash + 1));
  if (::access(flat.c_str(), X_OK) == 0) return flat;
  return absl::NotFoundError(absl::StrCat("no executable ", nested, " or ",
                                          flat,
                                          " (build with bazel build //...)"));
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  if (options.num_prefill < 0 || options.num_decode < 0 ||
      options.num_colocated < 0) {
    return absl::InvalidArgumentError("worker counts must be >= 0");
  }
  PD_ASSIGN_OR_RETURN(const std::string router_bin,
                      FindBinary(options.bin_dir, "router/pd-router"));
  PD_ASSIGN_OR_RETURN(
      const std::string prefill_bin,
      FindBinary(options.bin_dir, "prefill_worker/pd-prefill-worker"));
  PD_ASSIGN_OR_RETURN(
      const std::string decode_bin,
      FindBinary(options.bin_dir, "decode_worker/pd-decode-worker"));

  auto cluster = std::unique_ptr<LocalCluster>(new LocalCluster());
  cluster->options_ = options;
  if (!options.cluster_token_file.empty()) {
    PD_ASSIGN_OR_RETURN(cluster->credential_, rpc::ClusterCredential::FromFile(
                                                  options.cluster_token_file));
  }
  cluster->prefill_bin_ = prefill_bin;
  cluster->decode_bin_ = decode_bin;
  const absl::Time give_up = absl::Now() + options.startup_timeout;

  if (options.num_routers < 1) {
    return absl::InvalidArgumentError("a cluster needs at least one router");
  }
  std::vector<std::string> model_args;
  if (!options.model_path.empty()) {
    model_args.push_back(absl::StrCat("--model=", options.model_path));
  }
  for (int r = 0; r < options.num_routers; ++r) {
    const bool first = r == 0;
    std::vector<std::string> router_args = {
        absl::StrCat("--listen=",
                     first ? options.router_listen : "127.0.0.1:0"),
        absl::StrCat("--http_listen=",
                     first ? options.http_listen : "127.0.0.1:0"),
        absl::StrCat("--control_listen=",
                     first ? options.control_listen : "127.0.0.1:0"),
        absl::StrCat("--lease_ms=", Ms(options.lease)),
        absl::StrCat("--heartbeat_ms=", Ms(options.heartbeat))};
    router_args.insert(router_args.end(), model_args.begin(), model_args.end());
    if (!options.cluster_token_file.empty()) {
      router_args.push_back(
          absl::StrCat("--cluster_token_file=", options.cluster_token_file));
    }
    router_args.insert(router_args.end(), options.router_args.begin(),
                       options.router_args.end());
    const std::string name = first ? "router" : absl::StrCat("router-", r);
    std::vector<int> router_ports;
    PD_ASSIGN_OR_RETURN(
        LocalProcess router,
        cluster->Launch(name, router_bin, router_args, give_up, &router_ports));
    if (router_ports.size() < 3 || router_ports[1] <= 0) {
      return absl::InternalError(absl::StrCat(
          "the port file of ", name, " does not list its control port"));
    }
    LocalRouter endpoints;
    endpoints.name = name;
    endpoints.address = router.address;
    endpoints.control_address = absl::StrCat("127.0.0.1:", router_ports[1]);
    if (router_ports[2] > 0) {
      endpoints.http_url = absl::StrCat("http://127.0.0.1:", router_ports[2]);
    }
    cluster->processes_.push_back(std::move(router));
    cluster->routers_.push_back(std::move(endpoints));
  }

  std::vector<std::string> names;
  for (const auto& [pool, count] :
       {std::pair<std::string, int>{"prefill", options.num_prefill},
        {"decode", options.num_decode},
        {"colocated", options.num_colocated}}) {
    for (int i = 0; i < count; ++i) {
      const std::string name = absl::StrCat(pool, "-", i);
      cluster->last_index_[pool] = i;
      PD_ASSIGN_OR_RETURN(
          LocalProcess worker,
          cluster->Launch(name, pool == "prefill" ? prefill_bin : decode_bin,
                          cluster->WorkerArgs(name, pool), give_up));
      cluster->processes_.push_back(std::move(worker));
      names.push_back(name);
    }
  }

  // Ready when the router lists every worker as SERVING.
  PD_RETURN_IF_ERROR(cluster->AwaitServing(names, give_up));
  return cluster;
}

std::vector<std::string> LocalCluster::WorkerArgs(
    const std::string& name, const std::string& pool) const {
  std::vector<std::string> controls;
  for (const LocalRouter& r : routers_) controls.push_back(r.control_address);
  std::vector<std::string> args = {
      "--listen=127.0.0.1:0",
      absl::StrCat("--router=", absl::StrJoin(controls, ",")),
      absl::StrCat("--worker_id=", name)};
  if (!options_.model_path.empty()) {
    args.push_back(absl::StrCat("--model=", options_.model_path));
  }
  if (pool == "colocated") args.push_back("--colocated");
  if (!options_.cluster_token_file.empty()) {
    args.push_back(
        absl::StrCat("--cluster_token_file=", options_.cluster_token_file));
  }
  args.insert(args.end(), options_.worker_args.begin(),
              options_.worker_args.end());
  if (auto pooled = options_.pool_args.find(pool);
      pooled != options_.pool_args.end()) {
    args.insert(args.end(), pooled->second.begin(), pooled->second.end());
  }
  if (auto own = options_.process_args.find(name);
      own != options_.process_args.end()) {
    args.insert(args.end(), own->second.begin(), own->second.end());
  }
  return args;
}

absl::StatusOr<std::string> LocalCluster::AddWorker(const std::string& pool,
                                                    absl::Duration timeout) {
  if (pool != "prefill" && pool != "decode" && pool != "colocated") {
    return absl::InvalidArgumentError(
        absl::StrCat("no pool '", pool, "' (prefill, decode or colocated)"));
  }
  auto last = last_index_.find(pool);
  const int index = last == last_index_.end() ? 0 : last->second + 1;
  const std::string name = absl::StrCat(pool, "-", index);
  const absl::Time give_up = absl::Now() + timeout;
  last_index_[pool] = index;
  PD_ASSIGN_OR_RETURN(
      LocalProcess worker,
      Launch(name, pool == "prefill" ? prefill_bin_ : decode_bin_,
             WorkerArgs(name, pool), give_up));
  processes_.push_back(std::move(worker));
  PD_RETURN_IF_ERROR(AwaitServing({name}, give_up));
  return name;
}

bool LocalCluster::IsRouter(const std::string& name) const {
  for (const LocalRouter& r : routers_) {
    if (r.name == name) return true;
  }
  return false;
}

std::string LocalCluster::live_control_address() {
  for (const LocalRouter& r : routers_) {
    const LocalProcess* p = Find(r.name);
    if (p != nullptr && p->process->running()) return r.control_address;
  }
  return control_address();
}

absl::Status LocalCluster::Remove(const std::string& name) {
  for (size_t i = routers_.size(); i < processes_.size(); ++i) {
    if (processes_[i].name != name) continue;
    if (processes_[i].process->running()) {
      return absl::FailedPreconditionError(absl::StrCat(name, " still runs"));
    }
    processes_.erase(processes_.begin() + i);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no worker named '", name, "'"));
}

absl::Status LocalCluster::AwaitServing(const std::vector<std::string>& names,
                                        absl::Time give_up,
                                        std::vector<std::string> routers) {
  if (routers.empty()) {
    for (const LocalRouter& r : routers_) {
      const LocalProcess* p = Find(r.name);
      if (p != nullptr && p->process->running()) {
        routers.push_back(r.control_address);
      }
    }
  }
  while (true) {
    size_t least = names.size();
    for (const std::string& control : routers) {
      absl::StatusOr<v1::ListWorkersResponse> listed = ListWorkers(
          control, v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(2), credential_);
      size_t serving = 0;
      if (listed.ok()) {
        for (const v1::WorkerInfo& w : listed->workers()) {
          // At the address of its current process: a restarted worker's
          // old registration may not have expired yet.
          const LocalProcess* p = Find(w.worker_id());
          serving += w.state() == v1::WORKER_STATE_SERVING && p != nullptr &&
                     w.grpc_address() == p->address &&
                     std::find(names.begin(), names.end(), w.worker_id()) !=
                         names.end();
        }
      }
      least = std::min(least, serving);
    }
    if (least == names.size()) return absl::OkStatus();
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("only ", least, " of ", names.size(),
                       " workers registered as SERVING in time; logs in ",
                       options_.work_dir));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status LocalCluster::Restart(const std::string& name,
                                   absl::Duration timeout) {
  LocalProcess* old = Find(name);
  if (old == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no process named '", name, "' to restart"));
  }
  const absl::Time give_up = absl::Now() + timeout;
  // A process just sent SIGKILL is not gone at once: the kernel tears it
  // down (and its sockets, which the new one rebinds) before it can be
  // reaped. Give it up to a second; one that outlives that was not killed.
  if (!old->process->Wait(absl::Seconds(1)).ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is still running"));
  }
  const LocalRouter* router = nullptr;
  for (const LocalRouter& r : routers_) {
    if (r.name == name) router = &r;
  }
  std::vector<std::string> args = old->args;
  if (router != nullptr) {
    // The same addresses (the ones port 0 picked), so that clients and
    // workers find the new router where the old one was.
    for (std::string& arg : args) {
      if (absl::StartsWith(arg, "--listen=")) {
        arg = absl::StrCat("--listen=", old->address);
      } else if (absl::StartsWith(arg, "--control_listen=")) {
        arg = absl::StrCat("--control_listen=", router->control_address);
      } else if (absl::StartsWith(arg, "--http_listen=") &&
                 !router->http_url.empty()) {
        arg = absl::StrCat("--http_listen=",
                           absl::StripPrefix(router->http_url, "http://"));
      }
    }
  }
  PD_ASSIGN_OR_RETURN(LocalProcess fresh,
                      Launch(name, old->binary, args, give_up));
  fresh.args = old->args;
  *old = std::move(fresh);
  if (router == nullptr) return AwaitServing({name}, give_up);
  // Every worker still running registers with the new router.
  std::vector<std::string> workers;
  for (size_t i = routers_.size(); i < processes_.size(); ++i) {
    if (processes_[i].process->running()) {
      workers.push_back(processes_[i].name);
    }
  }
  return AwaitServing(workers, give_up, {router->control_address});
}

absl::StatusOr<LocalProcess> LocalCluster::Launch(const std::string& name,
                                                  const std::string& binary,
                                                  std::vector<std::string> args,
                                                  absl::Time give_up,
                                                  std::vector<int>* ports) {
  LocalProcess local;
  local.name = name;
  local.binary = binary;
  local.args = args;
  local.log_path = absl::StrCat(options_.work_dir, "/", name, ".log");
  const std::string port_file =
      absl::StrCat(options_.work_dir, "/", name, ".port");
  ::unlink(port_file.c_str());
  ::unlink(local.log_path.c_str());
  SubprocessOptions subprocess;
  subprocess.argv = {binary};
  subprocess.argv.insert(subprocess.argv.end(), args.begin(), args.end());
  subprocess.argv.push_back(absl::StrCat("--port_file=", port_file));
  subprocess.log_path = local.log_path;
  if (auto cpus = options_.process_cpus.find(name);
      cpus != options_.process_cpus.end()) {
    subprocess.cpus = cpus->second;
  }
  PD_ASSIGN_OR_RETURN(local.process, Subprocess::Start(subprocess));
  PD_ASSIGN_OR_RETURN(std::vector<int> bound,
                      AwaitPortFile(port_file, local, give_up));
  local.address = absl::StrCat("127.0.0.1:", bound[0]);
  // Workers write their metrics port second, the router its HTTP port
  // third (its control port is second).
  const size_t metrics_port = absl::StartsWith(name, "router") ? 2 : 1;
  if (bound.size() > metrics_port && bound[metrics_port] > 0) {
    local.metrics_address = absl::StrCat("127.0.0.1:", bound[metrics_port]);
  }
  if (ports != nullptr) *ports = std::move(bound);
  PD_RETURN_IF_ERROR(
      rpc::WaitUntilServing(local.address, give_up - absl::Now()));
  return local;
}

LocalProcess* LocalCluster::Find(const std::string& name) {
  for (LocalProcess& p : processes_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

absl::Status LocalCluster::Stop(absl::Duration grace) {
  std::vector<std::string> problems;
  auto stop = [&](LocalProcess& p) {
    if (!p.process->running()) {
      const absl::StatusOr<int> status = p.process->Wait(absl::ZeroDuration());
      if (status.ok() && *status != 0) {
        problems.push_back(
            absl::StrCat(p.name, " had ", DescribeWaitStatus(*status)));
      }
      return;
    }
    const int status = p.process->Stop(grace);
    if (status != 0) {
      problems.push_back(
          absl::StrCat(p.name, " ", DescribeWaitStatus(status), " on SIGTERM"));
    }
  };
  // Workers first, together, so they drain in parallel and can deregister
  // from a router that is still up.
  const size_t first_worker = std::min(routers_.size(), processes_.size());
  for (size_t i = first_worker; i < processes_.size(); ++i) {
    if (processes_[i].process->running())
      processes_[i].process->Signal(SIGTERM);
  }
  for (size_t i = first_worker; i < processes_.size(); ++i) {
    stop(processes_[i]);
  }
  for (size_t i = 0; i < first_worker; ++i) stop(processes_[i]);
  if (!problems.empty()) {
    return absl::InternalError(absl::StrJoin(problems, "; "));
  }
  return absl::OkStatus();
}

LocalCluster::~LocalCluster() {
  // Subprocess destructors SIGKILL whatever is left; workers go first.
  while (!processes_.empty()) processes_.pop_back();
}

}  // namespace pdserve::cli
