#include "decode_worker/decode_service.h"

#include <string>
#include <utility>

#include "rpc/control_plane_auth.h"
#include "rpc/status_conversion.h"
#include "rpc/stream_writer.h"
#include "rpc/unary.h"

namespace pdserve::decode_worker {

grpc::ServerUnaryReactor* DecodeService::Admit(
    grpc::CallbackServerContext* context, const v1::AdmitRequest* request,
    v1::AdmitResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  return rpc::FinishUnary(context, worker_->Admit(*request), response);
}

grpc::ServerUnaryReactor* DecodeService::CompleteTransfer(
    grpc::CallbackServerContext* context, const v1::KvTransferComplete* request,
    v1::CompleteTransferResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  return rpc::FinishUnary(context, worker_->CompleteTransfer(*request),
                          response);
}

grpc::ServerWriteReactor<v1::DecodeChunk>* DecodeService::StartDecode(
    grpc::CallbackServerContext* context,
    const v1::StartDecodeRequest* request) {
  auto [reactor, stream] = rpc::MakeServerStream<v1::DecodeChunk>();
  if (grpc::Status refused =
          rpc::RefuseUnlessClusterCaller(*context, credential_);
      !refused.ok()) {
    stream->Finish(std::move(refused));
    return reactor;
  }
  DecodeSink sink;
  sink.on_chunk = [stream = stream](const v1::DecodeChunk& chunk) {
    stream->Push(chunk);
  };
  sink.on_end = [stream = stream](const absl::Status& status) {
    stream->Finish(rpc::ToGrpcStatus(status));
  };
  if (absl::Status started = worker_->StartDecode(*request, std::move(sink));
      !started.ok()) {
    stream->Finish(rpc::ToGrpcStatus(started));
    return reactor;
  }
  stream->OnCancel([worker = worker_, request_id = request->request_id(),
                    attempt = request->attempt()] {
    v1::CancelRequest cancel;
    cancel.set_request_id(request_id);
    cancel.set_attempt(attempt);
    cancel.set_reason(v1::CANCEL_REASON_CLIENT);
    worker->Cancel(cancel);
  });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::Release(
    grpc::CallbackServerContext* context, const v1::ReleaseRequest* request,
    v1::ReleaseResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  return rpc::FinishUnary<v1::ReleaseResponse>(
      context, worker_->Release(*request), response);
}

grpc::ServerUnaryReactor* DecodeService::Cancel(
    grpc::CallbackServerContext* context, const v1::CancelRequest* request,
    v1::CancelResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  return rpc::FinishUnary<v1::CancelResponse>(
      context, worker_->Cancel(*request), response);
}

}  // namespace pdserve::decode_worker
