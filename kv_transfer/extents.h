// Extent lists: validation against region bounds, coalescing, and copying
// where both regions are addressable.
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
#include "absl/time/time.h"
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

// Copies `extents` from the region at `local_base` into the one at
// `remote_base` (memory this process can address: the same process's, or a
// peer's shared memory mapped here), in pieces of at most 1 MiB. Between
// pieces it checks `deadline` and stops with DEADLINE_EXCEEDED once it has
// passed: a receiver may give the blocks of an overdue write to another
// request, so an overdue copy must stop storing into them soon.
absl::Status CopyExtents(uint8_t* remote_base, const uint8_t* local_base,
                         absl::Span<const Extent> extents, absl::Time deadline);

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_EXTENTS_H_
