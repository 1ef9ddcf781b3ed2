#include "rpc/health_service.h"

#include <string>

namespace pdserve::rpc {

using grpc::health::v1::HealthCheckResponse;

// One Watch stream: writes the current status, then every change. At most
// one write is in flight; a change during a write is sent when it finishes
// (intermediate states may be skipped, the latest is always sent).
class HealthService::Watcher final
    : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name)
      : service_(service), name_(std::move(name)) {}

  // Called with the service mutex held.
  void Notify(Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mutex_) {
    if (finishing_) return;
    if (writing_) {
      pending_ = true;
      return;
    }
    if (status == last_sent_) return;
    last_sent_ = status;
    response_.set_status(status);
    writing_ = true;
    StartWrite(&response_);
  }

  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mutex_) {
    if (finishing_) return;
    finishing_ = true;
    Finish(grpc::Status::OK);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&service_->mutex_);
    writing_ = false;
    if (!ok) {
      FinishLocked();
      return;
    }
    if (pending_) {
      pending_ = false;
      Notify(service_->StatusOf(name_));
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&service_->mutex_);
    FinishLocked();
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&service_->mutex_);
      service_->watchers_.erase(this);
    }
    delete this;
  }

 private:
  HealthService* const service_;
  const std::string name_;
  HealthCheckResponse response_;
  bool writing_ = false;
  bool pending_ = false;
  bool finishing_ = false;
  Status last_sent_ = static_cast<Status>(-1);
};

HealthService::~HealthService() { Shutdown(); }

HealthService::Status HealthService::StatusOf(const std::string& service) {
  if (service.empty()) {
    return serving_ ? HealthCheckResponse::SERVING
                    : HealthCheckResponse::NOT_SERVING;
  }
  if (service == kLivenessService) return HealthCheckResponse::SERVING;
  return HealthCheckResponse::SERVICE_UNKNOWN;
}

void HealthService::SetServing(bool serving) {
  absl::MutexLock lock(&mutex_);
  serving_ = serving;
  for (Watcher* watcher : watchers_) watcher->Notify(StatusOf(""));
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mutex_);
  shut_down_ = true;
  for (Watcher* watcher : watchers_) watcher->FinishLocked();
}

grpc::ServerUnaryReactor* HealthService::Check(
    grpc::CallbackServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request,
    HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::MutexLock lock(&mutex_);
  const Status status = StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "unknown service " + request->service()));
  } else {
    response->set_status(status);
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request) {
  auto* watcher = new Watcher(this, request->service());
  absl::MutexLock lock(&mutex_);
  watchers_.insert(watcher);
  if (shut_down_) {
    watcher->FinishLocked();
  } else {
    watcher->Notify(StatusOf(request->service()));
  }
  return watcher;
}

}  // namespace pdserve::rpc
