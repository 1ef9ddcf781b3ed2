// UcxTransport: KvTransport over UCX (UCP), the default between processes.
//
// One UCP context and worker per transport (one per process in practice),
// driven by one progress thread that makes every UCX call: the public methods
// hand it commands and either wait for the answer (registration, import:
// rare, short) or return at once (writes, notices). UCX itself therefore runs
// single-threaded (UCS_THREAD_MODE_SERIALIZED, never concurrent) with no
// lock contention.
//
// Data path, two ways:
//   - Direct stores, on one host. A region from AllocateRegion is shared
//     memory UCX allocated (System V or POSIX; UCX_ALLOC_PRIO decides). A
//     writer whose process shares the owner's shared-memory domain (boot id,
//     IPC and PID namespaces: MemoryRegionDescriptor.shared_memory_domain)
//     maps it when it imports the region (ucp_rkey_ptr on the unpacked
//     rkey), and PostWrite copies the extents into the mapping on the
//     caller's thread: no hand-off, no progress thread, the speed of memcpy.
//   - Puts, otherwise (another host, another namespace, a registered
//     region, CUDA memory): ucp_put_nbx per coalesced extent from the
//     registered local region into the peer's region, then ucp_ep_flush_nbx;
//     a write is done when the flush completes, i.e. when the bytes are in
//     the remote memory.
// A notice is an active message sent after a flush of the same endpoint, so
// it arrives after every byte of the writes posted before it.
//
// Failures: endpoints use UCP_ERR_HANDLING_MODE_PEER with an error handler,
// so a dead peer fails the pending operations (UNAVAILABLE) instead of
// hanging them. UCX 1.13 (and 1.22, the newest packaged) offers peer error
// handling only on TCP and RDMA lanes, never on shared memory: endpoints
// between two processes on one host run over TCP loopback, which carries
// the notices and detects a dead peer, while the bytes go through the
// mapping. A connection failure unmaps the peer's regions (after any copy
// into them has finished: the caller's copies hold bounds_mutex_), so no
// store reaches a dead peer's memory after its death is known, and a
// restarted peer is a new region and a new mapping. An operation past its
// deadline fails with DEADLINE_EXCEEDED and its endpoint is force-closed
// (the peer is stalled or gone), which also guarantees no later put of it
// lands; a copy stops at its deadline too. The next operation to that peer
// reconnects. Cancel only marks the operation cancelled: bytes already
// posted may still land (see transport.h).
//
// Transports are left to UCX (set UCX_TLS to restrict them, e.g. tcp, or to
// rc/dc for RDMA: docs/kv_transfer.md); the lanes each endpoint uses and
// whether a peer region is stored into directly are logged, so a fallback
// is visible. Nothing here is host-only: CUDA regions are registered with
// their memory type, and RDMA transports are used where UCX finds them.
//
// Thread-safety: all public methods are thread-safe. Destruction must not
// race with other calls.
#ifndef PDSERVE_KV_TRANSFER_UCX_TRANSPORT_H_
#define PDSERVE_KV_TRANSFER_UCX_TRANSPORT_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/transport.h"
#include "kv_transfer/transport_base.h"

namespace pdserve::kv_transfer {

struct UcxTransportOptions {
  // Names this transport in logs and region ids.
  std::string name = "ucx";
  // While no operation is in flight the progress thread sleeps on UCX's
  // wakeup events; this bounds the sleep for transports without events.
  absl::Duration idle_poll_interval = absl::Milliseconds(1);
};

class UcxTransport final : public TransportBase {
 public:
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(
      const UcxTransportOptions& options);
  ~UcxTransport() override;

  v1::TransportKind kind() const override { return v1::TRANSPORT_KIND_UCX; }
  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t length,
                                          v1::MemoryKind memory_kind,
                                          int device_id) override;
  absl::StatusOr<AllocatedRegion> AllocateRegion(uint64_t length) override;
  absl::Status DeregisterRegion(RegionId region) override;
  absl::StatusOr<v1::MemoryRegionDescriptor> ExportRegion(
      RegionId region) override;
  absl::StatusOr<PeerRegionId> ImportPeerRegion(
      const v1::MemoryRegionDescriptor& descriptor) override;
  absl::Status ReleasePeerRegion(PeerRegionId peer) override;
  absl::StatusOr<OperationId> PostWrite(const WriteRequest& request) override;
  absl::StatusOr<OperationId> PostNotice(PeerRegionId remote_region,
                                         const std::string& key,
                                         const std::string& payload,
                                         absl::Time deadline) override;

  // The UCX lanes (transports and devices) used to reach `peer`'s process,
  // e.g. "rma_bw: posix/memory; am: tcp/lo".
  absl::StatusOr<std::string> DescribeConnection(PeerRegionId peer);

  // Counts of live UCX resources, for leak tests.
  struct ResourceCounts {
    size_t regions = 0;
    size_t peer_regions = 0;
    size_t connections = 0;
    size_t pending_operations = 0;
  };
  ResourceCounts resource_counts();

 private:
  // Everything UCX; touched only on the progress thread. Defined in
  // ucx_transport_state.h, which also says which file does what.
  struct State;

  explicit UcxTransport(const UcxTransportOptions& options);
  absl::Status Start();
  // Registers [base, base + length), or allocates `length` bytes when base
  // is null, and packs the region's remote key.
  absl::StatusOr<AllocatedRegion> MapRegion(void* base, uint64_t length,
                                            v1::MemoryKind memory_kind,
                                            int device_id);

  // Runs `command` on the progress thread; RunAndWait blocks until it ran.
  void Enqueue(std::function<void(State&)> command);
  void RunAndWait(std::function<void(State&)> command);
  // Wakes the progress thread from its idle sleep.
  void Wake();
  void ProgressLoop();

  const UcxTransportOptions options_;
  std::unique_ptr<State> state_;
  std::thread progress_thread_;
  int wake_fd_ = -1;  // eventfd: new commands.

  // What PostWrite needs without a round trip to the progress thread: the
  // bounds of live regions, and where a peer region is mapped into this
  // process. Direct stores run on the caller's thread under a reader lock;
  // the progress thread changes a mapping only under the writer lock, so it
  // never unmaps memory a caller is storing into.
  struct LocalBounds {
    uint64_t length = 0;
    uint8_t* host_base = nullptr;  // Null for CUDA memory.
  };
  struct PeerBounds {
    uint64_t length = 0;
    uint8_t* direct = nullptr;  // State::PeerRegion::direct, when mapped.
  };
  absl::Mutex bounds_mutex_;
  absl::flat_hash_map<RegionId, LocalBounds> local_bounds_
      ABSL_GUARDED_BY(bounds_mutex_);
  absl::flat_hash_map<PeerRegionId, PeerBounds> peer_bounds_
      ABSL_GUARDED_BY(bounds_mutex_);

  absl::Mutex queue_mutex_;
  std::deque<std::function<void(State&)>> queue_ ABSL_GUARDED_BY(queue_mutex_);
  bool stopping_ ABSL_GUARDED_BY(queue_mutex_) = false;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_UCX_TRANSPORT_H_
