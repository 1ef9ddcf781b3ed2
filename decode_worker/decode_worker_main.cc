// pd-decode-worker: a decode worker process (or, with --colocated, a worker
// that does both phases: pdserve on one box, and the colocated baseline the
// benchmarks compare disaggregation with).
//
// It loads the model, builds the continuous-batching engine over its KV
// cache, registers the cache with the KV transport (UCX by default), serves
// the DecodeWorker service, and registers with the router as a DECODE (or
// BOTH) worker, heartbeating its load and prefix-cache events. SIGTERM or
// the router's drain command: no new work, in-flight requests finish;
// streams still running at the drain deadline end with UNAVAILABLE so the
// router migrates them; exit 0 (worker/run_worker.h,
// worker/worker_process.h).
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "common/status_macros.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/decode_worker.h"
#include "worker/run_worker.h"
#include "worker/worker_process.h"

ABSL_FLAG(bool, colocated, false,
          "serve whole requests (prefill and decode) as a BOTH worker");
ABSL_FLAG(int32_t, admission_ttl_ms, 120000,
          "how long blocks reserved for a transfer wait for it, at most "
          "(the router asks for the request's remaining time)");
ABSL_FLAG(int32_t, kv_quarantine_ms, 10000,
          "how long blocks of a transfer whose writer may still be writing "
          "stay unused after the transfer's deadline");

namespace pdserve::decode_worker {
namespace {

// Everything that serves in the process: the service goes before the
// worker it calls.
struct DecodeProcess : worker::RoleState {
  std::unique_ptr<DecodeWorker> worker;
  std::unique_ptr<DecodeService> service;
};

v1::WorkerRole Role() {
  return absl::GetFlag(FLAGS_colocated) ? v1::WORKER_ROLE_BOTH
                                        : v1::WORKER_ROLE_DECODE;
}

absl::StatusOr<std::unique_ptr<worker::RoleState>> Build(
    const worker::WorkerBasics& basics, worker::WorkerProcessOptions* process) {
  DecodeWorkerOptions options;
  options.worker_id = basics.worker_id;
  options.engine = basics.engine;
  options.admission_ttl =
      absl::Milliseconds(absl::GetFlag(FLAGS_admission_ttl_ms));
  options.quarantine =
      absl::Milliseconds(absl::GetFlag(FLAGS_kv_quarantine_ms));
  options.transport = basics.transport;
  options.metrics = basics.metrics;
  auto role = std::make_unique<DecodeProcess>();
  PD_ASSIGN_OR_RETURN(role->worker,
                      DecodeWorker::Create(*basics.model, options));
  DecodeWorker* w = role->worker.get();
  role->service = std::make_unique<DecodeService>(w, basics.credential);
  process->services = {role->service.get()};
  process->on_serving = [w](const std::string& address) {
    return w->Start(address);
  };
  worker::ReportFrom(w, process);
  process->max_running_sequences = options.engine.max_running;
  process->max_batch_tokens = options.engine.runner.max_batch_tokens;
  return role;
}

}  // namespace
}  // namespace pdserve::decode_worker

int main(int argc, char** argv) {
  return pdserve::worker::RunWorker(
      argc, argv,
      {.usage = "pd-decode-worker: a pdserve decode (or, --colocated, "
                "whole-request) worker.",
       .role = pdserve::decode_worker::Role,
       .build = pdserve::decode_worker::Build});
}
