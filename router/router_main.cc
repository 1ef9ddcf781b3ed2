// pd-router: the cluster's front door and control plane.
//
// Today it serves membership (workers register and heartbeat, silent workers
// are dropped when their lease ends), the admin API for pdctl, health and
// reflection. The client API (Generate, OpenAI HTTP) joins with the serving
// path.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/termination_signal.h"
#include "router/control_services.h"
#include "router/worker_registry.h"
#include "rpc/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50050",
          "host:port for gRPC (port 0 picks a free port)");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written here once serving");
ABSL_FLAG(int32_t, lease_ms, 3000,
          "a worker silent for this long is removed from the cluster");
ABSL_FLAG(int32_t, heartbeat_ms, 500, "heartbeat interval told to workers");
ABSL_FLAG(int32_t, shutdown_grace_ms, 5000,
          "on SIGTERM, time given to in-flight calls before cancelling them");

namespace pdserve::router {
namespace {

int Run() {
  WorkerRegistryOptions registry_options;
  registry_options.lease_duration =
      absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  registry_options.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  absl::StatusOr<std::unique_ptr<WorkerRegistry>> registry =
      WorkerRegistry::Create(registry_options);
  if (!registry.ok()) {
    PD_LOG(ERROR) << registry.status();
    return 2;
  }
  MembershipService membership(registry->get());
  AdminService admin(registry->get());

  rpc::GrpcServerOptions server_options;
  server_options.listen_address = absl::GetFlag(FLAGS_listen);
  server_options.services = {&membership, &admin};
  absl::StatusOr<std::unique_ptr<rpc::GrpcServer>> server =
      rpc::GrpcServer::Start(server_options);
  if (!server.ok()) {
    PD_LOG(ERROR) << server.status();
    return 1;
  }

  // Drops workers whose lease ran out even when nobody is listing them, so
  // the log shows when a worker was lost.
  absl::Notification stop_sweeper;
  std::thread sweeper([&] {
    while (
        !stop_sweeper.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      for (const std::string& id : (*registry)->ExpireLeases(absl::Now())) {
        PD_LOG(WARNING) << "worker " << id
                        << " missed its lease; removed from the cluster";
      }
    }
  });

  (*server)->SetServing(true);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file);
      !port_file.empty()) {
    std::ofstream(port_file + ".tmp") << (*server)->port() << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  PD_LOG(INFO) << "router serving on " << (*server)->address();

  const int signal = WaitForTerminationSignal().value_or(0);
  PD_LOG(INFO) << "signal " << signal << ": shutting down";
  (*server)->SetServing(false);
  (*server)->Shutdown(
      absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  stop_sweeper.Notify();
  sweeper.join();
  PD_LOG(INFO) << "router stopped";
  return 0;
}

}  // namespace
}  // namespace pdserve::router

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "pd-router: pdserve's front door and control plane.");
  absl::ParseCommandLine(argc, argv);
  pdserve::SetLogTag("router");
  return pdserve::router::Run();
}
