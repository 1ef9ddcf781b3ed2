// BlockPool: the allocator of the paged KV cache's fixed-size blocks.
//
// The pool tracks block ids and their reference counts only; the KV bytes
// live elsewhere (the KV cache manager maps a BlockId to device memory).
// Ids are 0 .. num_total() - 1. A block is either free (ref count 0, on the
// free list) or allocated (ref count >= 1). Allocate hands out blocks with
// ref count 1; Ref adds a reference (a prefix shared by several sequences);
// Release drops one reference per id and returns a block to the free list
// when its count reaches 0.
//
// Allocation is all-or-nothing and deterministic: the lowest free ids come
// first, in ascending order.
//
// Prefix caching (hash-keyed reuse of full blocks, with LRU eviction of
// cached blocks that no sequence references) will be built on top of this
// pool in the engine issue; it is deliberately not implemented here.
//
// Ownership: Create returns a uniquely owned pool; it owns only its
// bookkeeping. Thread-safety: every method is safe to call concurrently; one
// absl::Mutex guards all mutable state, and each method is atomic (a failed
// call changes nothing).
#ifndef PDSERVE_ENGINE_BLOCK_POOL_H_
#define PDSERVE_ENGINE_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace pdserve::engine {

using BlockId = int32_t;
// Not a block: a hole in a block table (a freed block no query reads) and
// the end of an intrusive list.
inline constexpr BlockId kNoBlock = -1;

struct BlockPoolOptions {
  // Number of blocks in the pool; must be > 0.
  int32_t num_blocks = 0;
};

class BlockPool {
 public:
  // INVALID_ARGUMENT when options.num_blocks <= 0.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(
      const BlockPoolOptions& options);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Allocates `n` blocks, each with ref count 1, lowest free ids first
  // (returned in ascending order). n == 0 returns an empty vector.
  // All-or-nothing: RESOURCE_EXHAUSTED (message gives requested, free and
  // total counts) when fewer than `n` blocks are free, and nothing is
  // allocated. INVALID_ARGUMENT when n < 0.
  absl::StatusOr<std::vector<BlockId>> Allocate(int32_t n)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, appending the ids to `out` (on error `out` is unchanged): a
  // block table with room for them grows without allocating.
  absl::Status AllocateInto(int32_t n, std::vector<BlockId>* out)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Adds one reference to an allocated block (e.g. a sequence sharing
  // another's prefix). OUT_OF_RANGE for an id outside [0, num_total()),
  // FAILED_PRECONDITION for a free block (a free block cannot be shared; it
  // must be allocated first), RESOURCE_EXHAUSTED if the count would overflow.
  // On error nothing changes.
  absl::Status Ref(BlockId id) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops one reference for each id in `ids` (an id may appear several times
  // to drop several references). Blocks whose count reaches 0 return to the
  // free list. Validates everything before changing anything: OUT_OF_RANGE
  // if any id is outside [0, num_total()), FAILED_PRECONDITION if any block
  // would be released more times than it is referenced (including releasing
  // a free block); on error nothing changes.
  absl::Status Release(absl::Span<const BlockId> ids) ABSL_LOCKS_EXCLUDED(mu_);

  // Number of free blocks right now (may be stale as soon as it returns when
  // other threads use the pool).
  int32_t num_free() const ABSL_LOCKS_EXCLUDED(mu_);

  // Total number of blocks; constant for the pool's lifetime.
  int32_t num_total() const { return num_total_; }

  // Current reference count of `id`: 0 for a free block and for an id out
  // of range.
  int32_t ref_count(BlockId id) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit BlockPool(int32_t num_blocks);

  const int32_t num_total_;

  mutable absl::Mutex mu_;
  // ref_counts_[id] is the number of references to block `id`; 0 when free.
  std::vector<int32_t> ref_counts_ ABSL_GUARDED_BY(mu_);
  // The free blocks, as a min-heap on id (std::greater), so allocation takes
  // the lowest ids first.
  std::vector<BlockId> free_heap_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_BLOCK_POOL_H_
