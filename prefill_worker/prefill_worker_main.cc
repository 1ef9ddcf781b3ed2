// pd-prefill-worker: a prefill worker process.
//
// It loads the model, builds a ModelRunner with a prefix cache, registers
// its KV cache with the KV transport (UCX by default), serves the
// PrefillWorker service, and registers with the router as a PREFILL worker,
// heartbeating its queue and prefix-cache events. SIGTERM or the router's
// drain command: no new work, in-flight prefills finish, exit 0
// (rpc/worker_process.h).
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/log.h"
#include "common/termination_signal.h"
#include "engine/engine_flags.h"
#include "kv_transfer/transport_factory.h"
#include "prefill_worker/prefill_service.h"
#include "prefill_worker/prefill_worker.h"
#include "rpc/worker_process.h"

ABSL_FLAG(int32_t, max_queued_requests, 256,
          "prefill requests queued or computing before refusing more");

namespace pdserve::prefill_worker {
namespace {

int Run() {
  PrefillWorkerOptions options;
  options.worker_id = rpc::WorkerIdFromFlags(v1::WORKER_ROLE_PREFILL);
  SetLogTag(options.worker_id);
  options.runner = engine::EngineOptionsFromFlags().runner;
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
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
  GrpcTransferCompleter completer;
  absl::StatusOr<std::unique_ptr<PrefillWorker>> worker =
      PrefillWorker::Create(**model, options, &completer);
  if (!worker.ok()) {
    PD_LOG(ERROR) << worker.status();
    return 2;
  }
  PrefillWorker* w = worker->get();
  PrefillService service(w);

  rpc::WorkerProcessOptions process;
  process.role = v1::WORKER_ROLE_PREFILL;
  process.services = {&service};
  process.on_serving = [w](const std::string&) {
    w->Start();
    return absl::OkStatus();
  };
  rpc::ReportFrom(w, engine::ServedModelName(engine::ModelPathFromFlags()),
                  &process);
  process.max_batch_tokens = options.runner.max_batch_tokens;
  PD_LOG(INFO) << "model " << (*model)->name() << ", KV cache "
               << w->blocks().num_total_blocks() << " blocks of "
               << w->blocks().block_size() << " tokens";
  return rpc::RunWorkerProcess(process);
}

}  // namespace
}  // namespace pdserve::prefill_worker

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage("pd-prefill-worker: a pdserve prefill worker.");
  absl::ParseCommandLine(argc, argv);
  return pdserve::prefill_worker::Run();
}
