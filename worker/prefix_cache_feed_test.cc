#include "worker/prefix_cache_feed.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

v1::PrefixCacheEvent Event(v1::PrefixCacheEvent::Kind kind,
                           std::vector<uint64_t> hashes = {}) {
  v1::PrefixCacheEvent e;
  e.set_kind(kind);
  for (uint64_t h : hashes) e.add_block_hashes(h);
  return e;
}
v1::PrefixCacheEvent Stored(std::vector<uint64_t> h) {
  return Event(v1::PrefixCacheEvent::KIND_STORED, std::move(h));
}
v1::PrefixCacheEvent Removed(std::vector<uint64_t> h) {
  return Event(v1::PrefixCacheEvent::KIND_REMOVED, std::move(h));
}

// A router's index of the worker, applying batches the way
// router/worker_registry.cc does.
struct RouterIndex {
  absl::flat_hash_set<uint64_t> keys;
  void Apply(const PrefixCacheBatch& batch) {
    if (batch.events_reset) keys.clear();
    for (const v1::PrefixCacheEvent& e : batch.events) {
      if (e.kind() == v1::PrefixCacheEvent::KIND_STORED) {
        keys.insert(e.block_hashes().begin(), e.block_hashes().end());
      } else if (e.kind() == v1::PrefixCacheEvent::KIND_REMOVED) {
        for (uint64_t k : e.block_hashes()) keys.erase(k);
      } else if (e.kind() == v1::PrefixCacheEvent::KIND_CLEARED) {
        keys.clear();
      }
    }
  }
  std::vector<uint64_t> sorted() const {
    std::vector<uint64_t> v(keys.begin(), keys.end());
    std::sort(v.begin(), v.end());
    return v;
  }
};

// The serving core's TakeEvents: hands out what was pushed, once.
struct FakeCore {
  std::vector<v1::PrefixCacheEvent> pending;
  std::vector<v1::PrefixCacheEvent> Take() {
    std::vector<v1::PrefixCacheEvent> out;
    out.swap(pending);
    return out;
  }
};

class PrefixCacheFeedTest : public ::testing::Test {
 protected:
  FakeCore core_;
  PrefixCacheFeed feed_{[this] { return core_.Take(); }, /*max_queued=*/8};

  // One successful heartbeat to `router`.
  PrefixCacheBatch Deliver(const std::string& router, RouterIndex& index) {
    PrefixCacheBatch batch = feed_.Take(router);
    index.Apply(batch);
    feed_.Delivered(router, batch);
    return batch;
  }
};

TEST_F(PrefixCacheFeedTest, EveryRouterGetsEveryEvent) {
  feed_.Subscribe("a");
  feed_.Subscribe("b");
  RouterIndex a, b;
  EXPECT_TRUE(Deliver("a", a).events_reset);  // first: a snapshot
  EXPECT_TRUE(Deliver("b", b).events_reset);
  core_.pending = {Stored({1, 2, 3})};
  PrefixCacheBatch to_a = Deliver("a", a);
  EXPECT_FALSE(to_a.events_reset);
  EXPECT_EQ(to_a.events.size(), 1u);
  core_.pending = {Removed({2})};
  Deliver("a", a);
  // b's membership thread comes later: it still gets both events.
  PrefixCacheBatch to_b = Deliver("b", b);
  EXPECT_FALSE(to_b.events_reset);
  EXPECT_EQ(to_b.events.size(), 2u);
  EXPECT_THAT(a.sorted(), ElementsAre(1, 3));
  EXPECT_THAT(b.sorted(), ElementsAre(1, 3));
  // Nothing new: empty batches.
  EXPECT_THAT(feed_.Take("a").events, IsEmpty());
  EXPECT_THAT(feed_.Take("b").events, IsEmpty());
}

TEST_F(PrefixCacheFeedTest, FailedHeartbeatResendsItsEvents) {
  feed_.Subscribe("a");
  RouterIndex a;
  Deliver("a", a);
  core_.pending = {Stored({1})};
  PrefixCacheBatch lost = feed_.Take("a");  // heartbeat fails: no Delivered
  EXPECT_EQ(lost.events.size(), 1u);
  core_.pending = {Stored({2})};
  PrefixCacheBatch retry = Deliver("a", a);
  EXPECT_EQ(retry.events.size(), 2u);
  EXPECT_THAT(a.sorted(), ElementsAre(1, 2));
}

TEST_F(PrefixCacheFeedTest, LateRouterGetsASnapshotOfTheWholeCache) {
  feed_.Subscribe("a");
  RouterIndex a;
  core_.pending = {Stored({1, 2, 3}), Removed({1}), Stored({4})};
  Deliver("a", a);
  // A router that appears later (new pod, or DNS re-resolution).
  feed_.Subscribe("late");
  RouterIndex late;
  late.keys = {99};  // whatever it believed before: replaced
  PrefixCacheBatch first = Deliver("late", late);
  EXPECT_TRUE(first.events_reset);
  ASSERT_EQ(first.events.size(), 1u);
  EXPECT_EQ(first.events[0].kind(), v1::PrefixCacheEvent::KIND_STORED);
  EXPECT_THAT(late.sorted(), ElementsAre(2, 3, 4));
  EXPECT_EQ(feed_.cached_blocks(), 3u);
}

TEST_F(PrefixCacheFeedTest, ReRegisteredRouterGetsASnapshot) {
  feed_.Subscribe("a");
  RouterIndex a;
  core_.pending = {Stored({1, 2})};
  Deliver("a", a);
  Deliver("a", a);
  // The router restarted: empty index, new lease.
  a.keys.clear();
  feed_.RequestReset("a");
  PrefixCacheBatch batch = Deliver("a", a);
  EXPECT_TRUE(batch.events_reset);
  EXPECT_THAT(a.sorted(), ElementsAre(1, 2));
}

TEST_F(PrefixCacheFeedTest, EventsDuringAnUnacknowledgedSnapshotAreKept) {
  feed_.Subscribe("a");
  RouterIndex a;
  core_.pending = {Stored({1})};
  PrefixCacheBatch snapshot = feed_.Take("a");
  ASSERT_TRUE(snapshot.events_reset);
  // Another router's thread pulls new events before a's heartbeat returns.
  core_.pending = {Stored({2})};
  feed_.Take("other");
  a.Apply(snapshot);
  feed_.Delivered("a", snapshot);
  Deliver("a", a);
  EXPECT_THAT(a.sorted(), ElementsAre(1, 2));
}

TEST_F(PrefixCacheFeedTest, LostSnapshotIsCutAgain) {
  feed_.Subscribe("a");
  core_.pending = {Stored({1})};
  EXPECT_TRUE(feed_.Take("a").events_reset);  // lost
  core_.pending = {Stored({2})};
  RouterIndex a;
  PrefixCacheBatch again = Deliver("a", a);
  EXPECT_TRUE(again.events_reset);
  EXPECT_THAT(a.sorted(), ElementsAre(1, 2));
}

TEST_F(PrefixCacheFeedTest, OverflowTurnsIntoASnapshot) {
  feed_.Subscribe("a");
  feed_.Subscribe("b");
  RouterIndex a, b;
  Deliver("a", a);
  Deliver("b", b);
  // b is unreachable while more events than its queue holds arrive.
  for (uint64_t i = 0; i < 20; ++i) {
    core_.pending = {Stored({i})};
    Deliver("a", a);
  }
  core_.pending = {Removed({0})};
  PrefixCacheBatch stale = feed_.Take("b");
  // A batch cut before another overflow is not acknowledged by its
  // delivery.
  for (uint64_t i = 100; i < 110; ++i) {
    core_.pending = {Stored({i})};
    feed_.Take("a");
  }
  feed_.Delivered("b", stale);
  PrefixCacheBatch batch = Deliver("b", b);
  EXPECT_TRUE(batch.events_reset);
  Deliver("a", a);
  EXPECT_EQ(a.sorted(), b.sorted());
  EXPECT_EQ(b.keys.size(), 29u);
}

TEST_F(PrefixCacheFeedTest, UnsubscribedRouterGetsNothing) {
  feed_.Subscribe("a");
  feed_.Unsubscribe("a");
  core_.pending = {Stored({1})};
  PrefixCacheBatch batch = feed_.Take("a");
  EXPECT_FALSE(batch.events_reset);
  EXPECT_THAT(batch.events, IsEmpty());
  EXPECT_EQ(feed_.cached_blocks(), 1u);  // pulled all the same
}

}  // namespace
}  // namespace pdserve::worker
