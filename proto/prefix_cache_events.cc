#include "proto/prefix_cache_events.h"

namespace pdserve {

void ApplyPrefixCacheEvent(const v1::PrefixCacheEvent& event,
                           absl::flat_hash_set<uint64_t>* cached) {
  switch (event.kind()) {
    case v1::PrefixCacheEvent::KIND_STORED:
      cached->insert(event.block_hashes().begin(), event.block_hashes().end());
      break;
    case v1::PrefixCacheEvent::KIND_REMOVED:
      for (uint64_t hash : event.block_hashes()) cached->erase(hash);
      break;
    case v1::PrefixCacheEvent::KIND_CLEARED:
      cached->clear();
      break;
    default:
      break;
  }
}

}  // namespace pdserve
