// pd-prefill-worker: a prefill worker process.
//
// It loads the model, builds a ModelRunner with a prefix cache, registers
// its KV cache with the KV transport (UCX by default), serves the
// PrefillWorker service, and registers with the router as a PREFILL worker,
// heartbeating its queue and prefix-cache events. SIGTERM or the router's
// drain command: no new work, in-flight prefills finish; prompts still
// queued at the drain deadline are answered UNAVAILABLE so the router
// prefills them elsewhere; exit 0 (worker/run_worker.h,
// worker/worker_process.h).
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "common/status_macros.h"
#include "prefill_worker/prefill_service.h"
#include "prefill_worker/prefill_worker.h"
#include "worker/run_worker.h"
#include "worker/worker_process.h"

ABSL_FLAG(int32_t, max_queued_requests, 256,
          "prefill requests queued or computing before refusing more");

namespace pdserve::prefill_worker {
namespace {

// Everything that serves in the process, destroyed bottom up: the service
// before the worker, the worker before the completer it calls.
struct PrefillProcess : worker::RoleState {
  explicit PrefillProcess(const rpc::ClusterCredential& credential)
      : completer(credential) {}
  GrpcTransferCompleter completer;
  std::unique_ptr<PrefillWorker> worker;
  std::unique_ptr<PrefillService> service;
};

absl::StatusOr<std::unique_ptr<worker::RoleState>> Build(
    const worker::WorkerBasics& basics, worker::WorkerProcessOptions* process) {
  PrefillWorkerOptions options;
  options.worker_id = basics.worker_id;
  options.runner = basics.engine.runner;
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.transport = basics.transport;
  options.metrics = basics.metrics;
  auto role = std::make_unique<PrefillProcess>(basics.credential);
  PD_ASSIGN_OR_RETURN(
      role->worker,
      PrefillWorker::Create(*basics.model, options, &role->completer));
  PrefillWorker* w = role->worker.get();
  role->service = std::make_unique<PrefillService>(w, basics.credential);
  process->services = {role->service.get()};
  process->on_serving = [w](const std::string&) {
    w->Start();
    return absl::OkStatus();
  };
  worker::ReportFrom(w, process);
  process->max_batch_tokens = options.runner.max_batch_tokens;
  return role;
}

}  // namespace
}  // namespace pdserve::prefill_worker

int main(int argc, char** argv) {
  return pdserve::worker::RunWorker(
      argc, argv,
      {.usage = "pd-prefill-worker: a pdserve prefill worker.",
       .role = [] { return pdserve::v1::WORKER_ROLE_PREFILL; },
       .build = pdserve::prefill_worker::Build});
}
