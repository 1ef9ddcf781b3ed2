// The PrefillWorker gRPC service (proto/worker.proto), a thin translation to
// PrefillWorker (prefill_worker.h); and GrpcTransferCompleter, which
// delivers completion notices with DecodeWorker.CompleteTransfer.
//
// Prefill answers asynchronously: the reactor finishes from the worker's
// thread once the transfer is complete, so no gRPC thread waits.
//
// Ownership: borrows the worker. Thread-safety: as the gRPC library calls
// it; GrpcTransferCompleter is thread-safe.
#ifndef PDSERVE_PREFILL_WORKER_PREFILL_SERVICE_H_
#define PDSERVE_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <string>
#include <utility>

#include "prefill_worker/prefill_worker.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/cluster_credential.h"
#include "rpc/stub_cache.h"

namespace pdserve::prefill_worker {

class PrefillService final : public v1::PrefillWorker::CallbackService {
 public:
  // Every call must present `credential` (off by default: tests, local
  // development), checked before the request is read.
  explicit PrefillService(
      PrefillWorker* worker,
      rpc::ClusterCredential credential = rpc::ClusterCredential())
      : worker_(worker), credential_(std::move(credential)) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;

 private:
  PrefillWorker* const worker_;
  const rpc::ClusterCredential credential_;
};

// Calls DecodeWorker.CompleteTransfer at the notice's address, keeping one
// channel per decode worker.
class GrpcTransferCompleter : public TransferCompleter {
 public:
  // Presents `credential` to the decode workers (off by default).
  explicit GrpcTransferCompleter(
      rpc::ClusterCredential credential = rpc::ClusterCredential())
      : stubs_(std::move(credential)) {}

  absl::Status Complete(const std::string& notify_address,
                        const v1::KvTransferComplete& notice,
                        absl::Time deadline) override;
  void Release(const std::string& notify_address,
               const v1::ReleaseRequest& release) override;

 private:
  rpc::StubCache<v1::DecodeWorker> stubs_;
};

}  // namespace pdserve::prefill_worker

#endif  // PDSERVE_PREFILL_WORKER_PREFILL_SERVICE_H_
