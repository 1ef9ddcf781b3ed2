// The DecodeWorker gRPC service (proto/worker.proto): a thin translation to
// DecodeWorker (decode_worker.h). StartDecode streams through
// rpc/stream_writer.h, so the engine thread never waits for the network; a
// client that cancels the stream cancels the request on this worker.
//
// Ownership: borrows the worker. Thread-safety: as the gRPC library calls it.
#ifndef PDSERVE_DECODE_WORKER_DECODE_SERVICE_H_
#define PDSERVE_DECODE_WORKER_DECODE_SERVICE_H_

#include <utility>

#include "decode_worker/decode_worker.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/cluster_credential.h"

namespace pdserve::decode_worker {

class DecodeService final : public v1::DecodeWorker::CallbackService {
 public:
  // Every call must present `credential` (off by default: tests, local
  // development), checked before the request is read.
  explicit DecodeService(
      DecodeWorker* worker,
      rpc::ClusterCredential credential = rpc::ClusterCredential())
      : worker_(worker), credential_(std::move(credential)) {}

  grpc::ServerUnaryReactor* Admit(grpc::CallbackServerContext* context,
                                  const v1::AdmitRequest* request,
                                  v1::AdmitResponse* response) override;
  grpc::ServerUnaryReactor* CompleteTransfer(
      grpc::CallbackServerContext* context,
      const v1::KvTransferComplete* request,
      v1::CompleteTransferResponse* response) override;
  grpc::ServerWriteReactor<v1::DecodeChunk>* StartDecode(
      grpc::CallbackServerContext* context,
      const v1::StartDecodeRequest* request) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;

 private:
  DecodeWorker* const worker_;
  const rpc::ClusterCredential credential_;
};

}  // namespace pdserve::decode_worker

#endif  // PDSERVE_DECODE_WORKER_DECODE_SERVICE_H_
