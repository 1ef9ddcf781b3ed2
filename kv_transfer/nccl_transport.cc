#include "kv_transfer/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"

namespace pdserve::kv_transfer {
namespace {

// --- Wire format ------------------------------------------------------------

// Ranks in every communicator: the region's owner receives, the writer
// sends.
constexpr int kReceiverRank = 0;
constexpr int kWriterRank = 1;

constexpr uint32_t kMagic = 0x564b4450;  // "PDKV" in memory (little-endian).
constexpr uint16_t kWireVersion = 1;

enum class MessageKind : uint16_t {
  kWrite = 1,
  kNotice = 2,
  kClose = 3,
  kHello = 4,  // Sets up the connection; no body.
};

// The fixed first message of every wire message. Host byte order: both ends
// are GPUs' hosts of one architecture.
struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;           // MessageKind.
  uint64_t sequence;       // 0, 1, 2, ... per communicator.
  uint64_t operation;      // The writer's operation id (for logs).
  uint64_t body_bytes;     // Size of the second message (0 for CLOSE).
  uint32_t extent_count;   // WRITE: WireExtents in the body.
  uint32_t key_bytes;      // NOTICE: key bytes at the start of the body.
  uint32_t payload_bytes;  // NOTICE: payload bytes after the key.
  uint32_t reserved[5];    // Zero.
};
static_assert(sizeof(WireHeader) == 64, "the header is 64 bytes on the wire");

struct WireExtent {
  uint64_t remote_offset;
  uint64_t length;
};
static_assert(sizeof(WireExtent) == 16);

constexpr size_t kHeaderBytes = sizeof(WireHeader);
constexpr size_t kMaxBodyBytes =
    std::max<size_t>(NcclTransport::kMaxExtentsPerMessage * sizeof(WireExtent),
                     NcclTransport::kMaxNoticeKeyBytes + kMaxNoticeBytes);
// One staging slot: header then body, rounded up to 4 KiB.
constexpr size_t kSlotBytes =
    (kHeaderBytes + kMaxBodyBytes + 4095) / 4096 * 4096;

// Extents are sent in pieces of at most this many bytes (both sides split
// the same way), keeping each NCCL message well inside its count limits.
constexpr uint64_t kMaxPieceBytes = uint64_t{1} << 30;

// How long a stream may take to empty after its communicator was aborted
// before its buffers are considered lost (leaked rather than reused).
constexpr absl::Duration kDrainTimeout = absl::Seconds(10);
// How long a released peer waits for its CLOSE message to be taken.
constexpr absl::Duration kCloseLinger = absl::Seconds(1);
// Longest pause between polls of a writer's in-flight messages.
constexpr absl::Duration kBusyPollCap = absl::Microseconds(100);

// --- Errors -----------------------------------------------------------------

absl::Status CudaError(absl::string_view what, cudaError_t error) {
  const std::string message =
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(error), ": ",
                   cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status NcclError(absl::string_view what, ncclResult_t result,
                       ncclComm_t comm) {
  std::string message =
      absl::StrCat(what, ": NCCL error: ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0')
    absl::StrAppend(&message, " (", last, ")");
  return absl::UnavailableError(message);
}

// Makes `device` current on this thread for the guard's lifetime.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Polling that starts at `min` and backs off to `max` while nothing happens.
class Backoff {
 public:
  Backoff(absl::Duration min, absl::Duration max)
      : min_(min), max_(std::max(min, max)), next_(min) {}
  void Sleep() {
    absl::SleepFor(next_);
    next_ = std::min(max_, next_ * 2);
  }
  void Reset() { next_ = min_; }

 private:
  const absl::Duration min_;
  const absl::Duration max_;
  absl::Duration next_;
};

// After an NCCL call on a non-blocking communicator: waits until the call has
// been carried out (the communicator leaves ncclInProgress), so that the next
// NCCL or CUDA call on its stream may follow. Fails at `deadline`, when
// `stop` is set, or on an NCCL error.
absl::Status AwaitComm(ncclComm_t comm, ncclResult_t result,
                       absl::string_view what, absl::Time deadline,
                       const std::atomic<bool>& stop, Backoff backoff) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return NcclError(what, result, comm);
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) return NcclError(what, query, comm);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(what, state, comm);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": still in progress at the deadline"));
    }
    if (stop.load())
      return absl::CancelledError(absl::StrCat(what, ": stopped"));
    backoff.Sleep();
  }
}

// OK while the communicator is healthy.
absl::Status CommHealth(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
  if (query != ncclSuccess) {
    return NcclError("ncclCommGetAsyncError", query, comm);
  }
  if (state != ncclSuccess && state != ncclInProgress) {
    return NcclError("communicator failed", state, comm);
  }
  return absl::OkStatus();
}

// Waits for the stream to empty (after an abort its NCCL kernels exit).
// False if it has not within `timeout`.
bool DrainStream(cudaStream_t stream, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  Backoff backoff(absl::Microseconds(50), absl::Milliseconds(5));
  while (true) {
    const cudaError_t status = cudaStreamQuery(stream);
    // Any answer but "not ready" means nothing will run on it any more.
    if (status != cudaErrorNotReady) return true;
    if (absl::Now() >= give_up) return false;
    backoff.Sleep();
  }
}

// Aborts `comm`: its kernels see the abort flag at once and exit. On a
// non-blocking communicator NCCL frees the rest in the background and answers
// ncclInProgress; the handle must not be used again either way.
void AbortComm(ncclComm_t& comm) {
  if (comm == nullptr) return;
  const ncclResult_t result = ncclCommAbort(comm);
  if (result != ncclSuccess && result != ncclInProgress) {
    PD_LOG(WARNING) << "ncclCommAbort: " << ncclGetErrorString(result);
  }
  comm = nullptr;
}

ncclUniqueId UniqueIdFromBytes(const std::string& bytes) {
  ncclUniqueId id;
  static_assert(sizeof(id.internal) == NCCL_UNIQUE_ID_BYTES);
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

// Both ends of a communicator: creates the non-blocking stream on `device`
// and joins the two-rank communicator `unique_id` as `rank`, waiting until
// the join is complete. On failure, *stream and *comm hold whatever was
// created, for the caller's usual cleanup.
absl::Status JoinCommunicator(int device, const std::string& unique_id,
                              int rank, absl::Time deadline,
                              const std::atomic<bool>& stop, Backoff backoff,
                              cudaStream_t* stream, ncclComm_t* comm) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError("cudaSetDevice", e);
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    *stream = nullptr;
    return CudaError("cudaStreamCreate", e);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t init = ncclCommInitRankConfig(
      comm, 2, UniqueIdFromBytes(unique_id), rank, &config);
  return AwaitComm(*comm, init,
                   absl::StrCat("ncclCommInitRankConfig (rank ", rank, ")"),
                   deadline, stop, backoff);
}

}  // namespace

// ---------------------------------------------------------------------------
// Internal state.

struct NcclTransport::Region {
  uint8_t* base = nullptr;
  uint64_t length = 0;
  int inflight = 0;  // Writer operations from this region not yet over.
};

// Staging slots: kSlotBytes of pinned host memory, the same of device memory
// and an event each, allocated once so that no CUDA allocation or free (which
// may synchronize the device) happens while communicators are live.
struct NcclTransport::Staging {
  int device = 0;
  int slots = 0;
  uint8_t* host = nullptr;
  uint8_t* device_memory = nullptr;
  std::vector<cudaEvent_t> events;

  absl::Mutex mutex;
  std::vector<int> free ABSL_GUARDED_BY(mutex);
  // A stream that used some slot never drained: its kernels may still
  // touch the buffers, which are then never freed.
  std::atomic<bool> leaked{false};

  uint8_t* host_slot(int slot) const { return host + slot * kSlotBytes; }
  uint8_t* device_slot(int slot) const {
    return device_memory + slot * kSlotBytes;
  }

  absl::Status Allocate(int device_ordinal, int slot_count) {
    device = device_ordinal;
    slots = slot_count;
    const size_t bytes = static_cast<size_t>(slots) * kSlotBytes;
    void* pointer = nullptr;
    cudaError_t status = cudaHostAlloc(&pointer, bytes, cudaHostAllocDefault);
    if (status != cudaSuccess) {
      return CudaError("allocating pinned staging memory", status);
    }
    host = static_cast<uint8_t*>(pointer);
    status = cudaMalloc(&pointer, bytes);
    if (status != cudaSuccess) {
      return CudaError("allocating device staging memory", status);
    }
    device_memory = static_cast<uint8_t*>(pointer);
    events.reserve(slots);
    for (int i = 0; i < slots; ++i) {
      cudaEvent_t event = nullptr;
      status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (status != cudaSuccess) return CudaError("cudaEventCreate", status);
      events.push_back(event);
    }
    absl::MutexLock lock(&mutex);
    for (int i = slots - 1; i >= 0; --i) free.push_back(i);
    return absl::OkStatus();
  }

  ~Staging() {
    if (host == nullptr && device_memory == nullptr && events.empty()) return;
    if (leaked.load()) {
      PD_LOG(ERROR) << "NCCL transport: not freeing staging buffers that a "
                       "stuck stream may still use";
      return;
    }
    ScopedDevice scoped(device);
    for (cudaEvent_t event : events) cudaEventDestroy(event);
    if (device_memory != nullptr) cudaFree(device_memory);
    if (host != nullptr) cudaFreeHost(host);
  }

  // A free slot, or -1. Exports keep kMaxSlotsPerPeer slots for writers.
  int Take(bool for_export) {
    absl::MutexLock lock(&mutex);
    const size_t reserve = for_export ? kMaxSlotsPerPeer : 0;
    if (free.size() <= reserve) return -1;
    const int slot = free.back();
    free.pop_back();
    return slot;
  }

  void Give(int slot) {
    absl::MutexLock lock(&mutex);
    free.push_back(slot);
  }
};

struct NcclTransport::Export {
  uint64_t id = 0;
  RegionId region = 0;
  uint8_t* base = nullptr;
  uint64_t length = 0;
  std::string unique_id;  // NCCL_UNIQUE_ID_BYTES.
  int slot = -1;
  std::atomic<bool> stop{false};
  std::atomic<bool> finished{false};
  std::thread thread;
};

struct NcclTransport::WriterOp {
  OperationId id = 0;
  MessageKind kind = MessageKind::kWrite;
  absl::Time deadline = absl::InfiniteFuture();
  // Writes.
  RegionId local_region = 0;
  uint8_t* local_base = nullptr;
  std::vector<Extent> extents;  // Coalesced.
  size_t next_extent = 0;       // First extent not yet sent.
  // Notices.
  std::string key;
  std::string payload;
  // Every message of the operation has been handed to the stream.
  bool fully_issued = false;
  // Some message has been handed to the stream (the GPU may touch the
  // source region).
  bool started = false;
};

struct NcclTransport::Peer {
  PeerRegionId id = 0;
  std::string unique_id;  // NCCL_UNIQUE_ID_BYTES.
  std::string label;      // For logs: the descriptor's region id.
  uint64_t remote_length = 0;
  std::thread thread;
  std::atomic<bool> stop{false};
  // Set by the worker once its communicator is up or has failed.
  absl::Notification connected;
  absl::Status connect_status;  // Written before `connected` is notified.

  absl::Mutex mutex;
  std::deque<std::unique_ptr<WriterOp>> queue ABSL_GUARDED_BY(mutex);
  // Non-OK once the communicator is gone: new operations fail with it.
  absl::Status failure ABSL_GUARDED_BY(mutex);
};

// ---------------------------------------------------------------------------
// Creation and destruction.

NcclTransport::NcclTransport(const NcclTransportOptions& options)
    : options_(options), staging_(std::make_unique<Staging>()) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    const NcclTransportOptions& options) {
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", options.device, " is negative"));
  }
  if (options.staging_slots <= kMaxSlotsPerPeer) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_slots must exceed ", kMaxSlotsPerPeer));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("connect_timeout must be positive");
  }
  auto transport = std::unique_ptr<NcclTransport>(new NcclTransport(options));
  PD_RETURN_IF_ERROR(transport->Start());
  return transport;
}

absl::Status NcclTransport::Start() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL transport needs a GPU: CUDA error ", cudaGetErrorName(status),
        ": ", cudaGetErrorString(status)));
  }
  if (count <= options_.device) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL transport needs CUDA device ", options_.device,
                     " but CUDA reports ", count, " device(s)"));
  }
  ScopedDevice scoped(options_.device);
  if (scoped.status() != cudaSuccess) {
    return CudaError(absl::StrCat("cudaSetDevice(", options_.device, ")"),
                     scoped.status());
  }
  PD_RETURN_IF_ERROR(
      staging_->Allocate(options_.device, options_.staging_slots));
  int version = 0;
  ncclGetVersion(&version);
  PD_LOG(INFO) << options_.name << ": NCCL transport on CUDA device "
               << options_.device << " (NCCL " << version << ")";
  return absl::OkStatus();
}

NcclTransport::~NcclTransport() {
  std::vector<std::shared_ptr<Peer>> peers;
  std::vector<std::unique_ptr<Export>> exports;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& [id, peer] : peers_) peers.push_back(std::move(peer));
    for (auto& [id, exported] : exports_)
      exports.push_back(std::move(exported));
    peers_.clear();
    exports_.clear();
    imported_ids_.clear();
  }
  // Signal every thread first, then join: teardowns run in parallel.
  for (auto& peer : peers) {
    absl::MutexLock lock(&peer->mutex);
    peer->stop.store(true);
  }
  for (auto& exported : exports) exported->stop.store(true);
  for (auto& peer : peers) {
    if (peer->thread.joinable()) peer->thread.join();
  }
  for (auto& exported : exports) {
    if (exported->thread.joinable()) exported->thread.join();
  }
  staging_.reset();  // Every stream using it has drained (or leaked it).
}

// ---------------------------------------------------------------------------
// Receiver side.

void NcclTransport::ServeLoop(Export* exported) {
  const std::string label =
      absl::StrCat(options_.name, " export ", exported->id, " (region ",
                   exported->region, ")");
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  const int slot = exported->slot;
  uint8_t* const host = staging_->host_slot(slot);
  uint8_t* const device = staging_->device_slot(slot);
  cudaEvent_t const event = staging_->events[slot];
  auto backoff = [&] {
    return Backoff(options_.poll_interval, options_.idle_poll_interval);
  };

  // Receives `bytes` into the slot at `offset` and copies them to the host
  // side of the slot, waiting (without a deadline: the writer decides when
  // to send) until they are there.
  auto receive = [&](size_t offset, size_t bytes) -> absl::Status {
    PD_RETURN_IF_ERROR(AwaitComm(
        comm,
        ncclRecv(device + offset, bytes, ncclUint8, kWriterRank, comm, stream),
        "ncclRecv", absl::InfiniteFuture(), exported->stop, backoff()));
    cudaError_t status = cudaMemcpyAsync(host + offset, device + offset, bytes,
                                         cudaMemcpyDeviceToHost, stream);
    if (status != cudaSuccess) return CudaError("cudaMemcpyAsync", status);
    status = cudaEventRecord(event, stream);
    if (status != cudaSuccess) return CudaError("cudaEventRecord", status);
    Backoff wait = backoff();
    while (true) {
      status = cudaEventQuery(event);
      if (status == cudaSuccess) return absl::OkStatus();
      if (status != cudaErrorNotReady)
        return CudaError("cudaEventQuery", status);
      PD_RETURN_IF_ERROR(CommHealth(comm));
      if (exported->stop.load()) return absl::CancelledError("export stopped");
      wait.Sleep();
    }
  };

  absl::Status status = [&]() -> absl::Status {
    absl::Status joined =
        JoinCommunicator(options_.device, exported->unique_id, kReceiverRank,
                         absl::Now() + options_.connect_timeout, exported->stop,
                         backoff(), &stream, &comm);
    if (absl::IsDeadlineExceeded(joined)) {
      return absl::DeadlineExceededError(
          absl::StrCat("no writer joined within ",
                       absl::FormatDuration(options_.connect_timeout)));
    }
    PD_RETURN_IF_ERROR(joined);
    PD_LOG(INFO) << label << ": writer joined";

    for (uint64_t sequence = 0;; ++sequence) {
      PD_RETURN_IF_ERROR(receive(0, kHeaderBytes));
      WireHeader header;
      std::memcpy(&header, host, sizeof(header));
      const auto kind = static_cast<MessageKind>(header.kind);
      auto protocol_error = [&](absl::string_view why) {
        return absl::DataLossError(absl::StrCat("protocol error in message ",
                                                sequence, " (operation ",
                                                header.operation, "): ", why));
      };
      if (header.magic != kMagic || header.version != kWireVersion) {
        return protocol_error(absl::StrCat("bad magic ", header.magic,
                                           " or version ", header.version));
      }
      if (header.sequence != sequence) {
        return protocol_error(
            absl::StrCat("sequence number ", header.sequence));
      }
      if (kind == MessageKind::kHello) {
        if (header.body_bytes != 0) return protocol_error("HELLO with a body");
        continue;
      }
      if (kind == MessageKind::kClose) {
        if (header.body_bytes != 0) return protocol_error("CLOSE with a body");
        PD_LOG(INFO) << label << ": writer closed the connection";
        return absl::OkStatus();
      }
      if (kind == MessageKind::kWrite) {
        if (header.extent_count == 0 ||
            header.extent_count > kMaxExtentsPerMessage ||
            header.body_bytes != header.extent_count * sizeof(WireExtent)) {
          return protocol_error(absl::StrCat("WRITE of ", header.extent_count,
                                             " extents in ", header.body_bytes,
                                             " bytes"));
        }
      } else if (kind == MessageKind::kNotice) {
        if (header.key_bytes == 0 || header.key_bytes > kMaxNoticeKeyBytes ||
            header.payload_bytes > kMaxNoticeBytes ||
            header.body_bytes !=
                uint64_t{header.key_bytes} + header.payload_bytes) {
          return protocol_error(absl::StrCat(
              "NOTICE of ", header.key_bytes, " key and ", header.payload_bytes,
              " payload bytes in ", header.body_bytes));
        }
      } else {
        return protocol_error(absl::StrCat("unknown kind ", header.kind));
      }

      PD_RETURN_IF_ERROR(receive(kHeaderBytes, header.body_bytes));
      const uint8_t* body = host + kHeaderBytes;
      if (kind == MessageKind::kNotice) {
        // Everything received before on this stream is complete, so every
        // byte of the earlier writes is in the region.
        mailbox_.Deliver(
            std::string(reinterpret_cast<const char*>(body), header.key_bytes),
            std::string(reinterpret_cast<const char*>(body) + header.key_bytes,
                        header.payload_bytes));
        continue;
      }
      std::vector<Extent> extents(header.extent_count);
      for (uint32_t i = 0; i < header.extent_count; ++i) {
        WireExtent wire;
        std::memcpy(&wire, body + i * sizeof(WireExtent), sizeof(wire));
        extents[i] = {0, wire.remote_offset, wire.length};
      }
      if (absl::Status bounds = ValidateExtents(
              extents, std::numeric_limits<uint64_t>::max(), exported->length);
          !bounds.ok()) {
        return protocol_error(bounds.message());
      }
      if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
        return NcclError("ncclGroupStart", r, comm);
      }
      ncclResult_t posted = ncclSuccess;
      for (const Extent& e : extents) {
        for (uint64_t done = 0; done < e.length && (posted == ncclSuccess ||
                                                    posted == ncclInProgress);
             done += kMaxPieceBytes) {
          posted = ncclRecv(exported->base + e.remote_offset + done,
                            std::min(kMaxPieceBytes, e.length - done),
                            ncclUint8, kWriterRank, comm, stream);
        }
      }
      const ncclResult_t ended = ncclGroupEnd();
      if (posted != ncclSuccess && posted != ncclInProgress) {
        return NcclError("ncclRecv", posted, comm);
      }
      // Completion is not awaited: the next header's receive follows these
      // on the stream.
      PD_RETURN_IF_ERROR(AwaitComm(comm, ended, "ncclGroupEnd (receive)",
                                   absl::InfiniteFuture(), exported->stop,
                                   backoff()));
    }
  }();

  if (status.ok() || absl::IsCancelled(status)) {
    PD_LOG(DEBUG) << label << ": ended (" << status << ")";
  } else if (absl::IsDataLoss(status)) {
    PD_LOG(ERROR) << label << ": " << status << "; aborting the communicator";
  } else {
    PD_LOG(WARNING) << label << ": " << status << "; aborting the communicator";
  }
  AbortComm(comm);
  bool drained = true;
  if (stream != nullptr) {
    drained = DrainStream(stream, kDrainTimeout);
    if (drained) {
      cudaStreamDestroy(stream);
    } else {
      PD_LOG(ERROR) << label << ": stream still busy "
                    << absl::FormatDuration(kDrainTimeout)
                    << " after ncclCommAbort; leaking its staging slot";
      staging_->leaked.store(true);
    }
  }
  if (drained) staging_->Give(slot);
  exported->finished.store(true);
}

void NcclTransport::ReapExports() {
  for (auto it = exports_.begin(); it != exports_.end();) {
    if (it->second->finished.load()) {
      it->second->thread.join();
      exports_.erase(it++);
    } else {
      ++it;
    }
  }
}

void NcclTransport::StopExport(Export* exported) {
  exported->stop.store(true);
  if (exported->thread.joinable()) exported->thread.join();
}

absl::StatusOr<v1::MemoryRegionDescriptor> NcclTransport::ExportRegion(
    RegionId region) {
  uint8_t* base = nullptr;
  uint64_t length = 0;
  {
    absl::MutexLock lock(&mutex_);
    ReapExports();
    auto it = regions_.find(region);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("no region ", region));
    }
    base = it->second->base;
    length = it->second->length;
  }
  const int slot = staging_->Take(/*for_export=*/true);
  if (slot < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.name, ": no staging slot left for another export (",
        options_.staging_slots, " slots; raise staging_slots)"));
  }
  ncclUniqueId unique_id;
  if (ncclResult_t r = ncclGetUniqueId(&unique_id); r != ncclSuccess) {
    staging_->Give(slot);
    return NcclError("ncclGetUniqueId", r, nullptr);
  }
  auto exported = std::make_unique<Export>();
  exported->region = region;
  exported->base = base;
  exported->length = length;
  exported->unique_id.assign(unique_id.internal, sizeof(unique_id.internal));
  exported->slot = slot;

  absl::MutexLock lock(&mutex_);
  if (!regions_.contains(region)) {  // Deregistered meanwhile.
    staging_->Give(slot);
    return absl::NotFoundError(absl::StrCat("no region ", region));
  }
  exported->id = next_id_++;
  Export* raw = exported.get();
  v1::MemoryRegionDescriptor descriptor;
  descriptor.set_transport(v1::TRANSPORT_KIND_NCCL);
  descriptor.set_region_id(
      absl::StrCat(options_.name, "/", ::getpid(), "#", region, "/", raw->id));
  descriptor.set_peer_address(raw->unique_id);
  descriptor.set_base_address(reinterpret_cast<uint64_t>(base));
  descriptor.set_length_bytes(length);
  descriptor.set_memory_kind(v1::MEMORY_KIND_CUDA);
  descriptor.set_device_id(options_.device);
  exports_[raw->id] = std::move(exported);
  raw->thread = std::thread([this, raw] { ServeLoop(raw); });
  return descriptor;
}

// ---------------------------------------------------------------------------
// Writer side.

void NcclTransport::ReleaseRegionUse(RegionId region) {
  absl::MutexLock lock(&mutex_);
  auto it = regions_.find(region);
  if (it != regions_.end()) --it->second->inflight;
}

void NcclTransport::PeerLoop(Peer* peer) {
  const std::string label =
      absl::StrCat(options_.name, " peer ", peer->id, " (", peer->label, ")");
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  auto backoff = [&] {
    return Backoff(options_.poll_interval, options_.idle_poll_interval);
  };

  // --- Serve posted operations.
  // Unfinished operations in posting order; ops[next_issue] is the first one
  // not fully handed to the stream.
  std::deque<std::unique_ptr<WriterOp>> ops;
  size_t next_issue = 0;
  struct Message {
    int slot;
    bool last;  // The last message of the oldest unfinished operation.
  };
  std::deque<Message> in_flight;  // Handed to the stream, in stream order.
  uint64_t sequence = 0;

  auto earliest_deadline = [&] {
    absl::Time earliest = absl::InfiniteFuture();
    for (const auto& op : ops) earliest = std::min(earliest, op->deadline);
    return earliest;
  };

  // Hands the next message of `op` to the stream, in staging slot `slot`;
  // waits for NCCL to take each call until `limit` at most.
  auto issue = [&](WriterOp* op, int slot, absl::Time limit,
                   const std::atomic<bool>& stop) -> absl::Status {
    uint8_t* const host = staging_->host_slot(slot);
    uint8_t* const device = staging_->device_slot(slot);
    uint8_t* const body = host + kHeaderBytes;
    WireHeader header = {};
    header.magic = kMagic;
    header.version = kWireVersion;
    header.kind = static_cast<uint16_t>(op->kind);
    header.sequence = sequence++;
    header.operation = op->id;
    const size_t first = op->next_extent;
    size_t count = 0;
    bool last = true;
    switch (op->kind) {
      case MessageKind::kWrite:
        count =
            std::min<size_t>(kMaxExtentsPerMessage, op->extents.size() - first);
        for (size_t i = 0; i < count; ++i) {
          const Extent& e = op->extents[first + i];
          const WireExtent wire = {e.remote_offset, e.length};
          std::memcpy(body + i * sizeof(WireExtent), &wire, sizeof(wire));
        }
        header.extent_count = static_cast<uint32_t>(count);
        header.body_bytes = count * sizeof(WireExtent);
        op->next_extent += count;
        last = op->next_extent == op->extents.size();
        break;
      case MessageKind::kNotice:
        std::memcpy(body, op->key.data(), op->key.size());
        std::memcpy(body + op->key.size(), op->payload.data(),
                    op->payload.size());
        header.key_bytes = static_cast<uint32_t>(op->key.size());
        header.payload_bytes = static_cast<uint32_t>(op->payload.size());
        header.body_bytes = op->key.size() + op->payload.size();
        break;
      case MessageKind::kClose:
      case MessageKind::kHello:
        break;
    }
    std::memcpy(host, &header, sizeof(header));
    op->started = true;
    op->fully_issued = last;
    // Recorded before the calls below, so that a failure part-way still
    // leaves the slot accounted for (released after the stream drains).
    in_flight.push_back({slot, last});

    cudaError_t e =
        cudaMemcpyAsync(device, host, kHeaderBytes + header.body_bytes,
                        cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return CudaError("cudaMemcpyAsync", e);
    PD_RETURN_IF_ERROR(AwaitComm(
        comm,
        ncclSend(device, kHeaderBytes, ncclUint8, kReceiverRank, comm, stream),
        "ncclSend (header)", limit, stop, backoff()));
    if (header.body_bytes > 0) {
      PD_RETURN_IF_ERROR(
          AwaitComm(comm,
                    ncclSend(device + kHeaderBytes, header.body_bytes,
                             ncclUint8, kReceiverRank, comm, stream),
                    "ncclSend (body)", limit, stop, backoff()));
    }
    if (op->kind == MessageKind::kWrite) {
      if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
        return NcclError("ncclGroupStart", r, comm);
      }
      ncclResult_t posted = ncclSuccess;
      for (size_t i = first; i < first + count; ++i) {
        const Extent& x = op->extents[i];
        for (uint64_t done = 0; done < x.length && (posted == ncclSuccess ||
                                                    posted == ncclInProgress);
             done += kMaxPieceBytes) {
          posted = ncclSend(op->local_base + x.local_offset + done,
                            std::min(kMaxPieceBytes, x.length - done),
                            ncclUint8, kReceiverRank, comm, stream);
        }
      }
      const ncclResult_t ended = ncclGroupEnd();
      if (posted != ncclSuccess && posted != ncclInProgress) {
        return NcclError("ncclSend", posted, comm);
      }
      PD_RETURN_IF_ERROR(AwaitComm(comm, ended, "ncclGroupEnd (send)", limit,
                                   stop, backoff()));
    }
    e = cudaEventRecord(staging_->events[slot], stream);
    if (e != cudaSuccess) return CudaError("cudaEventRecord", e);
    return absl::OkStatus();
  };

  // Completes the operations whose last message has left the stream.
  auto reap = [&](bool& progressed) -> absl::Status {
    while (!in_flight.empty()) {
      const Message& front = in_flight.front();
      const cudaError_t e = cudaEventQuery(staging_->events[front.slot]);
      if (e == cudaErrorNotReady) break;
      if (e != cudaSuccess) return CudaError("cudaEventQuery", e);
      const Message done = front;
      in_flight.pop_front();
      staging_->Give(done.slot);
      progressed = true;
      if (!done.last) continue;
      // Operations finish in stream order: this is the oldest one.
      std::unique_ptr<WriterOp> op = std::move(ops.front());
      ops.pop_front();
      --next_issue;
      operations_.Complete(op->id, absl::OkStatus());
      if (op->kind == MessageKind::kWrite) ReleaseRegionUse(op->local_region);
    }
    return absl::OkStatus();
  };

  // --- Connect.
  const absl::Time connect_by = absl::Now() + options_.connect_timeout;
  absl::Status status = [&]() -> absl::Status {
    PD_RETURN_IF_ERROR(JoinCommunicator(options_.device, peer->unique_id,
                                        kWriterRank, connect_by, peer->stop,
                                        backoff(), &stream, &comm));
    // HELLO sets up NCCL's point-to-point connection now (NCCL connects
    // lazily, on the first send), so that a data path that cannot work fails
    // the import rather than the first write.
    const int slot = staging_->Take(/*for_export=*/false);
    if (slot < 0) {
      return absl::ResourceExhaustedError("no staging slot for the handshake");
    }
    WriterOp hello;
    hello.kind = MessageKind::kHello;
    PD_RETURN_IF_ERROR(issue(&hello, slot, connect_by, peer->stop));
    Backoff wait = backoff();
    while (true) {
      const cudaError_t e = cudaEventQuery(staging_->events[slot]);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return CudaError("cudaEventQuery", e);
      PD_RETURN_IF_ERROR(CommHealth(comm));
      if (absl::Now() >= connect_by) {
        return absl::DeadlineExceededError("handshake still in flight");
      }
      wait.Sleep();
    }
    in_flight.clear();
    staging_->Give(slot);
    return absl::OkStatus();
  }();
  if (absl::IsDeadlineExceeded(status)) {
    status = absl::DeadlineExceededError(
        absl::StrCat("cannot connect to the receiver of ", peer->label,
                     " within ", absl::FormatDuration(options_.connect_timeout),
                     ": ", status.message()));
  }
  if (!status.ok()) {
    PD_LOG(WARNING) << label << ": " << status;
  }
  peer->connect_status = status;
  peer->connected.Notify();

  bool stopping = false;
  Backoff busy(options_.poll_interval,
               std::min(kBusyPollCap, options_.idle_poll_interval));
  while (status.ok()) {
    {
      absl::MutexLock lock(&peer->mutex);
      if (ops.empty() && in_flight.empty()) {
        auto has_work = [peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer->mutex) {
          return !peer->queue.empty() || peer->stop.load();
        };
        peer->mutex.AwaitWithTimeout(absl::Condition(&has_work),
                                     absl::Milliseconds(100));
      }
      while (!peer->queue.empty()) {
        ops.push_back(std::move(peer->queue.front()));
        peer->queue.pop_front();
      }
      stopping = peer->stop.load();
    }
    if (stopping) break;

    bool progressed = false;
    status = reap(progressed);
    if (!status.ok()) break;
    if (!in_flight.empty()) {
      status = CommHealth(comm);
      if (!status.ok()) break;
    }
    if (earliest_deadline() <= absl::Now()) {
      status = absl::DeadlineExceededError("an operation passed its deadline");
      break;
    }
    while (next_issue < ops.size() && in_flight.size() < kMaxSlotsPerPeer) {
      const int slot = staging_->Take(/*for_export=*/false);
      if (slot < 0) break;  // Retried once other peers return slots.
      WriterOp* op = ops[next_issue].get();
      status = issue(op, slot, earliest_deadline(), peer->stop);
      if (!status.ok()) break;
      progressed = true;
      if (op->fully_issued) ++next_issue;
    }
    if (!status.ok()) break;
    if (progressed) {
      busy.Reset();
    } else if (!in_flight.empty() || next_issue < ops.size()) {
      busy.Sleep();
    }
  }
  stopping = stopping || peer->stop.load();

  // --- Tear down. A stopped, healthy and idle peer says goodbye first, so
  // the receiver's export ends at once.
  WriterOp close;
  if (stopping && status.ok() && ops.empty() && in_flight.empty() &&
      comm != nullptr) {
    const int slot = staging_->Take(/*for_export=*/false);
    if (slot >= 0) {
      close.kind = MessageKind::kClose;
      const absl::Time give_up = absl::Now() + kCloseLinger;
      const std::atomic<bool> never{false};
      if (issue(&close, slot, give_up, never).ok()) {
        Backoff wait = backoff();
        while (absl::Now() < give_up &&
               cudaEventQuery(staging_->events[slot]) == cudaErrorNotReady) {
          wait.Sleep();
        }
      }
    }
  }

  // Why every unfinished operation fails (each one past its deadline fails
  // with DEADLINE_EXCEEDED instead).
  absl::Status why;
  if (stopping) {
    why = absl::CancelledError(
        absl::StrCat(label, ": peer region released or transport shut down"));
  } else if (absl::IsDeadlineExceeded(status)) {
    why = absl::UnavailableError(absl::StrCat(
        label,
        ": communicator aborted after an operation passed its deadline"));
  } else {
    why = absl::UnavailableError(absl::StrCat(label, ": ", status.message()));
  }
  if (!stopping && peer->connected.HasBeenNotified() &&
      peer->connect_status.ok()) {
    PD_LOG(WARNING) << label << ": " << status << "; aborting the communicator";
  }

  // Report first (the failure is known now; draining may take a while), and
  // fail everything posted from now on.
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&peer->mutex);
    peer->failure = why;
    while (!peer->queue.empty()) {
      ops.push_back(std::move(peer->queue.front()));
      peer->queue.pop_front();
    }
  }
  for (const auto& op : ops) {
    if (op->deadline <= now && !stopping) {
      operations_.Complete(op->id, absl::DeadlineExceededError(absl::StrCat(
                                       "operation ", op->id,
                                       " did not complete by its deadline")));
    } else {
      operations_.Complete(op->id, why);
    }
  }

  AbortComm(comm);
  bool drained = true;
  if (stream != nullptr) {
    drained = DrainStream(stream, kDrainTimeout);
    if (drained) {
      cudaStreamDestroy(stream);
    } else {
      PD_LOG(ERROR) << label << ": stream still busy "
                    << absl::FormatDuration(kDrainTimeout)
                    << " after ncclCommAbort; leaking its staging slots and "
                       "keeping its source regions in use";
      staging_->leaked.store(true);
    }
  }
  if (drained) {
    for (const Message& message : in_flight) staging_->Give(message.slot);
  }
  in_flight.clear();
  // A started write's sends may read its source region until the stream has
  // drained: keep the region in use otherwise.
  for (const auto& op : ops) {
    if (op->kind == MessageKind::kWrite && (drained || !op->started)) {
      ReleaseRegionUse(op->local_region);
    }
  }
}

void NcclTransport::StopPeer(Peer* peer) {
  {
    absl::MutexLock lock(&peer->mutex);
    peer->stop.store(true);
  }
  if (peer->thread.joinable()) peer->thread.join();
}

absl::StatusOr<PeerRegionId> NcclTransport::ImportPeerRegion(
    const v1::MemoryRegionDescriptor& descriptor) {
  if (descriptor.transport() != v1::TRANSPORT_KIND_NCCL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "descriptor is for transport ",
        v1::TransportKind_Name(descriptor.transport()), ", not NCCL"));
  }
  if (descriptor.peer_address().size() != NCCL_UNIQUE_ID_BYTES ||
      descriptor.length_bytes() == 0 ||
      descriptor.memory_kind() != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL descriptor ", descriptor.region_id(), " needs a ",
        NCCL_UNIQUE_ID_BYTES, "-byte unique id (has ",
        descriptor.peer_address().size(), " bytes), a length and CUDA memory"));
  }
  auto peer = std::make_shared<Peer>();
  peer->unique_id = descriptor.peer_address();
  peer->label = descriptor.region_id();
  peer->remote_length = descriptor.length_bytes();
  {
    absl::MutexLock lock(&mutex_);
    if (!imported_ids_.insert(peer->unique_id).second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NCCL descriptor ", descriptor.region_id(),
          " is already imported: each writer needs its own ExportRegion"));
    }
    peer->id = next_id_++;
  }
  peer->thread = std::thread([this, raw = peer.get()] { PeerLoop(raw); });
  peer->connected.WaitForNotification();
  if (!peer->connect_status.ok()) {
    StopPeer(peer.get());
    absl::MutexLock lock(&mutex_);
    imported_ids_.erase(peer->unique_id);
    return peer->connect_status;
  }
  PD_LOG(INFO) << options_.name << ": connected to " << peer->label
               << " as peer region " << peer->id;
  absl::MutexLock lock(&mutex_);
  const PeerRegionId id = peer->id;
  peers_[id] = std::move(peer);
  return id;
}

absl::Status NcclTransport::ReleasePeerRegion(PeerRegionId id) {
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mutex_);
    auto it = peers_.find(id);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("no peer region ", id));
    }
    peer = std::move(it->second);
    peers_.erase(it);
  }
  StopPeer(peer.get());
  absl::MutexLock lock(&mutex_);
  imported_ids_.erase(peer->unique_id);
  return absl::OkStatus();
}

absl::StatusOr<OperationId> NcclTransport::Enqueue(
    const std::shared_ptr<Peer>& peer, std::unique_ptr<WriterOp> op,
    absl::Time deadline) {
  const bool is_write = op->kind == MessageKind::kWrite;
  const RegionId local_region = op->local_region;
  absl::Status failure;
  OperationId id = 0;
  {
    absl::MutexLock lock(&peer->mutex);
    id = operations_.Add();
    op->id = id;
    op->deadline = deadline;
    failure = peer->failure;
    if (failure.ok()) peer->queue.push_back(std::move(op));
  }
  if (!failure.ok()) {
    // The communicator is gone: reported through Poll/Wait like any failure.
    operations_.Complete(id, failure);
    if (is_write) ReleaseRegionUse(local_region);
  }
  return id;
}

absl::StatusOr<OperationId> NcclTransport::PostWrite(
    const WriteRequest& request) {
  auto op = std::make_unique<WriterOp>();
  op->kind = MessageKind::kWrite;
  op->local_region = request.local_region;
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mutex_);
    auto local = regions_.find(request.local_region);
    if (local == regions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no local region ", request.local_region));
    }
    auto remote = peers_.find(request.remote_region);
    if (remote == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", request.remote_region));
    }
    PD_RETURN_IF_ERROR(ValidateExtents(request.extents, local->second->length,
                                       remote->second->remote_length));
    if (request.extents.empty()) {
      // Nothing to move: done at once.
      const OperationId id = operations_.Add();
      operations_.Complete(id, absl::OkStatus());
      return id;
    }
    peer = remote->second;
    op->local_base = local->second->base;
    ++local->second->inflight;  // Until the operation is over.
  }
  op->extents = CoalesceExtents(request.extents);
  return Enqueue(peer, std::move(op), request.deadline);
}

absl::StatusOr<OperationId> NcclTransport::PostNotice(
    PeerRegionId remote_region, const std::string& key,
    const std::string& payload, absl::Time deadline) {
  if (payload.size() > kMaxNoticeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notice of ", payload.size(), " bytes exceeds ", kMaxNoticeBytes));
  }
  if (key.empty()) return absl::InvalidArgumentError("notice key is empty");
  if (key.size() > kMaxNoticeKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notice key of ", key.size(), " bytes exceeds ", kMaxNoticeKeyBytes));
  }
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mutex_);
    auto it = peers_.find(remote_region);
    if (it == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", remote_region));
    }
    peer = it->second;
  }
  auto op = std::make_unique<WriterOp>();
  op->kind = MessageKind::kNotice;
  op->key = key;
  op->payload = payload;
  return Enqueue(peer, std::move(op), deadline);
}

// ---------------------------------------------------------------------------
// Regions.

absl::StatusOr<RegionId> NcclTransport::RegisterRegion(
    void* base, uint64_t length, v1::MemoryKind memory_kind, int device_id) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("cannot register an empty region");
  }
  if (memory_kind != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the NCCL transport moves CUDA device memory only, not ",
        v1::MemoryKind_Name(memory_kind),
        " memory (use the UCX or in-process transport for host memory)"));
  }
  if (device_id != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region is on CUDA device ", device_id,
        " but this NCCL transport serves device ", options_.device));
  }
  // Both ends must be device memory of our device.
  for (const uint8_t* address :
       {static_cast<const uint8_t*>(base),
        static_cast<const uint8_t*>(base) + (length - 1)}) {
    cudaPointerAttributes attributes = {};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, address);
    if (status != cudaSuccess) {
      cudaGetLastError();  // Not sticky; clear it.
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot inspect the region's memory: CUDA error ",
          cudaGetErrorName(status), ": ", cudaGetErrorString(status)));
    }
    if (attributes.type != cudaMemoryTypeDevice ||
        attributes.device != options_.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region [", reinterpret_cast<uintptr_t>(base), ", +", length,
          ") is not device memory of CUDA device ", options_.device,
          " (memory type ", static_cast<int>(attributes.type), ", device ",
          attributes.device, ")"));
    }
  }
  auto region = std::make_unique<Region>();
  region->base = static_cast<uint8_t*>(base);
  region->length = length;
  absl::MutexLock lock(&mutex_);
  const RegionId id = next_id_++;
  regions_[id] = std::move(region);
  return id;
}

absl::Status NcclTransport::DeregisterRegion(RegionId region) {
  std::vector<std::unique_ptr<Export>> ending;
  {
    absl::MutexLock lock(&mutex_);
    auto it = regions_.find(region);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("no region ", region));
    }
    if (it->second->inflight > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("region ", region, " has ", it->second->inflight,
                       " writes in flight"));
    }
    regions_.erase(it);
    for (auto e = exports_.begin(); e != exports_.end();) {
      if (e->second->region == region) {
        ending.push_back(std::move(e->second));
        exports_.erase(e++);
      } else {
        ++e;
      }
    }
  }
  // The caller may free the memory once this returns: end its exports (and
  // their receives into it) first.
  for (auto& exported : ending) exported->stop.store(true);
  for (auto& exported : ending) StopExport(exported.get());
  return absl::OkStatus();
}

}  // namespace pdserve::kv_transfer
