#include "worker/prefix_cache_feed.h"

#include <algorithm>

#include "proto/prefix_cache_events.h"

namespace pdserve::worker {

void PrefixCacheFeed::Subscribe(const std::string& router) {
  absl::MutexLock lock(&mutex_);
  queues_.try_emplace(router);
}

void PrefixCacheFeed::Unsubscribe(const std::string& router) {
  absl::MutexLock lock(&mutex_);
  queues_.erase(router);
}

void PrefixCacheFeed::RequestReset(const std::string& router) {
  absl::MutexLock lock(&mutex_);
  auto it = queues_.find(router);
  if (it == queues_.end()) return;
  it->second.reset = true;
  it->second.events.clear();
  ++it->second.generation;
}

void PrefixCacheFeed::PullLocked() {
  std::vector<v1::PrefixCacheEvent> events = source_();
  if (events.empty()) return;
  for (const v1::PrefixCacheEvent& event : events) {
    ApplyPrefixCacheEvent(event, &cached_);
  }
  for (auto& [router, queue] : queues_) {
    // Queued even while a snapshot is due: one already cut but not yet
    // acknowledged does not hold them (one cut later replaces them).
    if (queue.events.size() + events.size() > max_queued_events_) {
      // Unreachable for long: a snapshot is smaller than the backlog.
      queue.reset = true;
      queue.events.clear();
      ++queue.generation;
      continue;
    }
    queue.events.insert(queue.events.end(), events.begin(), events.end());
  }
}

PrefixCacheBatch PrefixCacheFeed::Take(const std::string& router) {
  absl::MutexLock lock(&mutex_);
  PullLocked();
  PrefixCacheBatch batch;
  auto it = queues_.find(router);
  if (it == queues_.end()) return batch;
  Queue& queue = it->second;
  if (queue.reset) {
    // Events pulled after this point queue behind the snapshot.
    queue.events.clear();
    ++queue.generation;
    batch.events_reset = true;
    v1::PrefixCacheEvent& snapshot = batch.events.emplace_back();
    snapshot.set_kind(v1::PrefixCacheEvent::KIND_STORED);
    snapshot.mutable_block_hashes()->Reserve(cached_.size());
    for (uint64_t hash : cached_) snapshot.add_block_hashes(hash);
    std::sort(snapshot.mutable_block_hashes()->begin(),
              snapshot.mutable_block_hashes()->end());
  } else {
    batch.events = queue.events;
  }
  batch.generation = queue.generation;
  return batch;
}

void PrefixCacheFeed::Delivered(const std::string& router,
                                const PrefixCacheBatch& batch) {
  absl::MutexLock lock(&mutex_);
  auto it = queues_.find(router);
  if (it == queues_.end()) return;
  Queue& queue = it->second;
  // Reset (or overflowed) since the batch was cut: its events are no
  // longer at the head of the queue, and a snapshot is due anyway.
  if (queue.generation != batch.generation) return;
  if (batch.events_reset) {
    queue.reset = false;
    return;
  }
  const size_t sent = std::min(batch.events.size(), queue.events.size());
  queue.events.erase(queue.events.begin(), queue.events.begin() + sent);
}

size_t PrefixCacheFeed::cached_blocks() {
  absl::MutexLock lock(&mutex_);
  return cached_.size();
}

}  // namespace pdserve::worker
