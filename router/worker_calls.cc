#include "router/worker_calls.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdserve::router {

void SetDeadline(grpc::ClientContext* context, absl::Time deadline) {
  if (deadline != absl::InfiniteFuture()) {
    context->set_deadline(absl::ToChronoTime(deadline));
  }
}

absl::Status WorkerError(absl::string_view what, const absl::Status& status,
                         absl::Time deadline) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      if (absl::Now() < deadline) break;
      [[fallthrough]];
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kCancelled:
      return absl::Status(status.code(),
                          absl::StrCat(what, ": ", status.message()));
    default:
      break;
  }
  return absl::UnavailableError(
      absl::StrCat(what, " failed (", absl::StatusCodeToString(status.code()),
                   "): ", status.message()));
}

CancelScope::CancelScope(CancelToken* token, grpc::ClientContext* context)
    : token_(token) {
  if (token_ != nullptr) {
    id_ = token_->Register([context] { context->TryCancel(); });
  }
}

CancelScope::~CancelScope() {
  if (token_ != nullptr) token_->Unregister(id_);
}

WorkerCalls::Call::Call(WorkerCalls* calls, const std::string& worker_id,
                        grpc::ClientContext* context)
    : calls_(calls), worker_id_(worker_id), context_(context) {
  absl::MutexLock lock(&calls_->mu_);
  calls_->calls_[worker_id_].insert(this);
}

WorkerCalls::Call::~Call() {
  absl::MutexLock lock(&calls_->mu_);
  auto it = calls_->calls_.find(worker_id_);
  it->second.erase(this);
  if (it->second.empty()) calls_->calls_.erase(it);
}

void WorkerCalls::Call::Cut() {
  lost_ = true;
  context_->TryCancel();
}

absl::Status WorkerCalls::Call::Check(absl::Status status) const {
  if (!lost_ || status.ok()) return status;
  return absl::UnavailableError(absl::StrCat(
      "worker ", worker_id_, " stopped answering (its lease ran out)"));
}

void WorkerCalls::Cut(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(worker_id);
  if (it == calls_.end()) return;
  PD_LOG(WARNING) << "cutting " << it->second.size() << " call(s) to lost "
                  << "worker " << worker_id;
  for (Call* call : it->second) call->Cut();
}

}  // namespace pdserve::router
