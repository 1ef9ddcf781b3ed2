#include "worker/run_worker.h"

#include <utility>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/log.h"
#include "common/termination_signal.h"
#include "metrics/metrics_flags.h"
#include "metrics/process_metrics.h"
#include "metrics/registry.h"
#include "model/model_flags.h"
#include "proto/enum_names.h"
#include "rpc/cluster_credential_flags.h"
#include "worker/engine_flags.h"
#include "worker/kv_transport_flags.h"
#include "worker/speculative_flags.h"

namespace pdserve::worker {

int RunWorker(int argc, char** argv, const WorkerMain& main) {
  BlockTerminationSignals();
  absl::SetProgramUsageMessage(main.usage);
  absl::ParseCommandLine(argc, argv);

  WorkerBasics basics;
  basics.role = main.role();
  basics.worker_id = WorkerIdFromFlags(basics.role);
  SetLogTag(basics.worker_id);
  basics.engine = EngineOptionsFromFlags();
  // Outlives the engine, which borrows it.
  std::unique_ptr<model::Model> draft_model;
  if (absl::Status spec =
          SpeculativeOptionsFromFlags(&basics.engine.speculative, &draft_model);
      !spec.ok()) {
    PD_LOG(ERROR) << spec;
    return 2;
  }
  absl::StatusOr<kv_transfer::KvTransportConfig> transport =
      KvTransportFromFlags(basics.worker_id);
  if (!transport.ok()) {
    PD_LOG(ERROR) << transport.status();
    return 2;
  }
  basics.transport = *std::move(transport);
  absl::StatusOr<rpc::ClusterCredential> credential =
      rpc::ClusterCredentialFromFlags();
  if (!credential.ok()) {
    PD_LOG(ERROR) << credential.status();
    return 2;
  }
  basics.credential = *std::move(credential);

  const std::string model_path = model::ModelPathFromFlags();
  absl::StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Open(model_path);
  if (!model.ok()) {
    PD_LOG(ERROR) << model.status();
    return 2;
  }
  basics.model = model->get();

  // Outlives the role, whose serving core records to it.
  metrics::Registry registry;
  if (absl::Status added = metrics::AddProcessMetrics(&registry); !added.ok()) {
    PD_LOG(ERROR) << added;
    return 2;
  }
  WorkerMetricsOptions metrics_options;
  metrics_options.model = model::ServedModelName(model_path);
  metrics_options.role = ShortRoleName(basics.role);
  metrics_options.worker_id = basics.worker_id;
  if (basics.role != v1::WORKER_ROLE_PREFILL) {
    // A prefill worker samples first tokens only: it never speculates.
    metrics_options.speculative_method =
        SpeculativeMethodName(basics.engine.speculative.method);
  }
  if (absl::StatusOr<metrics::LatencyBuckets> buckets =
          metrics::LatencyBucketsFromFlags();
      buckets.ok()) {
    metrics_options.buckets = *std::move(buckets);
  } else {
    PD_LOG(ERROR) << buckets.status();
    return 2;
  }
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> worker_metrics =
      WorkerMetrics::Create(&registry, metrics_options);
  if (!worker_metrics.ok()) {
    PD_LOG(ERROR) << worker_metrics.status();
    return 2;
  }
  basics.metrics = worker_metrics->get();

  WorkerProcessOptions process;
  process.role = basics.role;
  process.metrics = &registry;
  process.credential = basics.credential;
  // Declared after the model: destroyed before it.
  absl::StatusOr<std::unique_ptr<RoleState>> role =
      main.build(basics, &process);
  if (!role.ok()) {
    PD_LOG(ERROR) << role.status();
    return 2;
  }
  process.model.set_id(model::ServedModelName(model_path));
  if (absl::Status added = basics.metrics->AddGauges(process.gauges);
      !added.ok()) {
    PD_LOG(ERROR) << added;
    return 2;
  }
  const v1::WorkerLoad load = process.load ? process.load() : v1::WorkerLoad();
  PD_LOG(INFO) << "model " << (*model)->name() << ", KV cache "
               << load.total_kv_blocks() << " blocks of "
               << process.model.kv_layout().block_size_tokens() << " tokens";
  return RunWorkerProcess(process);
}

}  // namespace pdserve::worker
