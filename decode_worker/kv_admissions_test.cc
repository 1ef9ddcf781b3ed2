#include "decode_worker/kv_admissions.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::decode_worker {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

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
    admissions_ = *KvAdmissions::Create(options, pool_.get());
  }

  std::unique_ptr<engine::BlockPool> pool_;
  std::unique_ptr<KvAdmissions> admissions_;
};

TEST_F(KvAdmissionsTest, IssuesATargetWithEnoughBlocksForTheTokens) {
  absl::StatusOr<v1::KvTransferTarget> target =
      admissions_->Admit("req-1", 1, 33, kNow);  // 33 tokens -> 3 blocks.
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
  EXPECT_EQ(admissions_->Admit("empty", 1, 0, kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(admissions_->Admit("huge", 1, 161, kNow).status().code(),
            absl::StatusCode::kInvalidArgument);  // 11 blocks > 10.
  ASSERT_TRUE(admissions_->Admit("a", 1, 16 * 8, kNow).ok());
  absl::StatusOr<v1::KvTransferTarget> full =
      admissions_->Admit("b", 1, 16 * 3, kNow);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("2 free"));
  EXPECT_EQ(pool_->num_free(), 2);  // Nothing partially reserved.
}

TEST_F(KvAdmissionsTest, ClaimHandsTheBlocksOverExactlyOnce) {
  auto target = *admissions_->Admit("req-1", 1, 20, kNow);
  absl::StatusOr<std::vector<engine::BlockId>> blocks =
      admissions_->Claim(target.transfer_id());
  ASSERT_TRUE(blocks.ok());
  EXPECT_THAT(*blocks, SizeIs(2));
  EXPECT_EQ(admissions_->Claim(target.transfer_id()).status().code(),
            absl::StatusCode::kNotFound);
  // Claimed blocks belong to the caller now: still allocated, and expiry
  // does not touch them.
  admissions_->Expire(kNow + absl::Hours(1));
  EXPECT_EQ(pool_->num_free(), 8);
}

TEST_F(KvAdmissionsTest, ReleaseFreesAtOnceOnlyWhenNoWriteCanLand) {
  auto quiet = *admissions_->Admit("quiet", 1, 32, kNow);
  auto dirty = *admissions_->Admit("dirty", 1, 32, kNow);
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

TEST_F(KvAdmissionsTest, UncompletedAdmissionsExpireThroughQuarantine) {
  auto target = *admissions_->Admit("slow", 1, 64, kNow);
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
  auto first = *admissions_->Admit("req-1", 1, 16, kNow);
  auto retry = *admissions_->Admit("req-1", 2, 16, kNow);
  EXPECT_EQ(admissions_->ReleaseRequest("req-1", 1, true, kNow), 1);
  EXPECT_FALSE(admissions_->Find(first.transfer_id()).ok());
  EXPECT_TRUE(admissions_->Find(retry.transfer_id()).ok());
  EXPECT_EQ(admissions_->ReleaseRequest("req-1", 0, true, kNow), 1);
  EXPECT_EQ(pool_->num_free(), 10);
}

}  // namespace
}  // namespace pdserve::decode_worker
