#include "prefill_worker/prefill_service.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/log.h"
#include "rpc/control_plane_auth.h"
#include "rpc/status_conversion.h"
#include "rpc/unary.h"

namespace pdserve::prefill_worker {

namespace {

// A Prefill call whose caller may go away (a router that died or gave up):
// its prompt is then dropped from the queue or the batch, and the decode
// worker's blocks are given back, instead of being computed for nobody.
class PrefillReactor final : public grpc::ServerUnaryReactor {
 public:
  PrefillReactor(PrefillWorker* worker, const v1::PrefillRequest& request)
      : worker_(worker) {
    cancel_.set_request_id(request.request_id());
    cancel_.set_attempt(request.attempt());
    cancel_.set_reason(v1::CANCEL_REASON_CLIENT);
    cancel_.set_detail("the Prefill call was cancelled");
  }
  void OnCancel() override { worker_->Cancel(cancel_); }
  void OnDone() override { delete this; }

 private:
  PrefillWorker* const worker_;
  v1::CancelRequest cancel_;
};

}  // namespace

grpc::ServerUnaryReactor* PrefillService::Prefill(
    grpc::CallbackServerContext* context, const v1::PrefillRequest* request,
    v1::PrefillResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  auto* reactor = new PrefillReactor(worker_, *request);
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
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
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

void GrpcTransferCompleter::Release(const std::string& notify_address,
                                    const v1::ReleaseRequest& release) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::ReleaseResponse ignored;
  const grpc::Status status =
      stubs_.Get(notify_address)->Release(&context, release, &ignored);
  if (!status.ok()) {
    PD_LOG(WARNING) << "could not give transfer " << release.transfer_id()
                    << " of request " << release.request_id() << " back to "
                    << notify_address << ": " << status.error_message();
  }
}

}  // namespace pdserve::prefill_worker
