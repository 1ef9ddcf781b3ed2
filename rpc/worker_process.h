// The process shell shared by prefill and decode workers: command-line
// flags, the gRPC server (health, reflection, the worker's services),
// membership with the router, and the drain/shutdown sequence:
//
//   start -> NOT_SERVING -> services ready -> SERVING, registered
//   SIGTERM or router DRAIN -> DRAINING (health NOT_SERVING, no new work)
//     -> in-flight work finished or drain deadline passed
//     -> deregister -> server shutdown -> exit 0
//
// Flags (all workers): --listen, --advertise_address, --router, --worker_id,
// --port_file, --drain_timeout_ms. The role-specific services are passed in by
// main().
#ifndef PDSERVE_RPC_WORKER_PROCESS_H_
#define PDSERVE_RPC_WORKER_PROCESS_H_

#include <functional>
#include <vector>

#include "proto/common.pb.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace pdserve::rpc {

struct WorkerProcessOptions {
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  // Services the worker serves next to health and reflection. Not owned.
  std::vector<grpc::Service*> services;
  // Number of requests still being worked on; the drain waits for zero.
  std::function<uint32_t()> inflight_requests = [] { return 0u; };
};

// Parses nothing itself: call absl::ParseCommandLine first. Returns the
// process exit code.
int RunWorkerProcess(const WorkerProcessOptions& options);

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_WORKER_PROCESS_H_
