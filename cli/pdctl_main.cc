// pdctl: the operator CLI.
//
//   pdctl up      [--prefill=N --decode=N --router_listen=H:P]
//                 runs a local cluster in the foreground until Ctrl-C
//   pdctl status  [--router=H:P]      pools and workers as the router sees them
//   pdctl drain   WORKER_ID [--router=H:P --deadline_ms=N]
//   pdctl health  ADDRESS [--service=NAME --wait_ms=N]
//
// Exit codes: 0 success, 1 the operation failed, 2 bad usage.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cli/admin_client.h"
#include "cli/local_cluster.h"
#include "common/termination_signal.h"
#include "rpc/health_client.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50050", "router address");
ABSL_FLAG(int32_t, prefill, 1, "up: number of prefill workers");
ABSL_FLAG(int32_t, decode, 1, "up: number of decode workers");
ABSL_FLAG(std::string, router_listen, "127.0.0.1:50050",
          "up: router listen address");
ABSL_FLAG(std::string, bin_dir, "",
          "up: where the server binaries are (default: next to pdctl)");
ABSL_FLAG(std::string, work_dir, "",
          "up: logs and port files (default: $PDSERVE_HOME/local-cluster)");
ABSL_FLAG(std::string, ready_file, "",
          "up: written with the router address once the cluster is ready");
ABSL_FLAG(int32_t, deadline_ms, 60000,
          "drain: time allowed for in-flight work");
ABSL_FLAG(std::string, service, "", "health: service name ('' = server)");
ABSL_FLAG(int32_t, wait_ms, 0,
          "health: keep polling up to this long for SERVING");

namespace pdserve::cli {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);

std::string ExecutableDir() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  std::string exe(path, n);
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "." : exe.substr(0, slash);
}

std::string DefaultWorkDir() {
  const char* home = std::getenv("PDSERVE_HOME");
  if (home != nullptr) return absl::StrCat(home, "/local-cluster");
  const char* user_home = std::getenv("HOME");
  return absl::StrCat(user_home ? user_home : "/tmp",
                      "/.cache/pdserve/local-cluster");
}

int Fail(const absl::Status& status) {
  std::cerr << "pdctl: " << status << "\n";
  return 1;
}

int Status() {
  const std::string router = absl::GetFlag(FLAGS_router);
  absl::StatusOr<v1::ListPoolsResponse> pools = ListPools(router, kRpcTimeout);
  if (!pools.ok()) return Fail(pools.status());
  absl::StatusOr<v1::ListWorkersResponse> workers =
      ListWorkers(router, v1::WORKER_ROLE_UNSPECIFIED, kRpcTimeout);
  if (!workers.ok()) return Fail(workers.status());
  std::cout << "router " << router << "\n" << FormatStatus(*pools, *workers);
  return 0;
}

int Drain(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: pdctl drain WORKER_ID\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_deadline_ms) <= 0) {
    std::cerr << "pdctl: --deadline_ms must be positive\n";
    return 2;
  }
  absl::StatusOr<v1::DrainWorkerResponse> drained = DrainWorker(
      absl::GetFlag(FLAGS_router), args[2],
      absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms)), kRpcTimeout);
  if (!drained.ok()) return Fail(drained.status());
  std::cout << "draining " << args[2] << " (" << drained->inflight_requests()
            << " requests in flight)\n";
  return 0;
}

int Health(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: pdctl health ADDRESS\n";
    return 2;
  }
  const std::string address = args[2];
  if (const int wait_ms = absl::GetFlag(FLAGS_wait_ms); wait_ms > 0) {
    const absl::Status ready =
        rpc::WaitUntilServing(address, absl::Milliseconds(wait_ms));
    if (!ready.ok()) return Fail(ready);
  }
  absl::StatusOr<rpc::HealthStatus> health =
      rpc::CheckHealth(address, absl::GetFlag(FLAGS_service), kRpcTimeout);
  if (!health.ok()) return Fail(health.status());
  std::cout << rpc::HealthStatusName(*health) << "\n";
  return *health == rpc::HealthStatus::kServing ? 0 : 1;
}

int Up() {
  LocalClusterOptions options;
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                        ? absl::StrCat(ExecutableDir(), "/..")
                        : absl::GetFlag(FLAGS_bin_dir);
  options.num_prefill = absl::GetFlag(FLAGS_prefill);
  options.num_decode = absl::GetFlag(FLAGS_decode);
  options.router_listen = absl::GetFlag(FLAGS_router_listen);
  options.work_dir = absl::GetFlag(FLAGS_work_dir).empty()
                         ? DefaultWorkDir()
                         : absl::GetFlag(FLAGS_work_dir);
  std::error_code error;
  std::filesystem::create_directories(options.work_dir, error);
  if (error) {
    return Fail(absl::InternalError(absl::StrCat(
        "cannot create ", options.work_dir, ": ", error.message())));
  }
  std::cout << "starting router, " << options.num_prefill << " prefill and "
            << options.num_decode << " decode workers (logs in "
            << options.work_dir << ")" << std::endl;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  if (!cluster.ok()) return Fail(cluster.status());
  for (const LocalProcess& p : (*cluster)->processes()) {
    std::cout << "  " << p.name << " serving on " << p.address << " (pid "
              << p.process->pid() << ")" << std::endl;
  }
  if (const std::string ready = absl::GetFlag(FLAGS_ready_file);
      !ready.empty()) {
    FILE* f = std::fopen(ready.c_str(), "w");
    if (f != nullptr) {
      std::fprintf(f, "%s\n", (*cluster)->router_address().c_str());
      std::fclose(f);
    }
  }
  std::cout << "cluster ready; router at " << (*cluster)->router_address()
            << ". Ctrl-C stops it." << std::endl;
  // Watch for a signal, and for processes ending on their own: a worker
  // that exits 0 was drained (pdctl drain) and has left the cluster; any
  // other exit is a failure that stops the cluster.
  absl::flat_hash_set<std::string> departed;
  while (!WaitForTerminationSignal(absl::Milliseconds(200)).has_value()) {
    for (LocalProcess& p : (*cluster)->processes()) {
      if (departed.contains(p.name) || p.process->running()) continue;
      const absl::StatusOr<int> status = p.process->Wait(absl::ZeroDuration());
      if (status.ok() && *status == 0 && p.name != "router") {
        std::cout << p.name << " drained and left the cluster" << std::endl;
        departed.insert(p.name);
        continue;
      }
      std::cerr << "pdctl: " << p.name << " "
                << (status.ok() ? DescribeWaitStatus(*status) : "exited")
                << " unexpectedly; end of " << p.log_path << ":\n"
                << TailOfFile(p.log_path) << std::endl;
      (void)(*cluster)->Stop(absl::Seconds(10));
      return 1;
    }
  }
  std::cout << "stopping the cluster" << std::endl;
  const absl::Status stopped = (*cluster)->Stop(absl::Seconds(30));
  if (!stopped.ok()) return Fail(stopped);
  std::cout << "cluster stopped" << std::endl;
  return 0;
}

}  // namespace
}  // namespace pdserve::cli

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "pdctl COMMAND [flags]\n"
      "  up                 run a local cluster until Ctrl-C\n"
      "  status             pools and workers\n"
      "  drain WORKER_ID    stop sending work to a worker and let it exit\n"
      "  health ADDRESS     grpc.health.v1 check (exit 0 when SERVING)");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::cerr << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string command = args[1];
  if (command == "up") return pdserve::cli::Up();
  if (command == "status") return pdserve::cli::Status();
  if (command == "drain") return pdserve::cli::Drain(args);
  if (command == "health") return pdserve::cli::Health(args);
  std::cerr << "pdctl: unknown command '" << command << "'\n"
            << absl::ProgramUsageMessage() << "\n";
  return 2;
}
