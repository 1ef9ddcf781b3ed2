#include "prefill_worker/prefill_service.h"

#include <utility>

#include "absl/time/clock.h"
#include "rpc/status_conversion.h"
#include "rpc/unary.h"

namespace pdserve::prefill_worker {

grpc::ServerUnaryReactor* PrefillService::Prefill(
    grpc::CallbackServerContext* context, const v1::PrefillRequest* request,
    v1::PrefillResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time deadline =
      context->deadline() == std::chrono::system_clock::time_point::max()
          ? absl::InfiniteFuture()
          : absl::FromChrono(context->deadline());
  absl::Status queued = worker_->Prefill(
      *request, deadline,
      [reactor, response](absl::StatusOr<v1::PrefillResponse> result) {
        if (result.ok()) *response = std::move(result).value();
        reactor->Finish(rpc::ToGrpcStatus(result.status()));
      });
  if (!queued.ok()) reactor->Finish(rpc::ToGrpcStatus(queued));
  return reactor;
}

grpc::ServerUnaryReactor* PrefillService::Cancel(
    grpc::CallbackServerContext* context, const v1::CancelRequest* request,
    v1::CancelResponse* response) {
  return rpc::FinishUnary<v1::CancelResponse>(
      context, worker_->Cancel(*request), response);
}

absl::Status GrpcTransferCompleter::Complete(
    const std::string& notify_address, const v1::KvTransferComplete& notice,
    absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(30))));
  v1::CompleteTransferResponse response;
  return rpc::FromGrpcStatus(
      stubs_.Get(notify_address)
          ->CompleteTransfer(&context, notice, &response));
}

}  // namespace pdserve::prefill_worker
