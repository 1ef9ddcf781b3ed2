#include "kv_transfer/fault_injecting_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"

namespace pdserve::kv_transfer {

FaultInjectingTransport::FaultInjectingTransport(
    std::unique_ptr<KvTransport> inner)
    : inner_(std::move(inner)) {}

FaultInjectingTransport::~FaultInjectingTransport() {
  absl::MutexLock lock(&mutex_);
  for (auto& [id, pending] : pending_) {
    for (OperationId op : pending.inner_ops) inner_->Cancel(op);
  }
  if (scratch_region_ != 0) (void)inner_->DeregisterRegion(scratch_region_);
}

void FaultInjectingTransport::set_faults(const TransportFaults& faults) {
  absl::MutexLock lock(&mutex_);
  faults_ = faults;
  bytes_written_ = 0;
}

absl::StatusOr<RegionId> FaultInjectingTransport::RegisterRegion(
    void* base, uint64_t length, v1::MemoryKind memory_kind, int device_id) {
  PD_ASSIGN_OR_RETURN(
      const RegionId id,
      inner_->RegisterRegion(base, length, memory_kind, device_id));
  absl::MutexLock lock(&mutex_);
  region_bases_[id] = static_cast<const uint8_t*>(base);
  return id;
}

absl::StatusOr<AllocatedRegion> FaultInjectingTransport::AllocateRegion(
    uint64_t length) {
  PD_ASSIGN_OR_RETURN(const AllocatedRegion region,
                      inner_->AllocateRegion(length));
  absl::MutexLock lock(&mutex_);
  region_bases_[region.id] = region.base;
  return region;
}

absl::Status FaultInjectingTransport::DeregisterRegion(RegionId region) {
  PD_RETURN_IF_ERROR(inner_->DeregisterRegion(region));
  absl::MutexLock lock(&mutex_);
  region_bases_.erase(region);
  return absl::OkStatus();
}

absl::StatusOr<RegionId> FaultInjectingTransport::ScratchRegion() {
  if (scratch_region_ == 0) {
    PD_ASSIGN_OR_RETURN(
        scratch_region_,
        inner_->RegisterRegion(&scratch_byte_, 1, v1::MEMORY_KIND_HOST, 0));
  }
  return scratch_region_;
}

OperationId FaultInjectingTransport::Track(Pending pending) {
  const OperationId id = operations_.Add();
  pending_[id] = std::move(pending);
  return id;
}

absl::StatusOr<OperationId> FaultInjectingTransport::PostWrite(
    const WriteRequest& request) {
  absl::MutexLock lock(&mutex_);
  Pending pending;
  pending.ready = absl::Now() + faults_.delay;
  pending.deadline = request.deadline;
  if (faults_.drop_writes) return Track(std::move(pending));

  WriteRequest forwarded = request;
  if (faults_.fail_after_bytes.has_value()) {
    // Keep only the bytes below the limit, then fail.
    const uint64_t limit = *faults_.fail_after_bytes;
    uint64_t budget = limit > bytes_written_ ? limit - bytes_written_ : 0;
    std::vector<Extent> kept;
    for (Extent e : request.extents) {
      if (budget == 0) break;
      e.length = std::min(e.length, budget);
      budget -= e.length;
      kept.push_back(e);
    }
    if (TotalBytes(kept) < TotalBytes(request.extents)) {
      pending.failure = absl::UnavailableError(absl::StrCat(
          "injected fault: connection lost after ", limit, " bytes"));
    }
    forwarded.extents = std::move(kept);
  }
  bytes_written_ += TotalBytes(forwarded.extents);

  std::optional<WriteRequest> corruption;
  if (faults_.corrupt_writes && !forwarded.extents.empty()) {
    Extent& first = forwarded.extents.front();
    const auto base = region_bases_.find(request.local_region);
    PD_ASSIGN_OR_RETURN(const RegionId scratch, ScratchRegion());
    if (base != region_bases_.end()) {
      const uint64_t last = first.length - 1;
      scratch_byte_ = ~base->second[first.local_offset + last];
      corruption = WriteRequest{scratch,
                                request.remote_region,
                                {Extent{0, first.remote_offset + last, 1}},
                                request.deadline};
      if (--first.length == 0) {
        forwarded.extents.erase(forwarded.extents.begin());
      }
    }
  }
  if (!forwarded.extents.empty()) {
    PD_ASSIGN_OR_RETURN(const OperationId op, inner_->PostWrite(forwarded));
    pending.inner_ops.push_back(op);
  }
  if (corruption.has_value()) {
    // Wait for the scratch byte to be sent before it can change again.
    PD_ASSIGN_OR_RETURN(const OperationId op, inner_->PostWrite(*corruption));
    PD_RETURN_IF_ERROR(inner_->Wait(op, request.deadline));
  }
  return Track(std::move(pending));
}

absl::StatusOr<OperationId> FaultInjectingTransport::PostNotice(
    PeerRegionId remote_region, const std::string& key,
    const std::string& payload, absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  Pending pending;
  pending.ready = absl::Now() + faults_.delay;
  pending.deadline = deadline;
  if (!faults_.drop_notices) {
    PD_ASSIGN_OR_RETURN(
        const OperationId op,
        inner_->PostNotice(remote_region, key, payload, deadline));
    pending.inner_ops.push_back(op);
  }
  return Track(std::move(pending));
}

OperationStatus FaultInjectingTransport::Poll(OperationId op) {
  {
    absl::MutexLock lock(&mutex_);
    auto it = pending_.find(op);
    if (it != pending_.end()) {
      Pending& pending = it->second;
      const absl::Time now = absl::Now();
      std::vector<OperationId> running;
      for (OperationId inner_op : pending.inner_ops) {
        const OperationStatus status = inner_->Poll(inner_op);
        if (status.state == OperationState::kInProgress) {
          running.push_back(inner_op);
        } else if (status.state == OperationState::kFailed &&
                   pending.failure.ok()) {
          pending.failure = status.status;
        }
      }
      pending.inner_ops = std::move(running);
      if (pending.inner_ops.empty() && now >= pending.ready) {
        operations_.Complete(op, pending.failure);
        pending_.erase(it);
      } else if (now >= pending.deadline) {
        for (OperationId inner_op : pending.inner_ops) {
          inner_->Cancel(inner_op);
          (void)inner_->Poll(inner_op);  // Forget it in the inner table.
        }
        operations_.Complete(
            op, absl::DeadlineExceededError(absl::StrCat(
                    "operation ", op, " did not complete by its deadline")));
        pending_.erase(it);
      }
    }
  }
  return operations_.Poll(op);
}

absl::Status FaultInjectingTransport::Wait(OperationId op,
                                           absl::Time deadline) {
  while (true) {
    const OperationStatus status = Poll(op);
    if (status.state != OperationState::kInProgress) return status.status;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation ", op, " still in progress"));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

void FaultInjectingTransport::Cancel(OperationId op) {
  absl::MutexLock lock(&mutex_);
  auto it = pending_.find(op);
  if (it == pending_.end()) return;
  for (OperationId inner_op : it->second.inner_ops) {
    inner_->Cancel(inner_op);
    (void)inner_->Poll(inner_op);  // Forget it in the inner table.
  }
  operations_.Complete(op, absl::CancelledError("cancelled"));
  pending_.erase(it);
}

}  // namespace pdserve::kv_transfer
