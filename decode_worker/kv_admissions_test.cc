#include "decode_worker/kv_admissions.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::decode_worker {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

// Reserves plain blocks from a BlockPool: one block per 16 tokens, nothing
// cached unless the first token is 7 (then the first block counts as a
// prefix-cache hit).
class PoolReserver : public KvReserver {
 public:
  explicit PoolReserver(engine::BlockPool* pool) : pool_(pool) {}
  absl::StatusOr<Reservation> Reserve(
      absl::Span<const int32_t> tokens) override {
    const int32_t n = static_cast<int32_t>((tokens.size() + 15) / 16);
    absl::StatusOr<std::vector<engine::BlockId>> blocks = pool_->Allocate(n);
    if (!blocks.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room for ", n, " KV blocks (", pool_->num_free(), " free)"));
    }
    Reservation r;
    r.handle = next_++;
    r.blocks = *blocks;
    r.cached_tokens = tokens[0] == 7 && tokens.size() > 16 ? 16 : 0;
    held_[r.handle] = r.blocks;
    return r;
  }
  void Free(int64_t handle) override {
    ASSERT_TRUE(pool_->Release(held_.at(handle)).ok());
    held_.erase(handle);
  }

 private:
  engine::BlockPool* pool_;
  int64_t next_ = 1;
  std::map<int64_t, std::vector<engine::BlockId>> held_;
};

std::vector<int32_t> Tokens(int n, int32_t first = 1) {
  std::vector<int32_t> t(n, 3);
  if (n > 0) t[0] = first;
  return t;
}

class KvAdmissionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = *engine::BlockPool::Create({.num_blocks = 10});
    KvAdmissionsOptions options;
    options.worker_id = "decode-0";
    options.notify_address = "127.0.0.1:7000";
    options.layout.set_layout_version(1);
    options.layout.set_num_layers(2);
    options.layout.set_num_kv_heads(1);
    options.layout.set_head_dim(4);
    options.layout.set_dtype(v1::KV_DTYPE_F16);
    options.layout.set_block_size_tokens(16);
    options.layout.set_num_blocks(10);
    options.region.set_region_id("decode-0#1");
    options.time_to_live = absl::Seconds(30);
    options.quarantine = absl::Seconds(10);
    reserver_ = std::make_unique<PoolReserver>(pool_.get());
    admissions_ = *KvAdmissions::Create(options, reserver_.get());
  }

  std::unique_ptr<engine::BlockPool> pool_;
  std::unique_ptr<PoolReserver> reserver_;
  std::unique_ptr<KvAdmissions> admissions_;
};

TEST_F(KvAdmissionsTest, IssuesATargetWithEnoughBlocksForTheTokens) {
  absl::StatusOr<v1::KvTransferTarget> target = admissions_->Admit(
      "req-1", 1, Tokens(33), kNow);  // 33 tokens -> 3 blocks.
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->transfer_id(), "decode-0/1");
  EXPECT_EQ(target->request_id(), "req-1");
  EXPECT_EQ(target->notify_address(), "127.0.0.1:7000");
  EXPECT_EQ(target->region().region_id(), "decode-0#1");
  EXPECT_EQ(target->layout().num_blocks(), 10u);
  EXPECT_THAT(target->block_ids(), SizeIs(3));
  EXPECT_EQ(target->num_tokens(), 33u);
  EXPECT_EQ(target->expires_in_ms(), 30000u);
  EXPECT_EQ(pool_->num_free(), 7);
  EXPECT_EQ(admissions_->stats().reserved_blocks, 3);
  EXPECT_EQ(admissions_->Find("decode-0/1")->request_id(), "req-1");
}

TEST_F(KvAdmissionsTest, RefusesWhatDoesNotFit) {
  EXPECT_EQ(admissions_->Admit("empty", 1, Tokens(0), kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(admissions_->Admit("huge", 1, Tokens(161), kNow).status().code(),
            absl::StatusCode::kInvalidArgument);  // 11 blocks > 10.
  ASSERT_TRUE(admissions_->Admit("a", 1, Tokens(16 * 8), kNow).ok());
  absl::StatusOr<v1::KvTransferTarget> full =
      admissions_->Admit("b", 1, Tokens(16 * 3), kNow);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("2 free"));
  EXPECT_EQ(pool_->num_free(), 2);  // Nothing partially reserved.
}

TEST_F(KvAdmissionsTest, ClaimHandsTheBlocksOverExactlyOnce) {
  auto target = *admissions_->Admit("req-1", 1, Tokens(20), kNow);
  absl::StatusOr<int64_t> handle = admissions_->Claim(target.transfer_id());
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(*handle, 1);
  EXPECT_EQ(admissions_->Claim(target.transfer_id()).status().code(),
            absl::StatusCode::kNotFound);
  // Claimed blocks belong to the caller now: still allocated, and expiry
  // does not touch them.
  admissions_->Expire(kNow + absl::Hours(1));
  EXPECT_EQ(pool_->num_free(), 8);
}

TEST_F(KvAdmissionsTest, WritesSkipWhatTheDecodeSideHasCached) {
  auto target = *admissions_->Admit("cached", 1, Tokens(40, 7), kNow);
  EXPECT_EQ(target.first_token_position(), 16u);
  EXPECT_EQ(target.num_tokens(), 40u);
  EXPECT_THAT(target.block_ids(), SizeIs(3));
}

TEST_F(KvAdmissionsTest, ReleaseFreesAtOnceOnlyWhenNoWriteCanLand) {
  auto quiet = *admissions_->Admit("quiet", 1, Tokens(32), kNow);
  auto dirty = *admissions_->Admit("dirty", 1, Tokens(32), kNow);
  ASSERT_TRUE(admissions_->Release(quiet.transfer_id(), true, kNow).ok());
  EXPECT_EQ(pool_->num_free(), 8);
  ASSERT_TRUE(admissions_->Release(dirty.transfer_id(), false, kNow).ok());
  EXPECT_EQ(pool_->num_free(), 8);  // Quarantined, not free.
  EXPECT_EQ(admissions_->stats().quarantined_blocks, 2);
  // A writer may run until the admission's time to live (30 s) ends; the
  // blocks come back a quarantine (10 s) after that.
  admissions_->Expire(kNow + absl::Seconds(39));
  EXPECT_EQ(pool_->num_free(), 8);
  admissions_->Expire(kNow + absl::Seconds(40));
  EXPECT_EQ(pool_->num_free(), 10);
  EXPECT_EQ(admissions_->Release(dirty.transfer_id(), true, kNow).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(KvAdmissionsTest, WriterSayingItsWritesAreOverEndsTheQuarantine) {
  auto target = *admissions_->Admit("failed", 1, Tokens(32), kNow);
  // The router cannot know whether a write may still land...
  ASSERT_TRUE(admissions_->Release(target.transfer_id(), false, kNow).ok());
  EXPECT_EQ(admissions_->stats().quarantined_blocks, 2);
  // ...the writer can, once all its writes have finished.
  ASSERT_TRUE(admissions_->Release(target.transfer_id(), true, kNow).ok());
  EXPECT_EQ(admissions_->stats().quarantined_blocks, 0);
  EXPECT_EQ(pool_->num_free(), 10);
  EXPECT_EQ(admissions_->Release(target.transfer_id(), true, kNow).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(KvAdmissionsTest, AnAdmissionLivesAsLongAsItsRequestAsks) {
  // Asked for 5 s (the request's deadline), granted 5 s; asking for more
  // than the worker's maximum (30 s) gets the maximum.
  auto short_lived =
      *admissions_->Admit("short", 1, Tokens(16), kNow, absl::Seconds(5));
  EXPECT_EQ(short_lived.expires_in_ms(), 5000u);
  auto capped =
      *admissions_->Admit("capped", 1, Tokens(16), kNow, absl::Hours(1));
  EXPECT_EQ(capped.expires_in_ms(), 30000u);
  EXPECT_EQ(admissions_->Expire(kNow + absl::Seconds(5)),
            std::vector<std::string>{short_lived.transfer_id()});
  EXPECT_EQ(admissions_->stats().expired, 1u);
  // Quarantined until its own end plus the quarantine (10 s).
  admissions_->Expire(kNow + absl::Seconds(15));
  EXPECT_EQ(admissions_->stats().quarantined_blocks, 0);
  EXPECT_EQ(pool_->num_free(), 9);
}

TEST_F(KvAdmissionsTest, UncompletedAdmissionsExpireThroughQuarantine) {
  auto target = *admissions_->Admit("slow", 1, Tokens(64), kNow);
  EXPECT_TRUE(admissions_->Expire(kNow + absl::Seconds(29)).empty());
  EXPECT_EQ(admissions_->Expire(kNow + absl::Seconds(30)),
            std::vector<std::string>{target.transfer_id()});
  EXPECT_EQ(admissions_->Find(target.transfer_id()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pool_->num_free(), 6);  // Quarantined: a write may still land.
  admissions_->Expire(kNow + absl::Seconds(40));
  EXPECT_EQ(pool_->num_free(), 10);
  EXPECT_EQ(admissions_->stats().quarantined_blocks, 0);
}

TEST_F(KvAdmissionsTest, CancelOfOneAttemptLeavesTheRetryAlone) {
  auto first = *admissions_->Admit("req-1", 1, Tokens(16), kNow);
  auto retry = *admissions_->Admit("req-1", 2, Tokens(16), kNow);
  EXPECT_EQ(admissions_->ReleaseRequest("req-1", 1, true, kNow), 1);
  EXPECT_FALSE(admissions_->Find(first.transfer_id()).ok());
  EXPECT_TRUE(admissions_->Find(retry.transfer_id()).ok());
  EXPECT_EQ(admissions_->ReleaseRequest("req-1", 0, true, kNow), 1);
  EXPECT_EQ(pool_->num_free(), 10);
}

}  // namespace
}  // namespace pdserve::decode_worker
