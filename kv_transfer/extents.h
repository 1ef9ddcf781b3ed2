// Extent lists: validation against region bounds and coalescing.
//
// A layer of a request is usually many 16-token blocks whose ids are
// consecutive on both sides (fresh allocations), so merging neighbours turns
// hundreds of small puts into a few large ones.
//
// Stateless functions; thread-safe.
#ifndef PDSERVE_KV_TRANSFER_EXTENTS_H_
#define PDSERVE_KV_TRANSFER_EXTENTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kv_transfer/transport.h"

namespace pdserve::kv_transfer {

// OK when every extent is non-empty and lies inside [0, local_length) and
// [0, remote_length) without overflow; INVALID_ARGUMENT naming the first bad
// extent otherwise. OUT_OF_RANGE for an extent past a region's end.
absl::Status ValidateExtents(absl::Span<const Extent> extents,
                             uint64_t local_length, uint64_t remote_length);

// The same bytes as `extents` in as few extents as possible: sorted by local
// offset, and each run whose local and remote ranges both continue the
// previous one merged into it. Extents must not overlap on the remote side
// (a write would be ambiguous); that is not checked here.
std::vector<Extent> CoalesceExtents(absl::Span<const Extent> extents);

// Total bytes of `extents`.
uint64_t TotalBytes(absl::Span<const Extent> extents);

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_EXTENTS_H_
