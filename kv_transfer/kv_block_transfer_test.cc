// One request's KV moved layer by layer and verified, over each backend,
// with and without injected faults.
#include "kv_transfer/kv_block_transfer.h"

#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_transfer/fault_injecting_transport.h"
#include "kv_transfer/in_process_transport.h"
#include "kv_transfer/ucx_transport.h"

namespace pdserve::kv_transfer {

using ::pdserve::kv_layout::KvGeometry;
using ::pdserve::kv_layout::KvHalf;

namespace {

using ::testing::HasSubstr;

// A small model: 4 layers, 2 KV heads of 8, f16, 4-token blocks.
v1::KvLayout Layout(uint32_t num_blocks) {
  v1::KvLayout layout;
  layout.set_layout_version(1);
  layout.set_model_fingerprint("tiny");
  layout.set_num_layers(4);
  layout.set_num_kv_heads(2);
  layout.set_head_dim(8);
  layout.set_dtype(v1::KV_DTYPE_F16);
  layout.set_block_size_tokens(4);
  layout.set_num_blocks(num_blocks);
  return layout;
}

TEST(LayerExtentsTest, CoverOnlyTheWrittenSlotsOfEachBlock) {
  const KvGeometry local = *KvGeometry::FromProto(Layout(8));
  const KvGeometry remote = *KvGeometry::FromProto(Layout(16));
  // token_bytes = 2*8*2 = 32; block = 2*4*32 = 256 bytes; half = 128.
  // Positions [4, 10): all of block index 1, slots 0-1 of block index 2.
  const std::vector<Extent> extents =
      LayerExtents(local, {0, 5, 6}, remote, {9, 3, 12}, /*layer=*/1, {4, 10});
  const uint64_t local_layer = 8 * 256, remote_layer = 16 * 256;
  EXPECT_THAT(
      extents,
      ::testing::ElementsAre(
          Extent{local_layer + 5 * 256, remote_layer + 3 * 256, 128},  // K
          Extent{local_layer + 5 * 256 + 128, remote_layer + 3 * 256 + 128,
                 128},                                                 // V
          Extent{local_layer + 6 * 256, remote_layer + 12 * 256, 64},  // K
          Extent{local_layer + 6 * 256 + 128, remote_layer + 12 * 256 + 128,
                 64}));  // V
}

TEST(LayerChecksumTest, HashesKThenVOfTheWrittenSlotsInBlockOrder) {
  const KvGeometry g = *KvGeometry::FromProto(Layout(4));
  std::vector<uint8_t> pool(g.pool_bytes());
  for (size_t i = 0; i < pool.size(); ++i)
    pool[i] = static_cast<uint8_t>(i * 7);
  // Positions [0, 5) of blocks {2, 0} in layer 3: block 2 all 4 slots, then
  // block 0 slot 0. Concatenate the bytes by hand and hash them.
  std::string bytes;
  auto append = [&](uint64_t offset, uint64_t length) {
    bytes.append(reinterpret_cast<const char*>(pool.data() + offset), length);
  };
  append(g.Offset(3, 2, KvHalf::kKey), 4 * 32);
  append(g.Offset(3, 2, KvHalf::kValue), 4 * 32);
  append(g.Offset(3, 0, KvHalf::kKey), 32);
  append(g.Offset(3, 0, KvHalf::kValue), 32);
  EXPECT_EQ(LayerChecksum(pool.data(), g, {2, 0}, 3, {0, 5}),
            XXH3_64bits(bytes.data(), bytes.size()));
}

struct Backend {
  std::string name;
  std::function<std::unique_ptr<KvTransport>()> create;
};

class KvBlockTransferTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    auto inner = GetParam().create();
    ASSERT_NE(inner, nullptr);
    writer_ = std::make_unique<FaultInjectingTransport>(std::move(inner));
    receiver_ = GetParam().create();
    ASSERT_NE(receiver_, nullptr);
    prefill_geometry_ = *KvGeometry::FromProto(Layout(32));
    decode_geometry_ = *KvGeometry::FromProto(Layout(64));
    prefill_pool_.resize(prefill_geometry_.pool_bytes());
    decode_pool_.resize(decode_geometry_.pool_bytes());
    std::mt19937 rng(7);
    for (uint8_t& b : prefill_pool_) b = static_cast<uint8_t>(rng());
    for (uint8_t& b : decode_pool_) b = static_cast<uint8_t>(rng());
    original_decode_pool_ = decode_pool_;
    prefill_region_ = *writer_->RegisterRegion(
        prefill_pool_.data(), prefill_pool_.size(), v1::MEMORY_KIND_HOST, 0);
    decode_region_ = *receiver_->RegisterRegion(
        decode_pool_.data(), decode_pool_.size(), v1::MEMORY_KIND_HOST, 0);
    // 22 tokens: blocks of 4 -> 6 blocks, the last holding 2 tokens; the
    // first 8 tokens (2 blocks) are a prefix the decode side has cached.
    target_.set_transfer_id("decode-0/1");
    target_.set_request_id("req-1");
    *target_.mutable_layout() = Layout(64);
    *target_.mutable_region() = *receiver_->ExportRegion(decode_region_);
    for (uint32_t b : {40u, 41u, 7u, 8u, 9u, 63u}) target_.add_block_ids(b);
    target_.set_num_tokens(22);
    target_.set_first_token_position(8);
    remote_region_ = *writer_->ImportPeerRegion(target_.region());
  }

  KvTransferWriterOptions Options() {
    KvTransferWriterOptions options;
    options.transport = writer_.get();
    options.local_region = prefill_region_;
    options.local_pool = prefill_pool_.data();
    options.local_layout = Layout(32);
    options.local_block_ids = {3, 4, 5, 6, 20, 21};
    options.target = target_;
    options.remote_region = remote_region_;
    options.prefill_worker_id = "prefill-0";
    options.deadline = absl::Now() + absl::Seconds(20);
    return options;
  }

  // Writes every layer (in a scrambled order) and finishes.
  absl::StatusOr<v1::KvTransferComplete> Transfer(
      KvTransferWriterOptions options) {
    auto writer = KvTransferWriter::Create(std::move(options));
    if (!writer.ok()) return writer.status();
    for (uint32_t layer : {2u, 0u, 3u, 1u}) {
      if (absl::Status s = (*writer)->WriteLayer(layer); !s.ok()) return s;
    }
    return (*writer)->Finish();
  }

  // What the decode pool must hold after a correct transfer.
  std::vector<uint8_t> ExpectedDecodePool() {
    std::vector<uint8_t> expected = original_decode_pool_;
    const std::vector<uint32_t> local = {3, 4, 5, 6, 20, 21};
    const std::vector<uint32_t> remote = {40, 41, 7, 8, 9, 63};
    for (uint32_t layer = 0; layer < 4; ++layer) {
      for (uint32_t pos = 8; pos < 22; ++pos) {
        for (KvHalf half : {KvHalf::kKey, KvHalf::kValue}) {
          std::memcpy(
              expected.data() + decode_geometry_.Offset(layer, remote[pos / 4],
                                                        half, pos % 4),
              prefill_pool_.data() + prefill_geometry_.Offset(
                                         layer, local[pos / 4], half, pos % 4),
              decode_geometry_.token_bytes());
        }
      }
    }
    return expected;
  }

  absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

  // The pools are declared first so they outlive the transports: a
  // cancelled write may still read its source until the transport is gone.
  std::vector<uint8_t> prefill_pool_, decode_pool_, original_decode_pool_;
  std::unique_ptr<FaultInjectingTransport> writer_;
  std::unique_ptr<KvTransport> receiver_;
  KvGeometry prefill_geometry_ = *KvGeometry::FromProto(Layout(1));
  KvGeometry decode_geometry_ = *KvGeometry::FromProto(Layout(1));
  RegionId prefill_region_ = 0, decode_region_ = 0;
  PeerRegionId remote_region_ = 0;
  v1::KvTransferTarget target_;
};

TEST_P(KvBlockTransferTest, MovesExactlyTheUncachedPositionsAndVerifies) {
  absl::StatusOr<v1::KvTransferComplete> sent = Transfer(Options());
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->bytes_written(), 4u * 14 * 2 * 32);  // layers*tokens*K,V*32
  absl::StatusOr<std::string> payload =
      receiver_->AwaitNotice("decode-0/1", Soon());
  ASSERT_TRUE(payload.ok()) << payload.status();
  v1::KvTransferComplete notice;
  ASSERT_TRUE(notice.ParseFromString(*payload));
  EXPECT_EQ(notice.layer_checksums_size(), 4);
  EXPECT_TRUE(
      VerifyKvTransfer(notice, target_, decode_pool_.data(), decode_geometry_)
          .ok());
  // Byte-exact: written slots hold the prefill bytes, and nothing else
  // changed (cached prefix blocks, slots past the last token, other blocks).
  EXPECT_TRUE(decode_pool_ == ExpectedDecodePool());
}

TEST_P(KvBlockTransferTest, CorruptionIsDetectedAsDataLoss) {
  TransportFaults faults;
  faults.corrupt_writes = true;
  writer_->set_faults(faults);
  ASSERT_TRUE(Transfer(Options()).ok());  // The writer cannot tell.
  v1::KvTransferComplete notice;
  ASSERT_TRUE(
      notice.ParseFromString(*receiver_->AwaitNotice("decode-0/1", Soon())));
  const absl::Status verified =
      VerifyKvTransfer(notice, target_, decode_pool_.data(), decode_geometry_);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_THAT(std::string(verified.message()), HasSubstr("corrupt"));
}

TEST_P(KvBlockTransferTest, DroppedWritesAreDetectedAsDataLoss) {
  TransportFaults faults;
  faults.drop_writes = true;
  writer_->set_faults(faults);
  ASSERT_TRUE(Transfer(Options()).ok());
  v1::KvTransferComplete notice;
  ASSERT_TRUE(
      notice.ParseFromString(*receiver_->AwaitNotice("decode-0/1", Soon())));
  EXPECT_EQ(
      VerifyKvTransfer(notice, target_, decode_pool_.data(), decode_geometry_)
          .code(),
      absl::StatusCode::kDataLoss);
}

TEST_P(KvBlockTransferTest, ALostNoticeTimesOutAtTheReceiver) {
  TransportFaults faults;
  faults.drop_notices = true;
  writer_->set_faults(faults);
  ASSERT_TRUE(Transfer(Options()).ok());
  EXPECT_EQ(
      receiver_
          ->AwaitNotice("decode-0/1", absl::Now() + absl::Milliseconds(300))
          .status()
          .code(),
      absl::StatusCode::kDeadlineExceeded);
}

TEST_P(KvBlockTransferTest, AConnectionLostMidwayFailsTheWriter) {
  TransportFaults faults;
  faults.fail_after_bytes = 1000;  // Part of the first layer.
  writer_->set_faults(faults);
  absl::StatusOr<v1::KvTransferComplete> sent = Transfer(Options());
  EXPECT_EQ(sent.status().code(), absl::StatusCode::kUnavailable)
      << sent.status();
  EXPECT_THAT(std::string(sent.status().message()), HasSubstr("decode-0/1"));
  // No notice was sent: the receiver's wait ends at its deadline.
  EXPECT_EQ(
      receiver_
          ->AwaitNotice("decode-0/1", absl::Now() + absl::Milliseconds(200))
          .status()
          .code(),
      absl::StatusCode::kDeadlineExceeded);
}

TEST_P(KvBlockTransferTest, AStalledTransferFailsAtItsDeadline) {
  TransportFaults faults;
  faults.delay = absl::Seconds(30);
  writer_->set_faults(faults);
  KvTransferWriterOptions options = Options();
  options.deadline = absl::Now() + absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::KvTransferComplete> sent = Transfer(std::move(options));
  EXPECT_EQ(sent.status().code(), absl::StatusCode::kDeadlineExceeded)
      << sent.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_P(KvBlockTransferTest, TheAdmissionsLifeCapsTheWritersDeadline) {
  // The decode worker reuses the blocks once the admission ends, so a writer
  // must give up by then even when its caller allowed more.
  TransportFaults faults;
  faults.delay = absl::Seconds(30);
  writer_->set_faults(faults);
  KvTransferWriterOptions options = Options();
  options.target.set_expires_in_ms(300);
  options.deadline = absl::Now() + absl::Seconds(60);
  const absl::Time start = absl::Now();
  EXPECT_EQ(Transfer(std::move(options)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_P(KvBlockTransferTest, AFailedWriterRefusesToGoOn) {
  TransportFaults faults;
  faults.fail_after_bytes = 100;
  writer_->set_faults(faults);
  auto writer = KvTransferWriter::Create(Options());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->WriteLayer(0).ok());  // Fails in the background.
  absl::Status status;
  for (uint32_t layer = 1; layer < 4 && status.ok(); ++layer) {
    absl::SleepFor(absl::Milliseconds(20));
    status = (*writer)->WriteLayer(layer);
  }
  if (status.ok()) status = (*writer)->Finish().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  // Whatever the caller tries next, the failure stands and nothing is sent.
  EXPECT_EQ((*writer)->Finish().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(
      receiver_
          ->AwaitNotice("decode-0/1", absl::Now() + absl::Milliseconds(200))
          .status()
          .code(),
      absl::StatusCode::kDeadlineExceeded);
}

TEST_P(KvBlockTransferTest, AWriterPastItsDeadlinePostsNothing) {
  // Past the deadline (or the admission's life) the decode worker may have
  // reused the blocks for another request: a late write would corrupt that
  // request's KV, so nothing may be posted at all.
  std::vector<KvTransferWriterOptions> cases(2, Options());
  cases[0].deadline = absl::Now() - absl::Milliseconds(1);  // The caller's.
  cases[1].target.set_expires_in_ms(1);                     // The admission's.
  for (KvTransferWriterOptions& options : cases) {
    auto writer = KvTransferWriter::Create(std::move(options));
    ASSERT_TRUE(writer.ok()) << writer.status();
    absl::SleepFor(absl::Milliseconds(5));  // Let the 1 ms admission end.
    const absl::Status status = (*writer)->WriteLayer(0);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("decode-0/1"));
    EXPECT_EQ((*writer)->bytes_posted(), 0u);
    // The failure stands: no later layer is posted either.
    EXPECT_EQ((*writer)->WriteLayer(1).code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ((*writer)->Finish().status().code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ((*writer)->bytes_posted(), 0u);
    // Nothing was posted, so nothing can still land: quiesced at once.
    EXPECT_TRUE((*writer)->Quiesce(absl::Now()));
  }
  EXPECT_TRUE(decode_pool_ == original_decode_pool_);
  EXPECT_EQ(
      receiver_
          ->AwaitNotice("decode-0/1", absl::Now() + absl::Milliseconds(100))
          .status()
          .code(),
      absl::StatusCode::kDeadlineExceeded);
}

TEST_P(KvBlockTransferTest, QuiesceWaitsForEveryPostedWriteThenRefuses) {
  // Each write is reported done 100 ms after it is posted: Quiesce must wait
  // for that rather than cancel, since a cancelled write may still land.
  TransportFaults faults;
  faults.delay = absl::Milliseconds(100);
  writer_->set_faults(faults);
  auto writer = KvTransferWriter::Create(Options());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Time before_posts = absl::Now();
  for (uint32_t layer : {2u, 0u, 3u, 1u}) {
    ASSERT_TRUE((*writer)->WriteLayer(layer).ok()) << layer;
  }
  EXPECT_TRUE((*writer)->Quiesce(absl::Now() + absl::Seconds(2)));
  EXPECT_GE(absl::Now(), before_posts + absl::Milliseconds(100));
  // Every posted byte has landed; nothing else changed.
  EXPECT_EQ((*writer)->bytes_posted(), 4u * 14 * 2 * 32);
  EXPECT_TRUE(decode_pool_ == ExpectedDecodePool());
  // A quiesced transfer is over: no notice, whatever the caller tries.
  EXPECT_EQ((*writer)->WriteLayer(0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*writer)->Finish().status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(
      receiver_
          ->AwaitNotice("decode-0/1", absl::Now() + absl::Milliseconds(100))
          .status()
          .code(),
      absl::StatusCode::kDeadlineExceeded);
}

TEST_P(KvBlockTransferTest, QuiesceAfterAFailureWaitsForWritesStillRunning) {
  // Layer 0 is still running (reported 150 ms after its post) when layer 1
  // fails at once; the writer learns of the failure at layer 2.
  TransportFaults slow;
  slow.delay = absl::Milliseconds(150);
  writer_->set_faults(slow);
  auto writer = KvTransferWriter::Create(Options());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Time before_post = absl::Now();
  ASSERT_TRUE((*writer)->WriteLayer(0).ok());
  TransportFaults broken;
  broken.fail_after_bytes = 0;
  writer_->set_faults(broken);
  ASSERT_TRUE((*writer)->WriteLayer(1).ok());  // Fails in the background.
  absl::Status status;
  for (uint32_t layer = 2; layer < 4 && status.ok(); ++layer) {
    absl::SleepFor(absl::Milliseconds(5));
    status = (*writer)->WriteLayer(layer);
  }
  ASSERT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  // Quiesce returns once layer 0's write has finished, not before, and
  // cannot vouch for the failed write (its bytes may still be in flight).
  EXPECT_FALSE((*writer)->Quiesce(absl::Now() + absl::Seconds(2)));
  EXPECT_GE(absl::Now(), before_post + absl::Milliseconds(150));
  // The first failure stands.
  EXPECT_EQ((*writer)->WriteLayer(3).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*writer)->Finish().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_P(KvBlockTransferTest, QuiesceGivesUpWhileAWriteIsStillRunning) {
  TransportFaults faults;
  faults.delay = absl::Seconds(30);  // Reported long after Quiesce's deadline.
  writer_->set_faults(faults);
  auto writer = KvTransferWriter::Create(Options());
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->WriteLayer(0).ok());
  const absl::Time start = absl::Now();
  // The write may still land: the decode worker must quarantine the blocks.
  EXPECT_FALSE((*writer)->Quiesce(start + absl::Milliseconds(100)));
  EXPECT_GE(absl::Now(), start + absl::Milliseconds(100));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ((*writer)->WriteLayer(1).code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*writer)->Finish().status().code(), absl::StatusCode::kAborted);
}

TEST_P(KvBlockTransferTest, RefusesMismatchedLayoutsAndBlockLists) {
  KvTransferWriterOptions options = Options();
  options.local_layout.set_dtype(v1::KV_DTYPE_BF16);
  EXPECT_EQ(KvTransferWriter::Create(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options = Options();
  options.local_block_ids.pop_back();
  EXPECT_EQ(KvTransferWriter::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.target.set_block_ids(0, 64);  // Outside the decode pool.
  EXPECT_EQ(KvTransferWriter::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options();
  options.target.set_first_token_position(6);  // Not a block boundary.
  EXPECT_EQ(KvTransferWriter::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto writer = KvTransferWriter::Create(Options());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->WriteLayer(0).ok());
  EXPECT_EQ((*writer)->WriteLayer(0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->Finish().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(KvBlockTransferTest, VerifyRefusesANoticeForAnotherTarget) {
  ASSERT_TRUE(Transfer(Options()).ok());
  v1::KvTransferComplete notice;
  ASSERT_TRUE(
      notice.ParseFromString(*receiver_->AwaitNotice("decode-0/1", Soon())));
  v1::KvTransferTarget other = target_;
  other.set_transfer_id("decode-0/2");
  EXPECT_EQ(
      VerifyKvTransfer(notice, other, decode_pool_.data(), decode_geometry_)
          .code(),
      absl::StatusCode::kInvalidArgument);
  notice.set_num_tokens(21);
  EXPECT_EQ(
      VerifyKvTransfer(notice, target_, decode_pool_.data(), decode_geometry_)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, KvBlockTransferTest,
    ::testing::Values(Backend{"InProcess",
                              []() -> std::unique_ptr<KvTransport> {
                                auto t = InProcessTransport::Create();
                                return t.ok() ? std::move(t).value() : nullptr;
                              }},
                      Backend{"Ucx",
                              []() -> std::unique_ptr<KvTransport> {
                                auto t = UcxTransport::Create({});
                                EXPECT_TRUE(t.ok()) << t.status();
                                return t.ok() ? std::move(t).value() : nullptr;
                              }}),
    [](const ::testing::TestParamInfo<Backend>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace pdserve::kv_transfer
