// The process shell shared by prefill and decode workers: command-line
// flags, the gRPC server (health, reflection, the worker's services),
// membership with the router, and the drain/shutdown sequence:
//
//   start -> NOT_SERVING -> services ready -> SERVING, registered
//   SIGTERM or router DRAIN -> DRAINING (health NOT_SERVING, no new work)
//     -> in-flight work finished, or the drain deadline passed: then what
//        is still in flight is handed back to the router (hand_back) and
//        the worker waits (at most kHandBackGrace) for it to be gone
//     -> deregister -> server shutdown -> exit 0
//
// A worker never drops a stream because its grace period ended. Handing
// back ends each request the worker still holds with UNAVAILABLE: the
// router retries a prompt not yet answered on another prefill worker, and
// migrates a decode stream (prompt + the tokens already sent re-prefilled
// on another worker, the stream continuing with the next token; see
// router/generation_core.h). So the clients of a worker scaled down or
// rolled (pdctl scale, Kubernetes' terminationGracePeriodSeconds) see at
// most a pause. Set --drain_timeout_ms below the grace period the
// supervisor gives before SIGKILL, leaving it time for the hand-back.
//
// Flags (all workers): --listen, --advertise_address, --router (one
// router, a list, or dns:///NAME:PORT; the worker registers with every one,
// router_membership.h), --router_resolve_interval_ms, --worker_id,
// --port_file, --drain_timeout_ms, --metrics_listen (Prometheus GET
// /metrics over plain HTTP, on by default; its address is registered with
// the router and written to the port file after the gRPC port). The
// role-specific services are passed in by the role (run_worker.h builds the
// rest of a worker process around it).
#ifndef PDSERVE_WORKER_WORKER_PROCESS_H_
#define PDSERVE_WORKER_WORKER_PROCESS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "proto/membership.pb.h"
#include "rpc/cluster_credential.h"
#include "worker/worker_metrics.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace pdserve::metrics {
class Registry;
}  // namespace pdserve::metrics

namespace pdserve::worker {

struct WorkerProcessOptions {
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  // Services the worker serves next to health and reflection. Not owned.
  std::vector<grpc::Service*> services;
  // Number of requests still being worked on; the drain waits for zero.
  std::function<uint32_t()> inflight_requests = [] { return 0u; };
  // Called once the server is bound, before it reports SERVING, with the
  // address peers dial (the advertised one). An error stops the process.
  std::function<absl::Status(const std::string& address)> on_serving;
  // Called when draining begins (SIGTERM or the router's command): the
  // services refuse new work from then on.
  std::function<void()> on_drain;
  // Called once when the drain deadline passes with requests in flight:
  // ends each of them with UNAVAILABLE so that the router retries or
  // migrates it (see above). Returns how many it handed back.
  std::function<uint32_t()> hand_back;
  // What the worker registers with: its model (with its KV layout) and the
  // KV transports it speaks, most preferred first.
  v1::ModelInfo model;
  std::vector<v1::TransportKind> transports;
  uint32_t max_running_sequences = 0;
  uint32_t max_batch_tokens = 0;
  // Sampled before each heartbeat: load, and prefix-cache events since the
  // previous call (for the router's KV-aware routing).
  std::function<v1::WorkerLoad()> load;
  std::function<std::vector<v1::PrefixCacheEvent>()> take_events;
  // Served at --metrics_listen for the life of the process, when set. Not
  // owned.
  const metrics::Registry* metrics = nullptr;
  // What the worker's metrics read at scrape time (worker_metrics.h).
  WorkerGauges gauges;
  // Presented to the router (membership); auth off by default.
  rpc::ClusterCredential credential;
};

// The worker id: --worker_id, or ROLE-HOST-PID when unset.
std::string WorkerIdFromFlags(v1::WorkerRole role);

// Fills what the worker registers and reports from its serving core, which
// provides model_info(), transports(), Load(), TakeEvents(), inflight(),
// BeginDrain(), HandBack() and MetricsGauges() (PrefillWorker,
// DecodeWorker). The model's id stays the core's until the caller sets the
// served model name clients use.
template <typename Worker>
void ReportFrom(Worker* worker, WorkerProcessOptions* process) {
  process->model = worker->model_info();
  process->transports = worker->transports();
  process->on_drain = [worker] { worker->BeginDrain(); };
  process->hand_back = [worker] { return worker->HandBack(); };
  process->inflight_requests = [worker] { return worker->inflight(); };
  process->load = [worker] { return worker->Load(); };
  process->take_events = [worker] { return worker->TakeEvents(); };
  process->gauges = worker->MetricsGauges();
}

// Parses nothing itself: call absl::ParseCommandLine first. Returns the
// process exit code.
int RunWorkerProcess(const WorkerProcessOptions& options);

// After a hand-back, the longest wait for the handed-back requests to end
// (their UNAVAILABLE to reach the router) before the server shuts down.
inline constexpr absl::Duration kHandBackGrace = absl::Seconds(5);

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_WORKER_PROCESS_H_
