// The NCCL transport's private state: its regions, the staging buffers, and
// the two kinds of communicator it runs (an Export on the receiver side, a
// Peer on the writer side) with the operations posted to a peer. Shared by
// the files that implement NcclTransport (nccl_transport.cc, the public
// methods; nccl_peer_writer.cc and nccl_export_receiver.cc, the threads).
//
// Thread-safety is per field, as annotated: what a thread owns is said so.
#ifndef PDSERVE_KV_TRANSFER_NCCL_TRANSPORT_STATE_H_
#define PDSERVE_KV_TRANSFER_NCCL_TRANSPORT_STATE_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kv_transfer/nccl_transport.h"
#include "kv_transfer/nccl_wire.h"

namespace pdserve::kv_transfer {

struct NcclTransport::Region {
  uint8_t* base = nullptr;
  uint64_t length = 0;
  int inflight = 0;  // Writer operations from this region not yet over.
};

// Staging slots: kSlotBytes of pinned host memory, the same of device memory
// and an event each, allocated once so that no CUDA allocation or free (which
// may synchronize the device) happens while communicators are live.
// Allocation and release are in nccl_staging.cc.
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

  uint8_t* host_slot(int slot) const {
    return host + slot * nccl_internal::kSlotBytes;
  }
  uint8_t* device_slot(int slot) const {
    return device_memory + slot * nccl_internal::kSlotBytes;
  }

  absl::Status Allocate(int device_ordinal, int slot_count);
  ~Staging();

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
  nccl_internal::MessageKind kind = nccl_internal::MessageKind::kWrite;
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

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_NCCL_TRANSPORT_STATE_H_
