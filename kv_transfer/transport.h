// KvTransport: moving bytes of a KV pool into another process's KV pool.
//
// The interface names no transport. A backend (UCX, NCCL, in-process, or a
// decorator around one) is chosen by configuration (transport_factory.h).
//
// The model, after Mooncake/NIXL: register memory once, exchange descriptors
// once, then each transfer carries only extents.
//
//   receiver (decode worker)               writer (prefill worker)
//   RegisterRegion(pool) -> region id
//   ExportRegion(id) -> descriptor  ──────▶ ImportPeerRegion(descriptor)
//                                           PostWrite(extents...)   (per layer)
//                                           PostNotice(transfer_id, payload)
//   AwaitNotice(transfer_id) ◀────────────  (delivered after every byte of
//   verify checksum, use the KV             the writes posted before it)
//
// Every operation is non-blocking: PostWrite/PostNotice return an operation
// id at once, and Poll reports kInProgress until the operation has finished
// (or failed, or passed its deadline). "In progress" is a state, not an error.
// Where the destination is memory this process can address (in-process, or
// a peer's shared memory that UCX maps here) the copy is the whole transfer:
// PostWrite makes it on the caller's thread and returns a finished
// operation.
//
// Failure contract: an operation fails (never hangs) when the peer dies, the
// connection breaks, or its deadline passes; after a failed or cancelled
// write, bytes may still land in the remote region until the transport has
// torn down the connection, so the receiver must treat those blocks as
// quarantined (see ReleaseRequest.writes_quiesced in proto/worker.proto).
// A copy into mapped memory checks its deadline every megabyte and stops
// there. A write may succeed into the memory of a peer that has just died
// (the mapping outlives it), so the notice, not the write, is what tells a
// writer that its peer took the transfer; no byte ever reaches a process
// that replaced a dead peer (a new region is a new mapping).
//
// Thread-safety: every method may be called from any thread.
#ifndef PDSERVE_KV_TRANSFER_TRANSPORT_H_
#define PDSERVE_KV_TRANSFER_TRANSPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/kv_transfer.pb.h"

namespace pdserve::kv_transfer {

// Handles. 0 is never a valid id.
using RegionId = uint64_t;      // A registered local region.
using PeerRegionId = uint64_t;  // An imported remote region.
using OperationId = uint64_t;   // A posted write or notice.

// Copy `length` bytes at `local_offset` of a local region to `remote_offset`
// of a remote region (offsets from each region's start).
struct Extent {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;

  friend bool operator==(const Extent&, const Extent&) = default;
};

enum class OperationState { kInProgress, kDone, kFailed };

struct OperationStatus {
  OperationState state = OperationState::kInProgress;
  // OK when kDone; the failure when kFailed (DEADLINE_EXCEEDED, UNAVAILABLE
  // for a dead peer, CANCELLED, DATA_LOSS, ...).
  absl::Status status;
};

struct WriteRequest {
  RegionId local_region = 0;
  PeerRegionId remote_region = 0;
  // Written in any order; contiguous neighbours are coalesced.
  std::vector<Extent> extents;
  // The write fails with DEADLINE_EXCEEDED if not complete by then.
  absl::Time deadline = absl::InfiniteFuture();
};

// Memory a transport allocated and registered (KvTransport::AllocateRegion).
struct AllocatedRegion {
  RegionId id = 0;
  uint8_t* base = nullptr;  // Page-aligned and zero-filled.
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  virtual v1::TransportKind kind() const = 0;

  // Makes [base, base + length) writable by peers. For CUDA memory pass
  // v1::MEMORY_KIND_CUDA and the device ordinal.
  virtual absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t length,
                                                  v1::MemoryKind memory_kind,
                                                  int device_id) = 0;
  // Allocates `length` bytes of host memory that peers write into faster
  // than into memory passed to RegisterRegion, and registers them (UCX:
  // shared memory, which a writer on the same host maps and stores into
  // directly instead of sending the bytes through a connection).
  // DeregisterRegion frees the memory. UNIMPLEMENTED when the transport has
  // no such memory: allocate it yourself and RegisterRegion it.
  virtual absl::StatusOr<AllocatedRegion> AllocateRegion(uint64_t length) {
    return absl::UnimplementedError("this transport does not allocate regions");
  }
  // FAILED_PRECONDITION while operations on the region are in flight. Frees
  // the memory of a region from AllocateRegion.
  virtual absl::Status DeregisterRegion(RegionId region) = 0;

  // What a peer needs to write into `region` (opaque transport bytes plus
  // base and length), to be carried to the peer by the caller.
  virtual absl::StatusOr<v1::MemoryRegionDescriptor> ExportRegion(
      RegionId region) = 0;

  // Prepares writes into a peer's region (connects to the peer if needed).
  // INVALID_ARGUMENT for a descriptor of another transport or a malformed
  // one; UNAVAILABLE when the peer cannot be reached.
  virtual absl::StatusOr<PeerRegionId> ImportPeerRegion(
      const v1::MemoryRegionDescriptor& descriptor) = 0;
  virtual absl::Status ReleasePeerRegion(PeerRegionId peer) = 0;

  // Posts a write. Errors returned here are immediate (bad ids, extents out
  // of either region's bounds); everything later is reported by Poll/Wait.
  virtual absl::StatusOr<OperationId> PostWrite(
      const WriteRequest& request) = 0;

  // Posts a small notice (at most kMaxNoticeBytes) for the owner of
  // `remote_region`, delivered only after every write posted earlier to
  // that peer has completed remotely. The peer retrieves it by `key`.
  virtual absl::StatusOr<OperationId> PostNotice(PeerRegionId remote_region,
                                                 const std::string& key,
                                                 const std::string& payload,
                                                 absl::Time deadline) = 0;

  // The operation's state. Once an operation is reported done or failed, it
  // is forgotten; a later Poll of it answers NOT_FOUND (as kFailed).
  virtual OperationStatus Poll(OperationId op) = 0;

  // Blocks until the operation finishes or `deadline` passes. Returns the
  // operation's final status (and forgets it), or DEADLINE_EXCEEDED while it
  // is still in progress (it stays known and keeps running).
  virtual absl::Status Wait(OperationId op, absl::Time deadline) = 0;

  // Stops an operation; it finishes as CANCELLED (or as what it already
  // finished with). Idempotent. See the failure contract above about bytes
  // already in flight: the source region stays in use until they are done
  // (DeregisterRegion refuses until then), so its memory must outlive the
  // operation or the transport.
  virtual void Cancel(OperationId op) = 0;

  // Receiver side: the payload of the notice posted under `key`, waiting up
  // to `deadline`. DEADLINE_EXCEEDED if none arrives (for instance because
  // the writer died). Each notice is handed out once.
  virtual absl::StatusOr<std::string> AwaitNotice(const std::string& key,
                                                  absl::Time deadline) = 0;
};

// Notices carry a transfer's completion record (checksums), not data.
inline constexpr size_t kMaxNoticeBytes = 64 * 1024;

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_TRANSPORT_H_
