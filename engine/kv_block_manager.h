// KvBlockManager: per-sequence block tables of the paged KV cache, with
// hash-keyed prefix caching and LRU eviction, on top of BlockPool.
//
// The KV cache is a pool of num_blocks blocks of block_size tokens each; the
// bytes live elsewhere and are indexed by BlockId. Token position p of a
// sequence lives in BlockTable(id)[p / block_size], slot p % block_size.
//
// Prefix cache. A full block whose KV has been computed (MarkComputed) is
// entered into the cache under its chain key, which identifies the whole
// prefix up to and including that block (engine/block_hash.h, the formula
// proto/membership.proto fixes so the router computes the same keys).
// AddSequence shares the longest run of cached leading full blocks of a
// prompt. Keys are trusted: two different prefixes with the same 64-bit key
// would share KV (the router relies on the same assumption).
//
// Every block is in exactly one of three states:
//   free       ref count 0 in the pool;
//   used       referenced by at least one live sequence (possibly cached too);
//   evictable  cached, referenced by no sequence: resident, reusable by a
//              prefix hit, and reclaimed (least recently used first) when
//              Reserve runs out of free blocks.
// The cache holds one pool reference per cached block, so the pool's ref
// count of a block is always (sequences holding it) + (1 if cached), and an
// evictable block is never handed out by the pool.
//
// Events. Each block entering the cache (kStored) or leaving it (kRemoved)
// appends an event to a bounded queue that TakeEvents() drains, for the
// router's KV-aware routing index; ClearCache/Reset append kCleared. When
// the queue would exceed its bound, the pending events are replaced by a
// snapshot: kCleared followed by kStored for every cached block, which leaves
// a consumer applying events in order with the same view.
//
// Ownership: Create returns a uniquely owned manager that owns its BlockPool
// (nothing else may allocate from it, or the accounting would break).
// Thread-safety: every method is safe to call concurrently; one absl::Mutex
// guards all state and each method is atomic (a failed call changes
// nothing). BlockTable() returns a view, see there.
#ifndef PDSERVE_ENGINE_KV_BLOCK_MANAGER_H_
#define PDSERVE_ENGINE_KV_BLOCK_MANAGER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/block_pool.h"

namespace pdserve::engine {

// Identifies a sequence (one request's tokens) to the manager.
using SeqId = int64_t;

struct KvBlockManagerOptions {
  // Blocks in the pool; must be > 0.
  int32_t num_blocks = 0;
  // Tokens per block; must be > 0.
  int32_t block_size = 0;
  // When false, AddSequence never hits, nothing is cached and no events are
  // produced; blocks are plain per-sequence allocations.
  bool enable_prefix_cache = true;
  // Bound of the pending event queue; 0 picks 4 * num_blocks. Raised to at
  // least 2 * (num_blocks + 1) so that an overflow snapshot (at most
  // num_blocks + 1 events) leaves room and overflows stay rare.
  int32_t max_pending_events = 0;
  // Block-table entries reserved for each sequence as it is added (the
  // model's context in blocks), so that decoding up to the context grows no
  // table; 0 lets tables grow as they fill.
  int32_t max_blocks_per_sequence = 0;
};

// A change to the prefix cache, in the order it happened.
struct PrefixCacheEvent {
  enum class Kind {
    kStored,   // `key` became reusable from the cache.
    kRemoved,  // `key` was evicted.
    kCleared,  // The whole cache was emptied; `key` is 0.
  };
  Kind kind = Kind::kStored;
  uint64_t key = 0;

  friend bool operator==(const PrefixCacheEvent&,
                         const PrefixCacheEvent&) = default;
};

// A consistent snapshot of the manager's accounting. Counters (the uint64_t
// fields) only grow, also across Reset, as Prometheus counters must.
struct KvBlockManagerStats {
  int32_t total_blocks = 0;
  int32_t free_blocks = 0;       // Unallocated + evictable.
  int32_t evictable_blocks = 0;  // Cached, held by no sequence.
  int32_t used_blocks = 0;       // Held by at least one sequence.
  int32_t cached_blocks = 0;     // In the prefix cache (used or evictable).
  int32_t sequences = 0;
  uint64_t prefix_cache_queries = 0;       // AddSequence lookups.
  uint64_t prefix_cache_query_tokens = 0;  // Prompt tokens looked up.
  uint64_t prefix_cache_hit_tokens = 0;    // Of those, found in the cache.
  uint64_t evictions = 0;                  // Cached blocks reclaimed.
  uint64_t event_overflows = 0;            // Queue collapsed to a snapshot.
};

class KvBlockManager {
 public:
  // INVALID_ARGUMENT when num_blocks or block_size is not positive or
  // max_pending_events is negative.
  static absl::StatusOr<std::unique_ptr<KvBlockManager>> Create(
      const KvBlockManagerOptions& options);

  KvBlockManager(const KvBlockManager&) = delete;
  KvBlockManager& operator=(const KvBlockManager&) = delete;

  // Registers sequence `id` with its prompt. With prefix caching, shares the
  // longest run of the prompt's leading full blocks found in the cache (its
  // block table starts with them) and returns the number of prompt tokens
  // whose KV is therefore present: a multiple of block_size, and always less
  // than the prompt's length, because the engine must compute at least the
  // last prompt token to get its logits. Never allocates, so never fails for
  // lack of blocks. INVALID_ARGUMENT for a duplicate id or an empty prompt.
  absl::StatusOr<int32_t> AddSequence(SeqId id,
                                      absl::Span<const int32_t> prompt_tokens)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Grows the block table of `id` to hold `total_tokens` tokens (never
  // shrinks it; holes left by FreeBlocks stay holes), taking free blocks and,
  // when those run short, evicting cached blocks no sequence holds, least
  // recently used first. All-or-nothing: RESOURCE_EXHAUSTED (message gives
  // needed, free and evictable counts) when the blocks are not available now,
  // and nothing changes. NOT_FOUND for an unknown id; INVALID_ARGUMENT for a
  // negative count or one whose blocks, holes aside, outnumber the whole pool
  // (it can never fit).
  absl::Status Reserve(SeqId id, int32_t total_tokens) ABSL_LOCKS_EXCLUDED(mu_);

  // New blocks Reserve(id, total_tokens) would take: 0 when the table
  // already holds total_tokens; -1 for an unknown id or a negative count.
  int32_t BlocksNeeded(SeqId id, int32_t total_tokens) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether Reserve(id, total_tokens) would succeed right now.
  bool CanReserve(SeqId id, int32_t total_tokens) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Records that positions [0, num_computed) of `id` now hold KV; `tokens`
  // are the sequence's tokens (prompt, then generated ones), at least
  // num_computed of them, the same ones on every call. Each block that
  // became full and computed enters the prefix cache under its chain key,
  // unless another block already holds that key (that entry is kept, and
  // this block is freed normally with its sequence). NOT_FOUND for an
  // unknown id; INVALID_ARGUMENT when num_computed is negative, exceeds
  // tokens.size() or decreases; FAILED_PRECONDITION when the blocks for
  // num_computed tokens were not reserved. Nothing changes on error.
  absl::Status MarkComputed(SeqId id, absl::Span<const int32_t> tokens,
                            int32_t num_computed) ABSL_LOCKS_EXCLUDED(mu_);

  // The block table of `id` (empty for an unknown id). The view stays valid
  // until the next Reserve, FreeSequence or Reset touching `id`; a thread
  // that does not serialize those with its reads must use CopyBlockTable.
  absl::Span<const BlockId> BlockTable(SeqId id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<BlockId> CopyBlockTable(SeqId id) const ABSL_LOCKS_EXCLUDED(mu_);
  // The same into *out, reusing its capacity (no allocation per decode step
  // once the vector has grown).
  void CopyBlockTable(SeqId id, std::vector<BlockId>* out) const
      ABSL_LOCKS_EXCLUDED(mu_);

  bool HasSequence(SeqId id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Prompt tokens AddSequence found cached (0 for an unknown id).
  int32_t num_cached_tokens(SeqId id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Positions with KV, per MarkComputed or the prefix hit (0 when unknown).
  int32_t num_computed_tokens(SeqId id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the sequence's references to its blocks: cached blocks nobody
  // else holds become evictable (the sequence's later blocks ahead of its
  // earlier ones in eviction order, as a later block is useless to a prefix
  // hit without the earlier ones); uncached ones return to the free list.
  // Returns false (and does nothing) for an unknown id.
  bool FreeSequence(SeqId id) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees entries [begin_block, end_block) of the block table of `id`, which
  // become holes (kNoBlock) that keep later positions where they are: for
  // blocks no query of the sequence will read again (out of a sliding
  // window, or between attention sinks and the recent window). A cached
  // block becomes evictable when no other sequence holds it, as on
  // FreeSequence; its prefix-cache entry stays valid (its KV is unchanged).
  // A prefix hit only ever shares a run of cached blocks from the first
  // one on, so a sequence never receives a hole from the cache. Entries
  // already holes are skipped; the range is clipped to the table. Returns
  // the number of blocks freed; NOT_FOUND for an unknown id.
  absl::StatusOr<int32_t> FreeBlocks(SeqId id, int32_t begin_block,
                                     int32_t end_block)
      ABSL_LOCKS_EXCLUDED(mu_);

  // How many leading full blocks of `tokens` are cached (no cap, no side
  // effects, LRU order untouched). 0 when prefix caching is off.
  int32_t CountCachedPrefixBlocks(absl::Span<const int32_t> tokens) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Pending events, oldest first; the queue is empty afterwards.
  std::vector<PrefixCacheEvent> TakeEvents() ABSL_LOCKS_EXCLUDED(mu_);

  // Empties the prefix cache: evictable blocks are freed, cached blocks
  // held by sequences stay with them as plain blocks. Pending events are
  // replaced by one kCleared (when prefix caching is on).
  void ClearCache() ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every sequence and empties the cache (e.g. on a model reload):
  // all blocks are free afterwards. Counters are kept.
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);

  // Verifies the bookkeeping (for tests): every block is free, used or
  // evictable, exactly once; pool ref counts equal sequence references plus
  // the cache's; the cache map, eviction list and counts agree. INTERNAL
  // naming the first violation.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

  int32_t num_total_blocks() const { return num_total_; }
  int32_t block_size() const { return block_size_; }
  bool prefix_cache_enabled() const { return enable_prefix_cache_; }
  int32_t num_free_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  int32_t num_used_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  int32_t num_cached_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  int32_t num_evictable_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  int32_t num_sequences() const ABSL_LOCKS_EXCLUDED(mu_);
  // The pool's reference count of block `b`: the sequences holding it plus
  // one when it is cached (0 when free or out of range).
  int32_t BlockRefCount(BlockId b) const ABSL_LOCKS_EXCLUDED(mu_);
  KvBlockManagerStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Sequence {
    std::vector<BlockId> blocks;
    int32_t num_cached_tokens = 0;
    int32_t num_computed_tokens = 0;
    // Leading full blocks whose chain key is known (hit or hashed by
    // MarkComputed), and the key of the last of them (the seed of the next).
    int32_t num_hashed_blocks = 0;
    uint64_t last_key = 0;
    // Entries of `blocks` that are holes (FreeBlocks).
    int32_t num_holes = 0;

    int32_t resident_blocks() const {
      return static_cast<int32_t>(blocks.size()) - num_holes;
    }
  };

  struct BlockState {
    int32_t seq_refs = 0;  // Live sequences holding the block.
    bool cached = false;
    uint64_t key = 0;  // Valid when cached.
    // Links of the eviction list (cached && seq_refs == 0 only).
    BlockId lru_prev = kNoBlock;
    BlockId lru_next = kNoBlock;
  };

  KvBlockManager(const KvBlockManagerOptions& options,
                 std::unique_ptr<BlockPool> pool);

  int32_t BlocksForTokens(int32_t tokens) const;
  int32_t BlocksNeededLocked(const Sequence& seq, int32_t total_tokens) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int32_t NumFreeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  void LruPushBack(BlockId b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruRemove(BlockId b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the least recently used evictable block (there must be one).
  void EvictOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sizes the cache map so that filling every block never grows it.
  void ReserveCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushEventLocked(PrefixCacheEvent::Kind kind, uint64_t key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the first pool error that the invariants say cannot happen, for
  // CheckInvariants to report (crashing the server would be worse).
  void NoteInternalError(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t num_total_;
  const int32_t block_size_;
  const bool enable_prefix_cache_;
  const size_t max_pending_events_;
  const int32_t max_blocks_per_sequence_;

  mutable absl::Mutex mu_;
  const std::unique_ptr<BlockPool> pool_ ABSL_PT_GUARDED_BY(mu_);
  absl::flat_hash_map<SeqId, Sequence> seqs_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockState> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, BlockId> cache_ ABSL_GUARDED_BY(mu_);
  // Eviction list: head = least recently used.
  BlockId lru_head_ ABSL_GUARDED_BY(mu_) = kNoBlock;
  BlockId lru_tail_ ABSL_GUARDED_BY(mu_) = kNoBlock;
  int32_t num_evictable_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<PrefixCacheEvent> events_ ABSL_GUARDED_BY(mu_);
  absl::Status internal_error_ ABSL_GUARDED_BY(mu_);

  uint64_t prefix_cache_queries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prefix_cache_query_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prefix_cache_hit_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t event_overflows_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_KV_BLOCK_MANAGER_H_
