// InProcessTransport: KvTransport by plain memcpy between transports of one
// process, for colocated mode (prefill and decode engines in one worker) and
// for fast tests of code above the transport.
//
// Several instances may exist in a process (one per engine); descriptors name
// the instance, and importing a descriptor from another process is refused.
// Writes and notices complete during the Post call (the copy is the whole
// transfer), so Poll reports them done at once.
//
// Thread-safety: all methods are thread-safe. Copies hold a process-wide lock
// so a region cannot be deregistered while bytes are copied into it.
#ifndef PDSERVE_KV_TRANSFER_IN_PROCESS_TRANSPORT_H_
#define PDSERVE_KV_TRANSFER_IN_PROCESS_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/transport.h"
#include "kv_transfer/transport_base.h"

namespace pdserve::kv_transfer {

class InProcessTransport final : public TransportBase {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessTransport>> Create();
  ~InProcessTransport() override;

  v1::TransportKind kind() const override {
    return v1::TRANSPORT_KIND_IN_PROCESS;
  }
  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t length,
                                          v1::MemoryKind memory_kind,
                                          int device_id) override;
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

 private:
  struct Region {
    uint8_t* base;
    uint64_t length;
  };
  struct Peer {
    std::string instance;
    RegionId region;
  };

  explicit InProcessTransport(std::string instance)
      : instance_(std::move(instance)) {}

  const std::string instance_;  // "PID/N", unique in the process.
  absl::Mutex mutex_;
  absl::flat_hash_map<RegionId, Region> regions_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<PeerRegionId, Peer> peers_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_IN_PROCESS_TRANSPORT_H_
