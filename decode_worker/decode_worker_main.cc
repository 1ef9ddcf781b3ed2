// pd-decode-worker: a decode worker process (or, with --colocated, a worker
// that does both phases: pdserve on one box, and the colocated baseline the
// benchmarks compare disaggregation with).
//
// It loads the model, builds the continuous-batching engine over its KV
// cache, registers the cache with the KV transport (UCX by default), serves
// the DecodeWorker service, and registers with the router as a DECODE (or
// BOTH) worker, heartbeating its load and prefix-cache events. SIGTERM or
// the router's drain command: no new work, in-flight requests finish, exit 0
// (rpc/worker_process.h).
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/log.h"
#include "common/termination_signal.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/decode_worker.h"
#include "engine/engine_flags.h"
#include "kv_transfer/transport_factory.h"
#include "rpc/worker_process.h"

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

int Run() {
  const v1::WorkerRole role = absl::GetFlag(FLAGS_colocated)
                                  ? v1::WORKER_ROLE_BOTH
                                  : v1::WORKER_ROLE_DECODE;
  DecodeWorkerOptions options;
  options.worker_id = rpc::WorkerIdFromFlags(role);
  SetLogTag(options.worker_id);
  options.engine = engine::EngineOptionsFromFlags();
  options.admission_ttl =
      absl::Milliseconds(absl::GetFlag(FLAGS_admission_ttl_ms));
  options.quarantine =
      absl::Milliseconds(absl::GetFlag(FLAGS_kv_quarantine_ms));
  absl::StatusOr<kv_transfer::KvTransportConfig> transport =
      rpc::KvTransportFromFlags(options.worker_id);
  if (!transport.ok()) {
    PD_LOG(ERROR) << transport.status();
    return 2;
  }
  options.transport = *transport;

  absl::StatusOr<std::unique_ptr<model::Model>> model =
      engine::OpenModelFromFlags();
  if (!model.ok()) {
    PD_LOG(ERROR) << model.status();
    return 2;
  }
  absl::StatusOr<std::unique_ptr<DecodeWorker>> worker =
      DecodeWorker::Create(**model, options);
  if (!worker.ok()) {
    PD_LOG(ERROR) << worker.status();
    return 2;
  }
  DecodeWorker* w = worker->get();
  DecodeService service(w);

  rpc::WorkerProcessOptions process;
  process.role = role;
  process.services = {&service};
  process.on_serving = [w](const std::string& address) {
    return w->Start(address);
  };
  rpc::ReportFrom(w, engine::ServedModelName(engine::ModelPathFromFlags()),
                  &process);
  process.max_running_sequences = options.engine.max_running;
  process.max_batch_tokens = options.engine.runner.max_batch_tokens;
  PD_LOG(INFO) << "model " << (*model)->name() << ", KV cache "
               << w->blocks().num_total_blocks() << " blocks of "
               << w->blocks().block_size() << " tokens";
  return rpc::RunWorkerProcess(process);
}

}  // namespace
}  // namespace pdserve::decode_worker

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "pd-decode-worker: a pdserve decode (or, --colocated, whole-request) "
      "worker.");
  absl::ParseCommandLine(argc, argv);
  return pdserve::decode_worker::Run();
}
