// Applying membership.proto's prefix-cache events to a set of cached block
// hashes: the one reading of STORED / REMOVED / CLEARED that the worker's
// feed (the mirror it cuts snapshots from, worker/prefix_cache_feed.h) and
// the router's index of each worker (router/worker_registry.h) share, so
// the two cannot drift apart.
//
// Stateless; thread-safe as far as the caller's set is.
#ifndef PDSERVE_PROTO_PREFIX_CACHE_EVENTS_H_
#define PDSERVE_PROTO_PREFIX_CACHE_EVENTS_H_

#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "proto/membership.pb.h"

namespace pdserve {

// Kinds this build does not know are ignored (a newer worker's events).
void ApplyPrefixCacheEvent(const v1::PrefixCacheEvent& event,
                           absl::flat_hash_set<uint64_t>* cached);

}  // namespace pdserve

#endif  // PDSERVE_PROTO_PREFIX_CACHE_EVENTS_H_
