// RunWorker: the main() of a worker process, shared by pd-prefill-worker and
// pd-decode-worker so that both start, fail and stop the same way:
//
//   block SIGTERM/SIGINT, parse the command line
//   -> worker id (the log tag), engine options, KV transport, the cluster
//      credential (--cluster_token_file), from flags
//   -> the metrics registry: process metrics, the worker families
//      (worker_metrics.h) with --itl_buckets / --ttft_buckets
//   -> open --model
//   -> the role builds its serving core and gRPC services (WorkerMain.build)
//   -> the process shell serves, registers, drains and stops
//      (worker_process.h)
//
// A failure before serving is logged and the process exits 2; otherwise the
// exit code is the process shell's.
#ifndef PDSERVE_WORKER_RUN_WORKER_H_
#define PDSERVE_WORKER_RUN_WORKER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/llm_engine.h"
#include "kv_transfer/transport_factory.h"
#include "model/model.h"
#include "proto/common.pb.h"
#include "rpc/cluster_credential.h"
#include "worker/worker_metrics.h"
#include "worker/worker_process.h"

namespace pdserve::worker {

// What every role is built from, read from the command line.
struct WorkerBasics {
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  std::string worker_id;
  engine::EngineOptions engine;              // worker/engine_flags.h
  kv_transfer::KvTransportConfig transport;  // worker/kv_transport_flags.h
  // --model, open for the life of the process.
  const model::Model* model = nullptr;
  // Where the serving core records (exported at --metrics_listen).
  WorkerMetrics* metrics = nullptr;
  // --cluster_token_file: demanded of every caller of the role's services,
  // presented to the router and to peers.
  rpc::ClusterCredential credential;
};

// What a role keeps alive while its process serves: its serving core, its
// gRPC services and their helpers, destroyed (in the order the role's
// members give) after the process shell has stopped serving.
class RoleState {
 public:
  virtual ~RoleState() = default;
};

struct WorkerMain {
  // --help's first line.
  std::string usage;
  // The role, once the command line is parsed (e.g. --colocated).
  std::function<v1::WorkerRole()> role;
  // Builds the role from `basics` and fills what the process shell needs of
  // it in `process` (services, on_serving, ReportFrom, limits). The model
  // id clients use is set afterwards (--served_model_name).
  std::function<absl::StatusOr<std::unique_ptr<RoleState>>(
      const WorkerBasics& basics, WorkerProcessOptions* process)>
      build;
};

// Returns the process exit code.
int RunWorker(int argc, char** argv, const WorkerMain& main);

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_RUN_WORKER_H_
