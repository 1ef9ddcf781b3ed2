#include "prefill_worker/peer_region_cache.h"

#include <vector>

#include "gtest/gtest.h"
#include "kv_transfer/in_process_transport.h"

namespace pdserve::prefill_worker {
namespace {

using kv_transfer::InProcessTransport;

class PeerRegionCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    decode_ = *InProcessTransport::Create();
    prefill_ = *InProcessTransport::Create();
    for (int i = 0; i < 3; ++i) {
      pools_.emplace_back(4096, 0);
      const auto region = *decode_->RegisterRegion(
          pools_.back().data(), pools_.back().size(), v1::MEMORY_KIND_HOST, 0);
      descriptors_.push_back(*decode_->ExportRegion(region));
    }
  }

  // Whether `peer` is still imported in the prefill transport.
  bool Imported(kv_transfer::PeerRegionId peer) {
    return prefill_->PostNotice(peer, "probe", "", absl::InfiniteFuture()).ok();
  }

  std::vector<std::vector<uint8_t>> pools_;
  std::unique_ptr<InProcessTransport> decode_;
  std::unique_ptr<InProcessTransport> prefill_;
  std::vector<v1::MemoryRegionDescriptor> descriptors_;
};

TEST_F(PeerRegionCacheTest, ImportsOnceAndReusesById) {
  PeerRegionCache cache(prefill_.get(), 8);
  auto first = cache.Get(descriptors_[0]);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*cache.Get(descriptors_[0]), *first);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_NE(*cache.Get(descriptors_[1]), *first);
  EXPECT_EQ(cache.size(), 2u);
}

TEST_F(PeerRegionCacheTest, EvictsTheLeastRecentlyUsedAndReleasesIt) {
  PeerRegionCache cache(prefill_.get(), 2);
  const auto a = *cache.Get(descriptors_[0]);
  const auto b = *cache.Get(descriptors_[1]);
  ASSERT_TRUE(cache.Get(descriptors_[0]).ok());  // a is now the newest.
  const auto c = *cache.Get(descriptors_[2]);    // Evicts b.
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(Imported(a));
  EXPECT_FALSE(Imported(b));
  EXPECT_TRUE(Imported(c));
}

TEST_F(PeerRegionCacheTest, InvalidateAndChangedDescriptorsReimport) {
  PeerRegionCache cache(prefill_.get(), 4);
  const auto a = *cache.Get(descriptors_[0]);
  cache.Invalidate(descriptors_[0].region_id());
  EXPECT_FALSE(Imported(a));
  const auto again = *cache.Get(descriptors_[0]);
  EXPECT_NE(again, a);
  // A restarted decode worker may reuse a region id with a new address.
  v1::MemoryRegionDescriptor moved = descriptors_[1];
  moved.set_region_id(descriptors_[0].region_id());
  const auto replaced = *cache.Get(moved);
  EXPECT_NE(replaced, again);
  EXPECT_FALSE(Imported(again));
  EXPECT_EQ(cache.size(), 1u);
}

TEST_F(PeerRegionCacheTest, RefusesDescriptorsWithoutIdAndPassesImportErrors) {
  PeerRegionCache cache(prefill_.get(), 4);
  EXPECT_EQ(cache.Get(v1::MemoryRegionDescriptor()).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::MemoryRegionDescriptor wrong = descriptors_[0];
  wrong.set_transport(v1::TRANSPORT_KIND_UCX);
  EXPECT_EQ(cache.Get(wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace pdserve::prefill_worker
