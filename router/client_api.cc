#include "router/client_api.h"

#include <utility>

namespace pdserve::router {

void CancelToken::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  // Held while the callbacks run, so Unregister waits for a running one.
  for (auto& [id, fn] : callbacks_) fn();
  callbacks_.clear();
}

bool CancelToken::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

int CancelToken::Register(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) {
    fn();
    return 0;
  }
  const int id = next_id_++;
  callbacks_[id] = std::move(fn);
  return id;
}

void CancelToken::Unregister(int id) {
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
}

}  // namespace pdserve::router
