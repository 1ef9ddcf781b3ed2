#include "router/testing/fake_client_api.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace pdserve::router {

void FakeClientApi::SetScript(Script script) {
  absl::MutexLock lock(&mu_);
  script_ = std::move(script);
}

void FakeClientApi::SetModels(v1::ListModelsResponse models) {
  absl::MutexLock lock(&mu_);
  models_ = std::move(models);
}

void FakeClientApi::SetReady(absl::Status ready) {
  absl::MutexLock lock(&mu_);
  ready_ = std::move(ready);
}

absl::Status FakeClientApi::Generate(v1::GenerateRequest request,
                                     absl::Time deadline, const ChunkSink& sink,
                                     CancelToken* cancel) {
  Script script;
  {
    absl::MutexLock lock(&mu_);
    requests_.push_back(request);
    deadlines_.push_back(deadline);
    script = script_;
    ++active_;
    max_active_ = std::max(max_active_, active_);
  }
  absl::Status status = Run(script, request.request_id(), sink, cancel);
  absl::MutexLock lock(&mu_);
  --active_;
  ++finished_;
  return status;
}

absl::StatusOr<v1::TokenizeResponse> FakeClientApi::Tokenize(
    const v1::TokenizeRequest& request) {
  absl::MutexLock lock(&mu_);
  tokenize_requests_.push_back(request);
  v1::TokenizeResponse response;
  response.add_token_ids(1);
  response.add_token_ids(15043);
  response.set_context_length(2048);
  return response;
}

absl::StatusOr<v1::ListModelsResponse> FakeClientApi::ListModels() {
  absl::MutexLock lock(&mu_);
  return models_;
}

absl::Status FakeClientApi::CheckReady() {
  absl::MutexLock lock(&mu_);
  return ready_;
}

std::vector<v1::GenerateRequest> FakeClientApi::requests() {
  absl::MutexLock lock(&mu_);
  return requests_;
}

std::vector<absl::Time> FakeClientApi::deadlines() {
  absl::MutexLock lock(&mu_);
  return deadlines_;
}

std::vector<v1::TokenizeRequest> FakeClientApi::tokenize_requests() {
  absl::MutexLock lock(&mu_);
  return tokenize_requests_;
}

int FakeClientApi::max_active() {
  absl::MutexLock lock(&mu_);
  return max_active_;
}

bool FakeClientApi::WaitForSinkRefusal(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&sink_refused_), timeout);
}

bool FakeClientApi::WaitForStarted(int n, absl::Duration timeout) {
  auto started = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(requests_.size()) >= n;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&started), timeout);
}

bool FakeClientApi::WaitForCancel(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&saw_cancel_), timeout);
}

bool FakeClientApi::WaitForFinished(int n, absl::Duration timeout) {
  auto done = [this, n]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= n; };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

absl::Status FakeClientApi::Run(const Script& script,
                                const std::string& request_id,
                                const ChunkSink& sink, CancelToken* cancel) {
  if (script.wait_for_concurrent > 0) {
    auto enough = [this, &script]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return max_active_ >= script.wait_for_concurrent;
    };
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  if (script.stall > absl::ZeroDuration()) {
    if (cancel == nullptr) {
      absl::SleepFor(script.stall);
    } else {
      absl::Notification cancelled;
      const int id = cancel->Register([&cancelled] { cancelled.Notify(); });
      const bool was_cancelled =
          cancelled.WaitForNotificationWithTimeout(script.stall);
      cancel->Unregister(id);  // Before `cancelled` goes out of scope.
      if (was_cancelled) {
        absl::MutexLock lock(&mu_);
        saw_cancel_ = true;
        return absl::CancelledError("cancelled by the front end");
      }
    }
  }
  uint32_t offset = 0;
  auto send = [&](v1::GenerateResponse chunk) {
    chunk.set_request_id(request_id);
    chunk.set_generated_offset(offset);
    offset += chunk.token_ids_size();
    if (sink(chunk)) return true;
    absl::MutexLock lock(&mu_);
    sink_refused_ = true;
    return false;
  };
  for (const v1::GenerateResponse& chunk : script.chunks) {
    if (!send(chunk)) return absl::CancelledError("client gone");
  }
  if (script.endless) {
    absl::Time give_up = absl::Now() + kWait;
    while (absl::Now() < give_up) {
      v1::GenerateResponse chunk;
      chunk.set_text("x");
      chunk.add_token_ids(7);
      if (!send(chunk)) return absl::CancelledError("client gone");
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError("endless script timed out");
  }
  return script.status;
}

}  // namespace pdserve::router
