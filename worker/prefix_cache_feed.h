// PrefixCacheFeed: a worker's prefix-cache events, delivered to every
// router it registers with.
//
// The serving core hands out each event once (TakeEvents); with several
// routers, each must see every event, and a router that joins late or
// restarted must learn what the cache holds already. The feed pulls the
// core's events, keeps a mirror of the cached block hashes (the engine's
// event stream is a consistent view, engine/kv_block_manager.h), and keeps
// one queue per router:
//
//   - events wait in a router's queue until a heartbeat carrying them
//     succeeds (Delivered), so a lost heartbeat loses nothing;
//   - a router that (re)registers, or whose queue overflows while it is
//     unreachable, gets a full snapshot instead: one STORED event with every
//     cached block, sent with events_reset = true, on which the router
//     replaces its index of this worker (router/worker_registry.h). A
//     restarted router's index is then right, not merely a guess.
//
// Ownership: owns its state; `source` must stay valid while the feed is in
// use. Thread-safety: every method may be called from any thread (each
// router's membership thread calls Take and Delivered for its own router).
#ifndef PDSERVE_WORKER_PREFIX_CACHE_FEED_H_
#define PDSERVE_WORKER_PREFIX_CACHE_FEED_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "proto/membership.pb.h"

namespace pdserve::worker {

// What one heartbeat to one router carries.
struct PrefixCacheBatch {
  // The router must drop its index of this worker before applying events
  // (which then start with the snapshot).
  bool events_reset = false;
  std::vector<v1::PrefixCacheEvent> events;
  // Which state of the router's queue the batch was cut from (Delivered
  // ignores a batch from before a reset).
  uint64_t generation = 0;
};

class PrefixCacheFeed {
 public:
  // The serving core's TakeEvents: events since its previous call.
  using Source = std::function<std::vector<v1::PrefixCacheEvent>()>;

  explicit PrefixCacheFeed(Source source, size_t max_queued_events = 1 << 16)
      : source_(std::move(source)), max_queued_events_(max_queued_events) {}

  // Starts a queue for `router`; its first batch is a snapshot.
  void Subscribe(const std::string& router);
  void Unsubscribe(const std::string& router);
  // The router holds a new lease (it knows nothing of this worker): its
  // next batch is a snapshot.
  void RequestReset(const std::string& router);

  // Pulls the core's new events into every queue, then returns what
  // `router` has not yet acknowledged (empty for an unknown router).
  PrefixCacheBatch Take(const std::string& router);
  // A heartbeat carrying `batch` succeeded: those events are dropped from
  // the router's queue.
  void Delivered(const std::string& router, const PrefixCacheBatch& batch);

  // Blocks the worker's prefix cache holds, as the events tell.
  size_t cached_blocks();

 private:
  struct Queue {
    bool reset = true;
    uint64_t generation = 0;
    std::vector<v1::PrefixCacheEvent> events;
  };
  void PullLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Source source_;
  const size_t max_queued_events_;
  absl::Mutex mutex_;
  absl::flat_hash_set<uint64_t> cached_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, Queue> queues_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_PREFIX_CACHE_FEED_H_
