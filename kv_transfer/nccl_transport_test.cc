// NcclTransport: the parts that run everywhere (creation fails cleanly
// without a GPU; host memory is refused) and the GPU tests, which skip
// without the GPUs they need unless PDSERVE_REQUIRE_GPU is set: then a
// machine with fewer GPUs than a test needs fails it, saying why.
//
// Two ranks of one NCCL communicator cannot share a GPU (NCCL refuses a
// duplicate device, also across processes), so the data tests need two GPUs:
// the writer on device 0, the receiver on device 1, in this process, each
// transport driving NCCL from its own threads. On a one-GPU machine they
// fail under PDSERVE_REQUIRE_GPU; leave them out knowingly there with
// --test_filter=-NcclTwoGpuTest.*.
#include "kv_transfer/nccl_transport.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_transfer/transport_factory.h"

namespace pdserve::kv_transfer {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

bool GpuRequired() {
  const char* value = std::getenv("PDSERVE_REQUIRE_GPU");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

int GpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// What a test that needs `needed` GPUs does on a machine with `found`: runs
// (empty message), skips, or, when GPUs are required, fails.
struct GpuVerdict {
  bool fail = false;
  std::string message;  // Why it skips or fails; empty: it runs.
};
GpuVerdict CheckGpus(int needed, int found, bool required) {
  if (found >= needed) return {};
  if (!required) {
    return {false, found == 0 ? std::string("no GPU")
                              : absl::StrCat("needs ", needed, " GPUs, found ",
                                             found)};
  }
  return {true, absl::StrCat(
                    "PDSERVE_REQUIRE_GPU is set but this test needs ", needed,
                    " GPU", needed == 1 ? "" : "s", " and CUDA finds ", found,
                    needed > 1 ? " (two ranks of one NCCL communicator "
                                 "cannot share a device)"
                               : "")};
}

// Runs the rest of the test only if `n` GPUs are present: otherwise skips,
// or fails when PDSERVE_REQUIRE_GPU is set.
#define PD_REQUIRE_GPUS(n)                                                   \
  do {                                                                       \
    const GpuVerdict pd_verdict = CheckGpus((n), GpuCount(), GpuRequired()); \
    if (pd_verdict.fail) FAIL() << pd_verdict.message;                       \
    if (!pd_verdict.message.empty()) GTEST_SKIP() << pd_verdict.message;     \
  } while (false)

TEST(GpuRequirementTest, RequiredGpusThatAreMissingFailTheTest) {
  EXPECT_TRUE(CheckGpus(2, 1, /*required=*/true).fail);
  EXPECT_THAT(CheckGpus(2, 1, true).message,
              HasSubstr("needs 2 GPUs and CUDA finds 1"));
  EXPECT_TRUE(CheckGpus(1, 0, true).fail);
  EXPECT_TRUE(CheckGpus(2, 0, true).fail);
  EXPECT_EQ(CheckGpus(2, 2, true).message, "");
  EXPECT_FALSE(CheckGpus(2, 1, /*required=*/false).fail);
  EXPECT_EQ(CheckGpus(2, 1, false).message, "needs 2 GPUs, found 1");
  EXPECT_EQ(CheckGpus(1, 0, false).message, "no GPU");
  EXPECT_EQ(CheckGpus(1, 1, false).message, "");
}

NcclTransportOptions Options(int device, const std::string& name) {
  NcclTransportOptions options;
  options.device = device;
  options.name = name;
  options.connect_timeout = absl::Seconds(20);
  return options;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// Device memory on one GPU, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(data_);
    }
  }

  cudaError_t Allocate(int device, size_t size) {
    device_ = device;
    size_ = size;
    cudaError_t status = cudaSetDevice(device);
    if (status != cudaSuccess) return status;
    return cudaMalloc(&data_, size);
  }
  cudaError_t Upload(const std::vector<uint8_t>& bytes) {
    cudaSetDevice(device_);
    return cudaMemcpy(data_, bytes.data(), bytes.size(),
                      cudaMemcpyHostToDevice);
  }
  std::vector<uint8_t> Download() {
    std::vector<uint8_t> bytes(size_);
    cudaSetDevice(device_);
    EXPECT_EQ(cudaMemcpy(bytes.data(), data_, size_, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return bytes;
  }
  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  int device_ = 0;
  size_t size_ = 0;
  void* data_ = nullptr;
};

// --- Everywhere -------------------------------------------------------------

TEST(NcclTransportTest, CreateSucceedsOrFailsCleanlyAndRefusesHostMemory) {
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      NcclTransport::Create(Options(0, "probe"));
  if (!transport.ok()) {
    // No GPU or driver here: a clear error, no crash.
    EXPECT_EQ(transport.status().code(), absl::StatusCode::kFailedPrecondition)
        << transport.status();
    EXPECT_THAT(transport.status().message(), HasSubstr("CUDA"));
    EXPECT_FALSE(GpuRequired()) << transport.status();
    return;
  }
  EXPECT_EQ((*transport)->kind(), v1::TRANSPORT_KIND_NCCL);
  std::vector<uint8_t> host(1 << 16);
  absl::StatusOr<RegionId> region =
      (*transport)
          ->RegisterRegion(host.data(), host.size(), v1::MEMORY_KIND_HOST, 0);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(region.status().message(), HasSubstr("CUDA device memory only"));
  // Host memory declared as CUDA memory is refused too.
  region =
      (*transport)
          ->RegisterRegion(host.data(), host.size(), v1::MEMORY_KIND_CUDA, 0);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportTest, CreateRejectsBadOptions) {
  NcclTransportOptions options = Options(-1, "bad");
  EXPECT_EQ(NcclTransport::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options(0, "bad");
  options.staging_slots = NcclTransport::kMaxSlotsPerPeer;
  EXPECT_EQ(NcclTransport::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options(0, "bad");
  options.connect_timeout = absl::ZeroDuration();
  EXPECT_EQ(NcclTransport::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --- One GPU ----------------------------------------------------------------

TEST(NcclTransportGpuTest, RegistersExportsAndDeregisters) {
  PD_REQUIRE_GPUS(1);
  auto transport = NcclTransport::Create(Options(0, "one"));
  ASSERT_TRUE(transport.ok()) << transport.status();
  DeviceBuffer buffer;
  ASSERT_EQ(buffer.Allocate(0, 1 << 20), cudaSuccess);

  EXPECT_EQ((*transport)
                ->RegisterRegion(buffer.data(), buffer.size(),
                                 v1::MEMORY_KIND_CUDA, 1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<RegionId> region =
      (*transport)
          ->RegisterRegion(buffer.data(), buffer.size(), v1::MEMORY_KIND_CUDA,
                           0);
  ASSERT_TRUE(region.ok()) << region.status();

  auto first = (*transport)->ExportRegion(*region);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->transport(), v1::TRANSPORT_KIND_NCCL);
  EXPECT_EQ(first->peer_address().size(), 128u);
  EXPECT_TRUE(first->remote_key().empty());
  EXPECT_EQ(first->base_address(), reinterpret_cast<uint64_t>(buffer.data()));
  EXPECT_EQ(first->length_bytes(), buffer.size());
  EXPECT_EQ(first->memory_kind(), v1::MEMORY_KIND_CUDA);
  EXPECT_EQ(first->device_id(), 0u);
  // One export per writer: each has its own communicator id.
  auto second = (*transport)->ExportRegion(*region);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->peer_address(), second->peer_address());
  EXPECT_NE(first->region_id(), second->region_id());

  // Ends both exports (nobody joined them) promptly.
  const absl::Time start = absl::Now();
  EXPECT_TRUE((*transport)->DeregisterRegion(*region).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ((*transport)->ExportRegion(*region).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(NcclTransportGpuTest, RefusesForeignAndMalformedDescriptors) {
  PD_REQUIRE_GPUS(1);
  auto transport = NcclTransport::Create(Options(0, "one"));
  ASSERT_TRUE(transport.ok()) << transport.status();
  v1::MemoryRegionDescriptor descriptor;
  descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
  descriptor.set_peer_address(std::string(128, 'x'));
  descriptor.set_length_bytes(4096);
  descriptor.set_memory_kind(v1::MEMORY_KIND_CUDA);
  EXPECT_EQ((*transport)->ImportPeerRegion(descriptor).status().code(),
            absl::StatusCode::kInvalidArgument);
  descriptor.set_transport(v1::TRANSPORT_KIND_NCCL);
  descriptor.set_peer_address("short");
  EXPECT_EQ((*transport)->ImportPeerRegion(descriptor).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*transport)
                ->PostNotice(12345, "k", "p", absl::InfiniteFuture())
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(NcclTransportGpuTest, ImportOfAnAbandonedExportFailsWithinTheTimeout) {
  PD_REQUIRE_GPUS(1);
  DeviceBuffer buffer;
  ASSERT_EQ(buffer.Allocate(0, 1 << 20), cudaSuccess);
  v1::MemoryRegionDescriptor descriptor;
  {
    auto owner = NcclTransport::Create(Options(0, "owner"));
    ASSERT_TRUE(owner.ok()) << owner.status();
    auto region = (*owner)->RegisterRegion(buffer.data(), buffer.size(),
                                           v1::MEMORY_KIND_CUDA, 0);
    ASSERT_TRUE(region.ok()) << region.status();
    auto exported = (*owner)->ExportRegion(*region);
    ASSERT_TRUE(exported.ok()) << exported.status();
    descriptor = *exported;
  }  // The owner is gone: nobody serves the descriptor.
  NcclTransportOptions options = Options(0, "writer");
  options.connect_timeout = absl::Seconds(3);
  auto writer = NcclTransport::Create(options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<PeerRegionId> peer = (*writer)->ImportPeerRegion(descriptor);
  EXPECT_FALSE(peer.ok());
  EXPECT_THAT(peer.status().code(), AnyOf(absl::StatusCode::kUnavailable,
                                          absl::StatusCode::kDeadlineExceeded))
      << peer.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3 + 10));
}

// --- Two GPUs ---------------------------------------------------------------

class NcclTwoGpuTest : public ::testing::Test {
 protected:
  static constexpr size_t kPoolBytes = 64 << 20;
  static constexpr int kWriterDevice = 0;
  static constexpr int kReceiverDevice = 1;

  void SetUp() override {
    PD_REQUIRE_GPUS(2);
    source_bytes_ = RandomBytes(kPoolBytes, 1);
    original_destination_ = RandomBytes(kPoolBytes, 2);
    ASSERT_EQ(source_.Allocate(kWriterDevice, kPoolBytes), cudaSuccess);
    ASSERT_EQ(source_.Upload(source_bytes_), cudaSuccess);
    ASSERT_EQ(destination_.Allocate(kReceiverDevice, kPoolBytes), cudaSuccess);
    ASSERT_EQ(destination_.Upload(original_destination_), cudaSuccess);

    auto writer = NcclTransport::Create(Options(kWriterDevice, "writer"));
    ASSERT_TRUE(writer.ok()) << writer.status();
    writer_ = std::move(*writer);
    auto receiver = NcclTransport::Create(Options(kReceiverDevice, "receiver"));
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = std::move(*receiver);

    auto source = writer_->RegisterRegion(source_.data(), kPoolBytes,
                                          v1::MEMORY_KIND_CUDA, kWriterDevice);
    ASSERT_TRUE(source.ok()) << source.status();
    source_region_ = *source;
    auto destination = receiver_->RegisterRegion(
        destination_.data(), kPoolBytes, v1::MEMORY_KIND_CUDA, kReceiverDevice);
    ASSERT_TRUE(destination.ok()) << destination.status();
    destination_region_ = *destination;
    auto descriptor = receiver_->ExportRegion(destination_region_);
    ASSERT_TRUE(descriptor.ok()) << descriptor.status();
    descriptor_ = *descriptor;
    auto peer = writer_->ImportPeerRegion(descriptor_);
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
  }

  void TearDown() override {
    // The writer first: its goodbye ends the receiver's export.
    writer_.reset();
    receiver_.reset();
  }

  absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

  // Declared before the transports so the memory outlives them.
  std::vector<uint8_t> source_bytes_;
  std::vector<uint8_t> original_destination_;
  DeviceBuffer source_;
  DeviceBuffer destination_;
  std::unique_ptr<NcclTransport> writer_;
  std::unique_ptr<NcclTransport> receiver_;
  RegionId source_region_ = 0;
  RegionId destination_region_ = 0;
  v1::MemoryRegionDescriptor descriptor_;
  PeerRegionId peer_ = 0;
};

TEST_F(NcclTwoGpuTest, WritesExactBytesOnlyWhereAskedAndTheNoticeFollows) {
  // Two runs that coalesce, a lone small extent, a large one.
  const std::vector<Extent> first = {{4096, 8192, 512},
                                     {4608, 8704, 512},
                                     {100, 3 << 20, 7},
                                     {1 << 20, 1 << 20, 1 << 20}};
  // More extents than one wire message carries, none coalescible.
  std::vector<Extent> second;
  for (uint64_t i = 0; i < NcclTransport::kMaxExtentsPerMessage + 904; ++i) {
    second.push_back({(8 << 20) + i * 64, (16 << 20) + i * 96, 48});
  }
  auto op1 = writer_->PostWrite({source_region_, peer_, first, Deadline()});
  ASSERT_TRUE(op1.ok()) << op1.status();
  auto op2 = writer_->PostWrite({source_region_, peer_, second, Deadline()});
  ASSERT_TRUE(op2.ok()) << op2.status();
  auto notice =
      writer_->PostNotice(peer_, "transfer-1", "all done", Deadline());
  ASSERT_TRUE(notice.ok()) << notice.status();

  absl::StatusOr<std::string> payload =
      receiver_->AwaitNotice("transfer-1", Deadline());
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, "all done");
  EXPECT_TRUE(writer_->Wait(*op1, Deadline()).ok());
  EXPECT_TRUE(writer_->Wait(*op2, Deadline()).ok());
  EXPECT_TRUE(writer_->Wait(*notice, Deadline()).ok());

  // The notice arrived, so every byte is in place: no synchronization.
  std::vector<uint8_t> expected = original_destination_;
  for (const std::vector<Extent>* extents :
       std::vector<const std::vector<Extent>*>{&first, &second}) {
    for (const Extent& e : *extents) {
      std::memcpy(expected.data() + e.remote_offset,
                  source_bytes_.data() + e.local_offset, e.length);
    }
  }
  EXPECT_TRUE(destination_.Download() == expected)
      << "destination bytes differ";
  EXPECT_EQ(writer_->Poll(*op1).status.code(), absl::StatusCode::kNotFound);
}

TEST_F(NcclTwoGpuTest, OneExportServesOneWriter) {
  EXPECT_EQ(writer_->ImportPeerRegion(descriptor_).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Out-of-bounds writes are refused before anything is sent.
  EXPECT_EQ(
      writer_
          ->PostWrite(
              {source_region_, peer_, {{0, kPoolBytes - 8, 16}}, Deadline()})
          .status()
          .code(),
      absl::StatusCode::kOutOfRange);
  // The source region is in use while a write is unfinished.
  auto op = writer_->PostWrite(
      {source_region_, peer_, {{0, 0, kPoolBytes}}, Deadline()});
  ASSERT_TRUE(op.ok()) << op.status();
  const absl::Status deregistered = writer_->DeregisterRegion(source_region_);
  if (!deregistered.ok()) {
    EXPECT_EQ(deregistered.code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(writer_->Wait(*op, Deadline()).ok());
}

TEST_F(NcclTwoGpuTest, FailsByTheDeadlineWhenTheReceiverIsGone) {
  // The receiver is destroyed (its communicator aborted) before the write is
  // posted, so the write cannot complete, however fast the link. Both ranks
  // live in this process: if NCCL's peer mapping of the receiver's freed
  // buffers faults, the write fails with UNAVAILABLE (CUDA error), which this
  // test accepts; a GPU-side fault here would be an NCCL matter, not ours.
  receiver_.reset();
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Seconds(2);
  // Larger than NCCL's connection buffers, so the send cannot complete into
  // them either.
  auto op = writer_->PostWrite(
      {source_region_, peer_, {{0, 0, kPoolBytes}}, deadline});
  ASSERT_TRUE(op.ok()) << op.status();
  const absl::Status status = writer_->Wait(*op, start + absl::Seconds(30));
  EXPECT_THAT(status.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                   absl::StatusCode::kUnavailable))
      << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2 + 3));
  // The peer is spent: later operations fail at once.
  auto notice = writer_->PostNotice(peer_, "k", "p", Deadline());
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_EQ(writer_->Wait(*notice, absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kUnavailable);
  // Once the aborted stream has drained, the source region is free again.
  absl::Status deregistered;
  for (int i = 0; i < 100; ++i) {
    deregistered = writer_->DeregisterRegion(source_region_);
    if (deregistered.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(deregistered.ok()) << deregistered;
}

}  // namespace
}  // namespace pdserve::kv_transfer

namespace pdserve::kv_transfer {
namespace {

// Linking :nccl_backend registers NCCL with the factory: asking for it now
// reaches NcclTransport (which, without a GPU, fails for that reason and not
// because the backend is missing).
TEST(NcclBackendRegistrationTest, TheFactoryReachesNcclTransport) {
  KvTransportConfig config;
  config.kind = v1::TRANSPORT_KIND_NCCL;
  absl::StatusOr<std::unique_ptr<KvTransport>> transport =
      CreateKvTransport(config);
  if (transport.ok()) {
    EXPECT_EQ((*transport)->kind(), v1::TRANSPORT_KIND_NCCL);
  } else {
    EXPECT_EQ(transport.status().code(), absl::StatusCode::kFailedPrecondition)
        << transport.status();
    EXPECT_THAT(std::string(transport.status().message()),
                ::testing::Not(HasSubstr("not built into this binary")));
  }
}

}  // namespace
}  // namespace pdserve::kv_transfer
