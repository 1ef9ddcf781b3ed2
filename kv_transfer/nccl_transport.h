// NcclTransport: KvTransport over NCCL point-to-point (ncclSend/ncclRecv),
// for moving KV blocks from one GPU's memory straight into another's.
//
// Only CUDA device memory on the transport's device (options.device) can be
// registered; host memory is INVALID_ARGUMENT (use UCX or in-process).
//
// NCCL is two-sided and the interface is one-sided, so both sides run a
// small protocol on a private two-rank communicator:
//
//   receiver (owner of the region)          writer
//   ExportRegion(region)
//     ncclGetUniqueId, start a serve
//     thread that joins as rank 0  ──id──▶  ImportPeerRegion(descriptor)
//                                             joins as rank 1, starts a
//                                             worker thread for the peer
//
// The descriptor's peer_address is the 128-byte ncclUniqueId; remote_key is
// empty; base_address/length_bytes bound the writes.
//
// ONE EXPORT SERVES ONE WRITER. Each writer needs its own ExportRegion call
// (each makes a fresh communicator); a second import of the same descriptor
// is refused in this process and fails to connect from another. Exporting a
// region several times is how several writers write into it. An export is
// spent when its communicator ends (its writer released it, failed, or did
// not connect within connect_timeout): export again for a new writer.
// Both ranks of a communicator must be on different GPUs (NCCL refuses two
// ranks on one device), so writer and receiver use different devices.
//
// Wire protocol (per communicator, writer -> receiver, in stream order):
//   1. a 64-byte header: magic "PDKV", version, kind (HELLO, WRITE, NOTICE
//      or CLOSE), message sequence number (0, 1, 2, ... per communicator),
//      operation id, body size, and the extent count (WRITE) or key and
//      payload sizes (NOTICE);
//   2. for WRITE and NOTICE, a body of exactly the announced size: WRITE,
//      an array of {remote_offset, length} (2 x uint64, host byte order);
//      NOTICE, the key bytes followed by the payload bytes;
//   3. WRITE only: one ncclSend per extent (extents over 1 GiB in 1 GiB
//      pieces), from local base + local_offset, inside one
//      ncclGroupStart/End; the receiver posts the matching ncclRecv into
//      region base + remote_offset in one group, in the same order.
// HELLO (message 0, sent by ImportPeerRegion) makes NCCL set up its
// point-to-point connection before the import returns; CLOSE (sent when an
// idle peer is released) ends the receiver's export. A write with more than
// kMaxExtentsPerMessage coalesced extents goes as several such messages.
// The receiver checks every header and body before receiving anything into
// the region (magic, version, sequence, sizes, every extent inside the
// exported region); a violation is a protocol error: it logs it and aborts
// the communicator (the writer's operations then fail).
// Headers and bodies pass through small staging buffers (device memory for
// NCCL, pinned host memory for the CPU side), allocated once in Create().
//
// Completion: a write is done when its sends have completed on the writer's
// stream (CUDA event); a notice is done when its body was sent. Since one
// stream carries everything to a peer, the receiver delivers a notice (to
// AwaitNotice) only after every receive posted before it has completed, i.e.
// after every byte of the earlier writes is in its region. The notice, not
// the writer's "done", is the end-to-end proof: NCCL may complete a small
// send once the bytes sit in the receiver's NCCL buffers.
//
// Failures: communicators are non-blocking (ncclConfig_t.blocking = 0); the
// threads poll CUDA events and ncclCommGetAsyncError and never block in a
// CUDA synchronize. An operation past its deadline, or an asynchronous NCCL
// error, aborts the peer's communicator (ncclCommAbort) and fails every
// operation on it: DEADLINE_EXCEEDED for the overdue one, UNAVAILABLE for
// the rest; later operations on that peer fail at once with UNAVAILABLE
// (release it and import a fresh export). Cancel only marks an operation
// CANCELLED: bytes already posted may still land (see transport.h), and the
// source region stays in use until the sends are over.
//
// Caveat for the owning process: while an export waits for its writer's next
// message, a receive kernel is pending on the export's stream (a
// cudaStreamNonBlocking stream, so the legacy default stream does not wait
// for it). Device-wide synchronization (cudaDeviceSynchronize, and cudaFree,
// which synchronizes the device) waits for that kernel, i.e. until the writer
// sends or the export ends. Allocate device memory up front (or with the
// stream-ordered allocator) in processes that export. For the same reason
// NCCL warns that several communicators on one device can deadlock when one
// of them makes a device-synchronizing call; the transport itself allocates
// and frees its CUDA memory only in Create() and the destructor.
//
// Ownership: registered memory stays the caller's and must outlive its
// registration; a source region also outlives its operations (DeregisterRegion
// refuses while any is unfinished). DeregisterRegion of a receiver region ends
// its exports first (their writers' operations then fail).
//
// Thread-safety: all public methods are thread-safe. Destruction must not
// race with other calls; the destructor aborts every communicator, stops
// every thread and frees what the transport allocated, within a bounded time.
//
// This header is plain C++: CUDA and NCCL appear only in the transport's
// private files (nccl_*.cc and the nccl_*.h headers other than this one).
#ifndef PDSERVE_KV_TRANSFER_NCCL_TRANSPORT_H_
#define PDSERVE_KV_TRANSFER_NCCL_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kv_transfer/transport.h"
#include "kv_transfer/transport_base.h"

namespace pdserve::kv_transfer {

struct NcclTransportOptions {
  // CUDA ordinal of the GPU whose memory this transport moves.
  int device = 0;
  // Names this transport in logs and region ids.
  std::string name = "nccl";
  // How long communicator setup may take: ImportPeerRegion fails after it,
  // and an export whose writer has not joined by then is abandoned.
  absl::Duration connect_timeout = absl::Seconds(30);
  // Polling of CUDA events and NCCL state: the interval while work is in
  // flight, growing up to idle_poll_interval while a thread waits for work.
  absl::Duration poll_interval = absl::Microseconds(10);
  absl::Duration idle_poll_interval = absl::Microseconds(500);
  // Staging buffers (each about 68 KiB of device plus 68 KiB of pinned host
  // memory): one per live export, up to kMaxSlotsPerPeer per writing peer.
  int staging_slots = 64;
};

class NcclTransport final : public TransportBase {
 public:
  // Messages a writer may have in flight per peer.
  static constexpr int kMaxSlotsPerPeer = 8;
  // Extents per wire message; larger writes go as several messages.
  static constexpr uint32_t kMaxExtentsPerMessage = 4096;
  // Longest notice key.
  static constexpr uint32_t kMaxNoticeKeyBytes = 1024;

  // FAILED_PRECONDITION (with CUDA's error text) when there is no usable
  // GPU or driver; INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      const NcclTransportOptions& options);
  ~NcclTransport() override;

  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  v1::TransportKind kind() const override { return v1::TRANSPORT_KIND_NCCL; }
  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t length,
                                          v1::MemoryKind memory_kind,
                                          int device_id) override;
  absl::Status DeregisterRegion(RegionId region) override;
  absl::StatusOr<v1::MemoryRegionDescriptor> ExportRegion(
      RegionId region) override;
  // Blocks until the communicator is up and the HELLO has been sent (at most
  // connect_timeout): DEADLINE_EXCEEDED if not, UNAVAILABLE on an NCCL error.
  // FAILED_PRECONDITION if this transport already imported the descriptor.
  absl::StatusOr<PeerRegionId> ImportPeerRegion(
      const v1::MemoryRegionDescriptor& descriptor) override;
  // Ends the communicator (gracefully when idle: the receiver's export then
  // ends too). Unfinished operations on it fail with CANCELLED.
  absl::Status ReleasePeerRegion(PeerRegionId peer) override;
  absl::StatusOr<OperationId> PostWrite(const WriteRequest& request) override;
  absl::StatusOr<OperationId> PostNotice(PeerRegionId remote_region,
                                         const std::string& key,
                                         const std::string& payload,
                                         absl::Time deadline) override;

 private:
  // Defined in nccl_transport_state.h.
  struct Region;
  struct Staging;   // The staging buffers (CUDA), shared by all threads.
  struct Export;    // Receiver side: one communicator and serve thread.
  struct Peer;      // Writer side: one communicator and worker thread.
  struct WriterOp;  // A posted write or notice, owned by its peer's thread.
  // What each thread runs: an export's (nccl_export_receiver.h) and a
  // peer's (nccl_peer_writer.h).
  class ExportReceiver;
  class PeerWriter;

  explicit NcclTransport(const NcclTransportOptions& options);
  absl::Status Start();

  // Stops an export's or a peer's thread and waits for it.
  void StopExport(Export* exported);
  void StopPeer(Peer* peer);
  // Joins exports whose serve thread has ended.
  void ReapExports() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A writer operation is over: its local region is no longer in use.
  void ReleaseRegionUse(RegionId region);
  // Hands `op` to `peer`'s thread (or fails it at once if the peer's
  // communicator is gone).
  absl::StatusOr<OperationId> Enqueue(const std::shared_ptr<Peer>& peer,
                                      std::unique_ptr<WriterOp> op,
                                      absl::Time deadline);

  const NcclTransportOptions options_;
  std::unique_ptr<Staging> staging_;

  absl::Mutex mutex_;
  uint64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  absl::flat_hash_map<RegionId, std::unique_ptr<Region>> regions_
      ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Export>> exports_
      ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<PeerRegionId, std::shared_ptr<Peer>> peers_
      ABSL_GUARDED_BY(mutex_);
  // Unique ids imported by live peers (one writer per export).
  absl::flat_hash_set<std::string> imported_ids_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_NCCL_TRANSPORT_H_
