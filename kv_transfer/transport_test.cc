// Behaviour every KvTransport backend must have, run against each backend
// (two transports in this process stand for the two sides).
#include "kv_transfer/transport.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_transfer/in_process_transport.h"
#include "kv_transfer/ucx_transport.h"

namespace pdserve::kv_transfer {
namespace {

using ::testing::HasSubstr;

struct Backend {
  std::string name;
  std::function<std::unique_ptr<KvTransport>(const std::string&)> create;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

class TransportTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    writer_ = GetParam().create("writer");
    receiver_ = GetParam().create("receiver");
    ASSERT_NE(writer_, nullptr);
    ASSERT_NE(receiver_, nullptr);
    source_ = RandomBytes(kPoolBytes, 1);
    destination_ = RandomBytes(kPoolBytes, 2);
    original_destination_ = destination_;
    auto source = writer_->RegisterRegion(source_.data(), source_.size(),
                                          v1::MEMORY_KIND_HOST, 0);
    ASSERT_TRUE(source.ok()) << source.status();
    source_region_ = *source;
    auto destination = receiver_->RegisterRegion(
        destination_.data(), destination_.size(), v1::MEMORY_KIND_HOST, 0);
    ASSERT_TRUE(destination.ok()) << destination.status();
    destination_region_ = *destination;
    auto descriptor = receiver_->ExportRegion(destination_region_);
    ASSERT_TRUE(descriptor.ok()) << descriptor.status();
    descriptor_ = *descriptor;
    auto peer = writer_->ImportPeerRegion(descriptor_);
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
  }

  absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

  static constexpr size_t kPoolBytes = 4 << 20;
  // Declared before the transports so they outlive them: a cancelled write
  // may still read its source until its transport is gone.
  std::vector<uint8_t> source_;
  std::vector<uint8_t> destination_;
  std::vector<uint8_t> original_destination_;
  std::unique_ptr<KvTransport> writer_;
  std::unique_ptr<KvTransport> receiver_;
  RegionId source_region_ = 0;
  RegionId destination_region_ = 0;
  v1::MemoryRegionDescriptor descriptor_;
  PeerRegionId peer_ = 0;
};

TEST_P(TransportTest, WritesExactBytesOnlyWhereAskedAndTheNoticeFollows) {
  // A mix: two runs that coalesce, a lone small extent, a large one.
  const std::vector<Extent> extents = {{4096, 8192, 512},
                                       {4608, 8704, 512},
                                       {100, 3 << 20, 7},
                                       {1 << 20, 1 << 20, 1 << 20}};
  absl::StatusOr<OperationId> op =
      writer_->PostWrite({source_region_, peer_, extents, Deadline()});
  ASSERT_TRUE(op.ok()) << op.status();
  absl::StatusOr<OperationId> notice =
      writer_->PostNotice(peer_, "transfer-1", "all done", Deadline());
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_TRUE(writer_->Wait(*op, Deadline()).ok());
  EXPECT_TRUE(writer_->Wait(*notice, Deadline()).ok());

  absl::StatusOr<std::string> payload =
      receiver_->AwaitNotice("transfer-1", Deadline());
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, "all done");

  std::vector<uint8_t> expected = original_destination_;
  for (const Extent& e : extents) {
    std::memcpy(expected.data() + e.remote_offset,
                source_.data() + e.local_offset, e.length);
  }
  EXPECT_TRUE(expected == destination_) << "destination bytes differ";
  // Once reported, an operation is forgotten.
  EXPECT_EQ(writer_->Poll(*op).status.code(), absl::StatusCode::kNotFound);
}

TEST_P(TransportTest, ManyLayerWritesThenOneNotice) {
  // 30 "layers" of 64 KiB, posted back to back, then the notice: when the
  // notice arrives, every byte of every layer is there.
  std::vector<OperationId> ops;
  for (uint64_t layer = 0; layer < 30; ++layer) {
    auto op = writer_->PostWrite({source_region_,
                                  peer_,
                                  {{layer << 16, layer << 16, 1 << 16}},
                                  Deadline()});
    ASSERT_TRUE(op.ok()) << op.status();
    ops.push_back(*op);
  }
  auto notice = writer_->PostNotice(peer_, "t", "n", Deadline());
  ASSERT_TRUE(notice.ok());
  ASSERT_TRUE(receiver_->AwaitNotice("t", Deadline()).ok());
  EXPECT_EQ(std::memcmp(destination_.data(), source_.data(), 30 << 16), 0);
  for (OperationId op : ops) EXPECT_TRUE(writer_->Wait(op, Deadline()).ok());
}

TEST_P(TransportTest, BadRequestsAreRefusedAtPost) {
  EXPECT_EQ(
      writer_
          ->PostWrite(
              {source_region_, peer_, {{kPoolBytes - 10, 0, 11}}, Deadline()})
          .status()
          .code(),
      absl::StatusCode::kOutOfRange);
  EXPECT_EQ(writer_->PostWrite({source_region_, peer_, {{0, 0, 0}}, Deadline()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      writer_->PostWrite({999, peer_, {{0, 0, 1}}, Deadline()}).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(writer_
                ->PostNotice(peer_, "k", std::string(kMaxNoticeBytes + 1, 'x'),
                             Deadline())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(writer_->ReleasePeerRegion(peer_).ok());
  EXPECT_EQ(writer_->PostWrite({source_region_, peer_, {{0, 0, 1}}, Deadline()})
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(writer_->ReleasePeerRegion(peer_).code(),
            absl::StatusCode::kNotFound);
}

TEST_P(TransportTest, DescriptorsOfAnotherTransportOrMalformedAreRefused) {
  v1::MemoryRegionDescriptor other = descriptor_;
  other.set_transport(other.transport() == v1::TRANSPORT_KIND_UCX
                          ? v1::TRANSPORT_KIND_IN_PROCESS
                          : v1::TRANSPORT_KIND_UCX);
  absl::StatusOr<PeerRegionId> imported = writer_->ImportPeerRegion(other);
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  v1::MemoryRegionDescriptor empty;
  empty.set_transport(descriptor_.transport());
  EXPECT_EQ(writer_->ImportPeerRegion(empty).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportTest, ANoticeThatNeverComesTimesOut) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> payload = receiver_->AwaitNotice(
      "never-sent", absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(payload.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// Cancel depends on whether a backend's writes can still be in flight when
// PostWrite returns. UCX's are: PostWrite hands them to the progress thread
// and returns, so a cancel can end one. The in-process backend's are not:
// PostWrite copies the bytes before it returns, so a cancel always comes
// too late and the write keeps its result. Each kind is tested as itself.
class CancellableTransportTest : public TransportTest {};
class SynchronousTransportTest : public TransportTest {};

TEST_P(CancellableTransportTest,
       CancelEndsAnOperationAndTheTransportStaysUsable) {
  // Writes queue on the progress thread in order: by the time the last of
  // many large writes has been posted, it cannot have finished (the ones
  // before it still copy tens of MiB), so cancelling it first must end it
  // as CANCELLED. The others may each have finished first.
  std::vector<OperationId> ops;
  for (int i = 0; i < 32; ++i) {
    auto op = writer_->PostWrite(
        {source_region_, peer_, {{0, 0, kPoolBytes}}, Deadline()});
    ASSERT_TRUE(op.ok()) << op.status();
    ops.push_back(*op);
  }
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) writer_->Cancel(*it);
  EXPECT_EQ(writer_->Wait(ops.back(), Deadline()).code(),
            absl::StatusCode::kCancelled);
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    const absl::Status status = writer_->Wait(ops[i], Deadline());
    EXPECT_TRUE(status.ok() || status.code() == absl::StatusCode::kCancelled)
        << status;
  }
  // Cancelling again, or a forgotten operation, changes nothing.
  writer_->Cancel(ops.back());
  auto again =
      writer_->PostWrite({source_region_, peer_, {{0, 0, 4096}}, Deadline()});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(writer_->Wait(*again, Deadline()).ok());
  EXPECT_EQ(std::memcmp(destination_.data(), source_.data(), 4096), 0);
}

TEST_P(SynchronousTransportTest, CancelAfterPostWriteComesTooLate) {
  auto op = writer_->PostWrite(
      {source_region_, peer_, {{0, 0, kPoolBytes}}, Deadline()});
  ASSERT_TRUE(op.ok());
  writer_->Cancel(*op);
  // It finished inside PostWrite; the cancel leaves it as it finished.
  EXPECT_TRUE(writer_->Wait(*op, Deadline()).ok());
  EXPECT_EQ(std::memcmp(destination_.data(), source_.data(), kPoolBytes), 0);
  auto again =
      writer_->PostWrite({source_region_, peer_, {{0, 0, 4096}}, Deadline()});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(writer_->Wait(*again, Deadline()).ok());
}

TEST_P(TransportTest, RegisteringAndImportingManyTimesLeavesNothingBehind) {
  std::vector<uint8_t> scratch(1 << 16);
  for (int i = 0; i < 100; ++i) {
    auto region = receiver_->RegisterRegion(scratch.data(), scratch.size(),
                                            v1::MEMORY_KIND_HOST, 0);
    ASSERT_TRUE(region.ok()) << region.status();
    auto descriptor = receiver_->ExportRegion(*region);
    ASSERT_TRUE(descriptor.ok());
    auto peer = writer_->ImportPeerRegion(*descriptor);
    ASSERT_TRUE(peer.ok()) << peer.status();
    ASSERT_TRUE(writer_->ReleasePeerRegion(*peer).ok());
    ASSERT_TRUE(receiver_->DeregisterRegion(*region).ok());
  }
  EXPECT_EQ(receiver_->DeregisterRegion(12345).code(),
            absl::StatusCode::kNotFound);
  if (auto* ucx = dynamic_cast<UcxTransport*>(writer_.get())) {
    const UcxTransport::ResourceCounts writer = ucx->resource_counts();
    EXPECT_EQ(writer.regions, 1u);       // source_
    EXPECT_EQ(writer.peer_regions, 1u);  // peer_
    EXPECT_EQ(writer.pending_operations, 0u);
    const UcxTransport::ResourceCounts receiver =
        static_cast<UcxTransport*>(receiver_.get())->resource_counts();
    EXPECT_EQ(receiver.regions, 1u);  // destination_
  }
}

const Backend kInProcess{
    "InProcess", [](const std::string&) -> std::unique_ptr<KvTransport> {
      auto t = InProcessTransport::Create();
      return t.ok() ? std::move(t).value() : nullptr;
    }};
const Backend kUcx{"Ucx",
                   [](const std::string& name) -> std::unique_ptr<KvTransport> {
                     UcxTransportOptions options;
                     options.name = name;
                     auto t = UcxTransport::Create(options);
                     EXPECT_TRUE(t.ok()) << t.status();
                     return t.ok() ? std::move(t).value() : nullptr;
                   }};
std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest,
                         ::testing::Values(kInProcess, kUcx), BackendName);
// Writes still in flight when PostWrite returns.
INSTANTIATE_TEST_SUITE_P(Backends, CancellableTransportTest,
                         ::testing::Values(kUcx), BackendName);
// Writes finished when PostWrite returns.
INSTANTIATE_TEST_SUITE_P(Backends, SynchronousTransportTest,
                         ::testing::Values(kInProcess), BackendName);

TEST(UcxTransportTest, DescribesTheLanesItUses) {
  auto a = UcxTransport::Create({.name = "a"});
  auto b = UcxTransport::Create({.name = "b"});
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> pool(4096);
  auto region =
      (*b)->RegisterRegion(pool.data(), pool.size(), v1::MEMORY_KIND_HOST, 0);
  ASSERT_TRUE(region.ok());
  auto peer = (*a)->ImportPeerRegion(*(*b)->ExportRegion(*region));
  ASSERT_TRUE(peer.ok()) << peer.status();
  absl::StatusOr<std::string> lanes = (*a)->DescribeConnection(*peer);
  ASSERT_TRUE(lanes.ok()) << lanes.status();
  EXPECT_THAT(*lanes, HasSubstr("lane["));
}

// Two UCX transports of one process share a shared-memory domain, as two
// processes on one host do.
class UcxAllocatedRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto writer = UcxTransport::Create({.name = "writer"});
    auto receiver = UcxTransport::Create({.name = "receiver"});
    ASSERT_TRUE(writer.ok() && receiver.ok());
    writer_ = std::move(writer).value();
    receiver_ = std::move(receiver).value();
    auto source = writer_->RegisterRegion(source_.data(), source_.size(),
                                          v1::MEMORY_KIND_HOST, 0);
    ASSERT_TRUE(source.ok()) << source.status();
    source_region_ = *source;
    auto allocated = receiver_->AllocateRegion(kPoolBytes);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    allocated_ = *allocated;
  }

  // Writes `extents` and a notice after them; checks every byte of the
  // allocated region (written ones from the source, the rest still zero).
  void WriteAndCheck(PeerRegionId peer, const std::vector<Extent>& extents) {
    absl::StatusOr<OperationId> write = writer_->PostWrite(
        {source_region_, peer, extents, absl::Now() + absl::Seconds(20)});
    ASSERT_TRUE(write.ok()) << write.status();
    EXPECT_TRUE(writer_->Wait(*write, absl::Now() + absl::Seconds(20)).ok());
    absl::StatusOr<OperationId> notice =
        writer_->PostNotice(peer, "t", "done", absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(notice.ok());
    EXPECT_TRUE(writer_->Wait(*notice, absl::Now() + absl::Seconds(20)).ok());
    EXPECT_EQ(*receiver_->AwaitNotice("t", absl::Now() + absl::Seconds(20)),
              "done");
    std::vector<uint8_t> expected(kPoolBytes, 0);
    for (const Extent& e : extents) {
      std::memcpy(expected.data() + e.remote_offset,
                  source_.data() + e.local_offset, e.length);
    }
    EXPECT_EQ(std::memcmp(allocated_.base, expected.data(), kPoolBytes), 0);
  }

  static constexpr size_t kPoolBytes = 4 << 20;
  std::vector<uint8_t> source_ = RandomBytes(kPoolBytes, 1);
  std::unique_ptr<UcxTransport> writer_;
  std::unique_ptr<UcxTransport> receiver_;
  RegionId source_region_ = 0;
  AllocatedRegion allocated_;
  // Coalescing runs, a lone small extent, one of several pieces.
  const std::vector<Extent> extents_ = {{4096, 8192, 512},
                                        {4608, 8704, 512},
                                        {100, 3 << 20, 7},
                                        {1 << 20, 1 << 20, (2 << 20) + 5}};
};

TEST_F(UcxAllocatedRegionTest, IsZeroedPageAlignedAndStoredIntoDirectly) {
  ASSERT_EQ(reinterpret_cast<uintptr_t>(allocated_.base) % 4096, 0u);
  EXPECT_TRUE(std::all_of(allocated_.base, allocated_.base + kPoolBytes,
                          [](uint8_t b) { return b == 0; }));
  const v1::MemoryRegionDescriptor descriptor =
      *receiver_->ExportRegion(allocated_.id);
  EXPECT_FALSE(descriptor.shared_memory_domain().empty());
  auto peer = writer_->ImportPeerRegion(descriptor);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_THAT(*writer_->DescribeConnection(*peer),
              HasSubstr("direct stores into the peer's shared memory"));
  // A direct write is the copy itself: done when PostWrite returns.
  absl::StatusOr<OperationId> write = writer_->PostWrite(
      {source_region_, *peer, {{0, 0, 64}}, absl::Now() + absl::Seconds(20)});
  ASSERT_TRUE(write.ok());
  EXPECT_EQ(writer_->Poll(*write).state, OperationState::kDone);
  std::memset(allocated_.base, 0, 64);
  WriteAndCheck(*peer, extents_);
}

TEST_F(UcxAllocatedRegionTest, AnotherDomainsRegionIsWrittenThroughTheLanes) {
  // As from another machine or another IPC/PID namespace: the mapping UCX
  // might offer is not trusted.
  v1::MemoryRegionDescriptor descriptor =
      *receiver_->ExportRegion(allocated_.id);
  descriptor.set_shared_memory_domain("another-host/ipc:[1]/pid:[1]");
  auto peer = writer_->ImportPeerRegion(descriptor);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_THAT(*writer_->DescribeConnection(*peer),
              HasSubstr("puts through the lanes"));
  WriteAndCheck(*peer, extents_);
}

TEST_F(UcxAllocatedRegionTest, AWriteOverItsDeadlineStoresNothing) {
  auto peer =
      writer_->ImportPeerRegion(*receiver_->ExportRegion(allocated_.id));
  ASSERT_TRUE(peer.ok());
  absl::StatusOr<OperationId> write = writer_->PostWrite(
      {source_region_, *peer, extents_, absl::Now() - absl::Seconds(1)});
  ASSERT_TRUE(write.ok());
  EXPECT_EQ(writer_->Wait(*write, absl::Now() + absl::Seconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(std::all_of(allocated_.base, allocated_.base + kPoolBytes,
                          [](uint8_t b) { return b == 0; }));
}

TEST_F(UcxAllocatedRegionTest, DeregisteringFreesItAndReleasedPeersGoToo) {
  auto peer =
      writer_->ImportPeerRegion(*receiver_->ExportRegion(allocated_.id));
  ASSERT_TRUE(peer.ok());
  EXPECT_TRUE(writer_->ReleasePeerRegion(*peer).ok());
  EXPECT_EQ(
      writer_->PostWrite({source_region_, *peer, extents_}).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(writer_->resource_counts().peer_regions, 0u);
  EXPECT_TRUE(receiver_->DeregisterRegion(allocated_.id).ok());
  EXPECT_EQ(receiver_->resource_counts().regions, 0u);
}

}  // namespace
}  // namespace pdserve::kv_transfer
