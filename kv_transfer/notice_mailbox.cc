#include "kv_transfer/notice_mailbox.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdserve::kv_transfer {

void NoticeMailbox::Deliver(const std::string& key, std::string payload) {
  absl::MutexLock lock(&mutex_);
  const uint64_t seq = next_seq_++;
  notices_[key] = Notice{std::move(payload), seq};
  arrival_order_.emplace_back(key, seq);
  auto live = [this](const std::pair<std::string, uint64_t>& entry)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
                    auto it = notices_.find(entry.first);
                    return it != notices_.end() &&
                           it->second.seq == entry.second;
                  };
  // Drop the oldest unclaimed notices beyond capacity.
  while (notices_.size() > capacity_ && !arrival_order_.empty()) {
    const auto oldest = std::move(arrival_order_.front());
    arrival_order_.pop_front();
    if (live(oldest)) {
      notices_.erase(oldest.first);
      PD_LOG(WARNING) << "notice mailbox full; dropped unclaimed notice "
                      << oldest.first;
    }
  }
  // Entries of claimed notices pile up behind an old unclaimed one: compact
  // now and then so the queue stays proportional to what is stored.
  if (arrival_order_.size() > 2 * capacity_ + 16) {
    std::deque<std::pair<std::string, uint64_t>> compacted;
    for (auto& entry : arrival_order_) {
      if (live(entry)) compacted.push_back(std::move(entry));
    }
    arrival_order_ = std::move(compacted);
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
  std::string payload = std::move(it->second.payload);
  notices_.erase(it);
  return payload;
}

size_t NoticeMailbox::size() {
  absl::MutexLock lock(&mutex_);
  return notices_.size();
}

}  // namespace pdserve::kv_transfer
