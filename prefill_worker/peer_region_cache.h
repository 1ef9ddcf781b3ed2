// PeerRegionCache: the prefill worker's imported decode-pool regions.
//
// Every KvTransferTarget carries its decode pool's MemoryRegionDescriptor,
// but importing one (connecting, unpacking remote keys) is costly, while a
// decode worker's pool stays the same for its whole life. So descriptors are
// imported once and looked up by region_id afterwards ("exchange descriptors
// once, then transfers carry only block ids"). At most `capacity` regions
// are kept; the least recently used is released beyond that. A region whose
// transfer failed is invalidated, so the next transfer to a restarted decode
// worker imports its new descriptor.
//
// Ownership: the transport is not owned and must outlive the cache.
// Thread-safety: all methods are thread-safe.
#ifndef PDSERVE_PREFILL_WORKER_PEER_REGION_CACHE_H_
#define PDSERVE_PREFILL_WORKER_PEER_REGION_CACHE_H_

#include <cstdint>
#include <list>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/transport.h"

namespace pdserve::prefill_worker {

class PeerRegionCache {
 public:
  PeerRegionCache(kv_transfer::KvTransport* transport, size_t capacity)
      : transport_(transport), capacity_(capacity) {}
  ~PeerRegionCache();  // Releases every cached region.
  PeerRegionCache(const PeerRegionCache&) = delete;
  PeerRegionCache& operator=(const PeerRegionCache&) = delete;

  // The imported region for `descriptor`, importing it on first use.
  // INVALID_ARGUMENT for a descriptor without region_id. A cached entry
  // whose descriptor changed under the same region_id is re-imported.
  absl::StatusOr<kv_transfer::PeerRegionId> Get(
      const v1::MemoryRegionDescriptor& descriptor);

  // Forgets (and releases) `region_id`, e.g. after a failed transfer.
  void Invalidate(const std::string& region_id);

  size_t size();

 private:
  struct Entry {
    std::string serialized_descriptor;
    kv_transfer::PeerRegionId peer = 0;
    std::list<std::string>::iterator lru;
  };

  void EraseLocked(const std::string& region_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  kv_transfer::KvTransport* const transport_;
  const size_t capacity_;
  absl::Mutex mutex_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mutex_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mutex_);  // Front: newest.
};

}  // namespace pdserve::prefill_worker

#endif  // PDSERVE_PREFILL_WORKER_PEER_REGION_CACHE_H_
