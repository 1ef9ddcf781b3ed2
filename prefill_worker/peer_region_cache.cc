#include "prefill_worker/peer_region_cache.h"

#include "common/log.h"

namespace pdserve::prefill_worker {

PeerRegionCache::~PeerRegionCache() {
  absl::MutexLock lock(&mutex_);
  while (!lru_.empty()) EraseLocked(lru_.back());
}

absl::StatusOr<kv_transfer::PeerRegionId> PeerRegionCache::Get(
    const v1::MemoryRegionDescriptor& descriptor) {
  if (descriptor.region_id().empty()) {
    return absl::InvalidArgumentError("descriptor has no region_id");
  }
  const std::string serialized = descriptor.SerializeAsString();
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(descriptor.region_id());
  if (it != entries_.end()) {
    if (it->second.serialized_descriptor == serialized) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.peer;
    }
    EraseLocked(descriptor.region_id());  // Same id, new contents.
  }
  // Importing while holding the lock serializes imports, which are rare
  // (once per decode worker) and must not race to import one region twice.
  absl::StatusOr<kv_transfer::PeerRegionId> peer =
      transport_->ImportPeerRegion(descriptor);
  if (!peer.ok()) return peer.status();
  lru_.push_front(descriptor.region_id());
  entries_[descriptor.region_id()] = Entry{serialized, *peer, lru_.begin()};
  while (entries_.size() > capacity_) EraseLocked(lru_.back());
  return *peer;
}

void PeerRegionCache::Invalidate(const std::string& region_id) {
  absl::MutexLock lock(&mutex_);
  EraseLocked(region_id);
}

void PeerRegionCache::EraseLocked(const std::string& region_id) {
  auto it = entries_.find(region_id);
  if (it == entries_.end()) return;
  if (absl::Status s = transport_->ReleasePeerRegion(it->second.peer);
      !s.ok()) {
    PD_LOG(WARNING) << "releasing peer region " << region_id << ": " << s;
  }
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

size_t PeerRegionCache::size() {
  absl::MutexLock lock(&mutex_);
  return entries_.size();
}

}  // namespace pdserve::prefill_worker
