#include "kv_transfer/notice_mailbox.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdserve::kv_transfer {

void NoticeMailbox::Deliver(const std::string& key, std::string payload) {
  absl::MutexLock lock(&mutex_);
  notices_[key] = std::move(payload);
  arrival_order_.push_back(key);
  while (notices_.size() > capacity_ && !arrival_order_.empty()) {
    const std::string oldest = std::move(arrival_order_.front());
    arrival_order_.pop_front();
    if (notices_.erase(oldest) > 0) {
      PD_LOG(WARNING) << "notice mailbox full; dropped unclaimed notice "
                      << oldest;
    }
  }
  // Claimed keys linger in arrival_order_; trim them so it stays bounded.
  while (arrival_order_.size() > 2 * capacity_ + 16) {
    arrival_order_.pop_front();
  }
}

absl::StatusOr<std::string> NoticeMailbox::Await(const std::string& key,
                                                 absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  auto arrived = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return notices_.contains(key);
  };
  mutex_.AwaitWithDeadline(absl::Condition(&arrived), deadline);
  auto it = notices_.find(key);
  if (it == notices_.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("no notice for ", key, " before the deadline"));
  }
  std::string payload = std::move(it->second);
  notices_.erase(it);
  return payload;
}

size_t NoticeMailbox::size() {
  absl::MutexLock lock(&mutex_);
  return notices_.size();
}

}  // namespace pdserve::kv_transfer
