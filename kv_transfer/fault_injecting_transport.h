// FaultInjectingTransport: a KvTransport decorator that injects the failures
// the layers above must survive: slow links, lost writes, lost notices,
// corrupted bytes, and connections that die part-way through a transfer.
// It wraps any backend (in-process, UCX, NCCL), so the same fault tests run
// against every one.
//
// Faults can be changed at any time with set_faults(); they apply to
// operations posted afterwards.
//
// Wait() polls (every 200 us): this decorator is for tests, not hot paths.
// Thread-safety: all methods are thread-safe.
#ifndef PDSERVE_KV_TRANSFER_FAULT_INJECTING_TRANSPORT_H_
#define PDSERVE_KV_TRANSFER_FAULT_INJECTING_TRANSPORT_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/operation_table.h"
#include "kv_transfer/transport.h"

namespace pdserve::kv_transfer {

struct TransportFaults {
  // Every write and notice is reported complete no sooner than this (its
  // deadline still applies: a delay past it is a DEADLINE_EXCEEDED). Only
  // the report is delayed; the bytes move at the inner transport's pace.
  absl::Duration delay = absl::ZeroDuration();
  // Writes report success but move no bytes.
  bool drop_writes = false;
  // Notices report success but never arrive.
  bool drop_notices = false;
  // Each write lands with the last byte of its first extent inverted.
  bool corrupt_writes = false;
  // After this many bytes in total (over all writes from now on), writes
  // fail with UNAVAILABLE; the bytes before the limit are written.
  std::optional<uint64_t> fail_after_bytes;
};

class FaultInjectingTransport final : public KvTransport {
 public:
  explicit FaultInjectingTransport(std::unique_ptr<KvTransport> inner);
  ~FaultInjectingTransport() override;

  void set_faults(const TransportFaults& faults);
  KvTransport& inner() { return *inner_; }

  v1::TransportKind kind() const override { return inner_->kind(); }
  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t length,
                                          v1::MemoryKind memory_kind,
                                          int device_id) override;
  absl::StatusOr<AllocatedRegion> AllocateRegion(uint64_t length) override;
  absl::Status DeregisterRegion(RegionId region) override;
  absl::StatusOr<v1::MemoryRegionDescriptor> ExportRegion(
      RegionId region) override {
    return inner_->ExportRegion(region);
  }
  absl::StatusOr<PeerRegionId> ImportPeerRegion(
      const v1::MemoryRegionDescriptor& descriptor) override {
    return inner_->ImportPeerRegion(descriptor);
  }
  absl::Status ReleasePeerRegion(PeerRegionId peer) override {
    return inner_->ReleasePeerRegion(peer);
  }
  absl::StatusOr<OperationId> PostWrite(const WriteRequest& request) override;
  absl::StatusOr<OperationId> PostNotice(PeerRegionId remote_region,
                                         const std::string& key,
                                         const std::string& payload,
                                         absl::Time deadline) override;
  OperationStatus Poll(OperationId op) override;
  absl::Status Wait(OperationId op, absl::Time deadline) override;
  void Cancel(OperationId op) override;
  absl::StatusOr<std::string> AwaitNotice(const std::string& key,
                                          absl::Time deadline) override {
    return inner_->AwaitNotice(key, deadline);
  }

 private:
  struct Pending {
    std::vector<OperationId> inner_ops;  // Still running in the inner one.
    absl::Time ready;                    // Not done before this (delay).
    absl::Time deadline;
    absl::Status failure;  // First inner failure, or the injected one.
  };

  // Registers the 1-byte scratch region used to corrupt writes.
  absl::StatusOr<RegionId> ScratchRegion()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  OperationId Track(Pending pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  std::unique_ptr<KvTransport> inner_;
  absl::Mutex mutex_;
  TransportFaults faults_ ABSL_GUARDED_BY(mutex_);
  uint64_t bytes_written_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::flat_hash_map<RegionId, const uint8_t*> region_bases_
      ABSL_GUARDED_BY(mutex_);
  uint8_t scratch_byte_ ABSL_GUARDED_BY(mutex_) = 0;
  RegionId scratch_region_ ABSL_GUARDED_BY(mutex_) = 0;
  OperationTable operations_;
  absl::flat_hash_map<OperationId, Pending> pending_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_FAULT_INJECTING_TRANSPORT_H_
