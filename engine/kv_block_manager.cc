#include "engine/kv_block_manager.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/block_hash.h"
#include "engine/block_pool.h"

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<KvBlockManager>> KvBlockManager::Create(
    const KvBlockManagerOptions& options) {
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvBlockManager: block_size must be > 0, got ", options.block_size));
  }
  if (options.max_pending_events < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvBlockManager: max_pending_events must be >= 0, got ",
                     options.max_pending_events));
  }
  absl::StatusOr<std::unique_ptr<BlockPool>> pool =
      BlockPool::Create({.num_blocks = options.num_blocks});
  if (!pool.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvBlockManager: ", pool.status().message()));
  }
  return std::unique_ptr<KvBlockManager>(
      new KvBlockManager(options, *std::move(pool)));
}

KvBlockManager::KvBlockManager(const KvBlockManagerOptions& options,
                               std::unique_ptr<BlockPool> pool)
    : num_total_(options.num_blocks),
      block_size_(options.block_size),
      enable_prefix_cache_(options.enable_prefix_cache),
      max_pending_events_(
          std::max<size_t>(options.max_pending_events > 0
                               ? static_cast<size_t>(options.max_pending_events)
                               : 4 * static_cast<size_t>(options.num_blocks),
                           2 * (static_cast<size_t>(options.num_blocks) + 1))),
      max_blocks_per_sequence_(
          std::clamp(options.max_blocks_per_sequence, 0, options.num_blocks)),
      pool_(std::move(pool)),
      blocks_(options.num_blocks) {
  // Room for everything decode can add, so that a token that fills or starts
  // a block allocates nothing: the event queue is bounded (it empties in
  // place, see TakeEvents), and the cache holds at most one entry per block.
  if (enable_prefix_cache_) {
    absl::MutexLock lock(&mu_);
    ReserveCacheLocked();
    events_.reserve(max_pending_events_ + 1);
  }
}

void KvBlockManager::ReserveCacheLocked() {
  // Evictions leave tombstones in the map; absl then rehashes in place (no
  // allocation) only while the entries fill at most 25/32 of its slots, and
  // reserve(n) promises 7/8. Asking for 8/7 of the blocks keeps a full
  // cache under 25/32.
  const size_t n = static_cast<size_t>(num_total_);
  cache_.reserve(n + n / 7 + 1);
}

int32_t KvBlockManager::BlocksForTokens(int32_t tokens) const {
  return static_cast<int32_t>((int64_t{tokens} + block_size_ - 1) /
                              block_size_);
}

int32_t KvBlockManager::BlocksNeededLocked(const Sequence& seq,
                                           int32_t total_tokens) const {
  return std::max<int32_t>(0, BlocksForTokens(total_tokens) -
                                  static_cast<int32_t>(seq.blocks.size()));
}

int32_t KvBlockManager::NumFreeLocked() const {
  return pool_->num_free() + num_evictable_;
}

absl::StatusOr<int32_t> KvBlockManager::AddSequence(
    SeqId id, absl::Span<const int32_t> prompt_tokens) {
  if (prompt_tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvBlockManager::AddSequence: sequence ", id, " has an empty prompt"));
  }
  absl::MutexLock lock(&mu_);
  if (seqs_.contains(id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvBlockManager::AddSequence: sequence ", id, " already exists"));
  }
  Sequence seq;
  seq.blocks.reserve(max_blocks_per_sequence_);
  if (enable_prefix_cache_) {
    // At least the last prompt token must be computed, so a prompt that is
    // an exact multiple of block_size can reuse all blocks but the last.
    const size_t max_hit_blocks = (prompt_tokens.size() - 1) / block_size_;
    uint64_t key = 0;
    for (size_t i = 0; i < max_hit_blocks; ++i) {
      const uint64_t next =
          ChainKey(key, prompt_tokens.subspan(i * block_size_, block_size_));
      auto it = cache_.find(next);
      if (it == cache_.end()) break;
      seq.blocks.push_back(it->second);
      key = next;
    }
    for (size_t i = 0; i < seq.blocks.size(); ++i) {
      const absl::Status ref = pool_->Ref(seq.blocks[i]);
      if (!ref.ok()) {
        // Only a ref count overflow gets here; undo the references taken.
        NoteInternalError(
            pool_->Release(absl::MakeConstSpan(seq.blocks).subspan(0, i)));
        return ref;
      }
    }
    for (const BlockId b : seq.blocks) {
      if (blocks_[b].seq_refs++ == 0) LruRemove(b);
    }
    const int32_t hit_tokens =
        static_cast<int32_t>(seq.blocks.size()) * block_size_;
    seq.num_cached_tokens = hit_tokens;
    seq.num_computed_tokens = hit_tokens;
    seq.num_hashed_blocks = static_cast<int32_t>(seq.blocks.size());
    seq.last_key = key;
    ++prefix_cache_queries_;
    prefix_cache_query_tokens_ += prompt_tokens.size();
    prefix_cache_hit_tokens_ += hit_tokens;
  }
  const int32_t hit = seq.num_cached_tokens;
  seqs_.emplace(id, std::move(seq));
  return hit;
}

absl::Status KvBlockManager::Reserve(SeqId id, int32_t total_tokens) {
  if (total_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvBlockManager::Reserve: sequence ", id,
                     ": total_tokens must be >= 0, got ", total_tokens));
  }
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("KvBlockManager::Reserve: no sequence ", id));
  }
  Sequence& seq = it->second;
  const int32_t needed = BlocksNeededLocked(seq, total_tokens);
  if (needed == 0) return absl::OkStatus();
  if (int64_t{seq.resident_blocks()} + needed > num_total_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvBlockManager::Reserve: sequence ", id, ": ", total_tokens,
        " tokens need ", int64_t{seq.resident_blocks()} + needed,
        " blocks, more than the pool's ", num_total_));
  }
  const int32_t unallocated = pool_->num_free();
  if (needed > unallocated + num_evictable_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvBlockManager::Reserve: sequence ", id, " needs ", needed,
        " more blocks for ", total_tokens, " tokens; ",
        unallocated + num_evictable_, " free (", unallocated, " unallocated + ",
        num_evictable_, " evictable) of ", num_total_));
  }
  for (int32_t i = unallocated; i < needed; ++i) EvictOneLocked();
  const size_t first_fresh = seq.blocks.size();
  const absl::Status allocated = pool_->AllocateInto(needed, &seq.blocks);
  if (!allocated.ok()) {
    // Unreachable while the invariants hold: enough blocks were just freed.
    NoteInternalError(allocated);
    return absl::InternalError(absl::StrCat(
        "KvBlockManager::Reserve: sequence ", id, ": ", allocated.message()));
  }
  for (size_t i = first_fresh; i < seq.blocks.size(); ++i) {
    blocks_[seq.blocks[i]].seq_refs = 1;
  }
  return absl::OkStatus();
}

int32_t KvBlockManager::BlocksNeeded(SeqId id, int32_t total_tokens) const {
  if (total_tokens < 0) return -1;
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return -1;
  return BlocksNeededLocked(it->second, total_tokens);
}

bool KvBlockManager::CanReserve(SeqId id, int32_t total_tokens) const {
  if (total_tokens < 0) return false;
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  const int32_t needed = BlocksNeededLocked(it->second, total_tokens);
  return needed <= NumFreeLocked() &&
         int64_t{it->second.resident_blocks()} + needed <= num_total_;
}

absl::Status KvBlockManager::MarkComputed(SeqId id,
                                          absl::Span<const int32_t> tokens,
                                          int32_t num_computed) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("KvBlockManager::MarkComputed: no sequence ", id));
  }
  Sequence& seq = it->second;
  if (num_computed < 0 || static_cast<size_t>(num_computed) > tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvBlockManager::MarkComputed: sequence ", id, ": num_computed ",
        num_computed, " not in [0, ", tokens.size(), "] (tokens given)"));
  }
  if (num_computed < seq.num_computed_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvBlockManager::MarkComputed: sequence ", id,
                     ": num_computed ", num_computed, " is below the ",
                     seq.num_computed_tokens, " already computed"));
  }
  const int64_t capacity = int64_t{block_size_} * seq.blocks.size();
  if (num_computed > capacity) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KvBlockManager::MarkComputed: sequence ", id, ": ", num_computed,
        " tokens computed but blocks reserved for only ", capacity));
  }
  seq.num_computed_tokens = num_computed;
  if (!enable_prefix_cache_) return absl::OkStatus();
  const int32_t full_blocks = num_computed / block_size_;
  for (int32_t i = seq.num_hashed_blocks; i < full_blocks; ++i) {
    const uint64_t key = ChainKey(
        seq.last_key,
        tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_));
    const BlockId b = seq.blocks[i];
    if (b == kNoBlock) {  // freed (FreeBlocks) after it was computed
      seq.last_key = key;
      seq.num_hashed_blocks = i + 1;
      continue;
    }
    BlockState& state = blocks_[b];
    // A block past the prefix hit was allocated fresh for this sequence, so
    // it is never cached yet; the check only guards the invariants.
    if (!state.cached && !cache_.contains(key)) {
      const absl::Status ref = pool_->Ref(b);
      if (ref.ok()) {
        state.cached = true;
        state.key = key;
        cache_.emplace(key, b);
        PushEventLocked(PrefixCacheEvent::Kind::kStored, key);
      } else {
        NoteInternalError(ref);
      }
    }
    seq.last_key = key;
    seq.num_hashed_blocks = i + 1;
  }
  return absl::OkStatus();
}

absl::Span<const BlockId> KvBlockManager::BlockTable(SeqId id) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return {};
  // The vector's buffer survives rehashing of seqs_ (moves keep it), so the
  // view lives as long as the sequence's table does not grow.
  return it->second.blocks;
}

std::vector<BlockId> KvBlockManager::CopyBlockTable(SeqId id) const {
  std::vector<BlockId> out;
  CopyBlockTable(id, &out);
  return out;
}

void KvBlockManager::CopyBlockTable(SeqId id, std::vector<BlockId>* out) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    out->clear();
  } else {
    out->assign(it->second.blocks.begin(), it->second.blocks.end());
  }
}

bool KvBlockManager::HasSequence(SeqId id) const {
  absl::MutexLock lock(&mu_);
  return seqs_.contains(id);
}

int32_t KvBlockManager::num_cached_tokens(SeqId id) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.num_cached_tokens;
}

int32_t KvBlockManager::num_computed_tokens(SeqId id) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.num_computed_tokens;
}

bool KvBlockManager::FreeSequence(SeqId id) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  std::vector<BlockId>& table = it->second.blocks;
  std::erase(table, kNoBlock);
  NoteInternalError(pool_->Release(table));
  // Back to front: the sequence's last block becomes the least recently
  // used, so eviction trims prefixes from their end.
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    BlockState& state = blocks_[*b];
    if (--state.seq_refs == 0 && state.cached) LruPushBack(*b);
  }
  seqs_.erase(it);
  return true;
}

absl::StatusOr<int32_t> KvBlockManager::FreeBlocks(SeqId id,
                                                   int32_t begin_block,
                                                   int32_t end_block) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("KvBlockManager::FreeBlocks: no sequence ", id));
  }
  std::vector<BlockId>& table = it->second.blocks;
  const int32_t begin = std::max(begin_block, 0);
  const int32_t end = std::min(end_block, static_cast<int32_t>(table.size()));
  int32_t freed = 0;
  // Back to front, as FreeSequence: later blocks are evicted first.
  for (int32_t i = end - 1; i >= begin; --i) {
    const BlockId b = table[i];
    if (b == kNoBlock) continue;
    NoteInternalError(pool_->Release({b}));
    BlockState& state = blocks_[b];
    if (--state.seq_refs == 0 && state.cached) LruPushBack(b);
    table[i] = kNoBlock;
    ++freed;
  }
  it->second.num_holes += freed;
  return freed;
}

int32_t KvBlockManager::CountCachedPrefixBlocks(
    absl::Span<const int32_t> tokens) const {
  if (!enable_prefix_cache_) return 0;
  const size_t full_blocks = tokens.size() / block_size_;
  absl::MutexLock lock(&mu_);
  uint64_t key = 0;
  int32_t count = 0;
  for (size_t i = 0; i < full_blocks; ++i) {
    key = ChainKey(key, tokens.subspan(i * block_size_, block_size_));
    if (!cache_.contains(key)) break;
    ++count;
  }
  return count;
}

std::vector<PrefixCacheEvent> KvBlockManager::TakeEvents() {
  absl::MutexLock lock(&mu_);
  // A copy, not a swap: the queue keeps the room reserved for it, and the
  // allocation falls on the caller (a status poll), not on a decode step.
  std::vector<PrefixCacheEvent> taken(events_.begin(), events_.end());
  events_.clear();
  return taken;
}

void KvBlockManager::ClearCache() {
  absl::MutexLock lock(&mu_);
  ClearCacheLocked();
}

void KvBlockManager::Reset() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, seq] : seqs_) {
    std::erase(seq.blocks, kNoBlock);
    NoteInternalError(pool_->Release(seq.blocks));
    for (const BlockId b : seq.blocks) --blocks_[b].seq_refs;
  }
  seqs_.clear();
  ClearCacheLocked();
}

void KvBlockManager::ClearCacheLocked() {
  std::vector<BlockId> cached;
  cached.reserve(cache_.size());
  for (BlockId b = 0; b < num_total_; ++b) {
    BlockState& state = blocks_[b];
    if (state.cached) cached.push_back(b);
    state.cached = false;
    state.key = 0;
    state.lru_prev = state.lru_next = kNoBlock;
  }
  NoteInternalError(pool_->Release(cached));
  cache_.clear();  // frees a large table: reserve it again
  if (enable_prefix_cache_) ReserveCacheLocked();
  lru_head_ = lru_tail_ = kNoBlock;
  num_evictable_ = 0;
  if (enable_prefix_cache_) {
    // Everything pending is superseded by the clear.
    events_.clear();
    events_.push_back({PrefixCacheEvent::Kind::kCleared, 0});
  }
}

void KvBlockManager::LruPushBack(BlockId b) {
  BlockState& state = blocks_[b];
  state.lru_prev = lru_tail_;
  state.lru_next = kNoBlock;
  if (lru_tail_ == kNoBlock) {
    lru_head_ = b;
  } else {
    blocks_[lru_tail_].lru_next = b;
  }
  lru_tail_ = b;
  ++num_evictable_;
}

void KvBlockManager::LruRemove(BlockId b) {
  BlockState& state = blocks_[b];
  if (state.lru_prev == kNoBlock) {
    lru_head_ = state.lru_next;
  } else {
    blocks_[state.lru_prev].lru_next = state.lru_next;
  }
  if (state.lru_next == kNoBlock) {
    lru_tail_ = state.lru_prev;
  } else {
    blocks_[state.lru_next].lru_prev = state.lru_prev;
  }
  state.lru_prev = state.lru_next = kNoBlock;
  --num_evictable_;
}

void KvBlockManager::EvictOneLocked() {
  const BlockId b = lru_head_;
  LruRemove(b);
  BlockState& state = blocks_[b];
  const uint64_t key = state.key;
  cache_.erase(key);
  state.cached = false;
  state.key = 0;
  NoteInternalError(pool_->Release({b}));
  ++evictions_;
  PushEventLocked(PrefixCacheEvent::Kind::kRemoved, key);
}

void KvBlockManager::PushEventLocked(PrefixCacheEvent::Kind kind,
                                     uint64_t key) {
  events_.push_back({kind, key});
  if (events_.size() <= max_pending_events_) return;
  // A consumer that applies "cleared, then every cached key" ends with the
  // same view as one that applied every dropped event.
  ++event_overflows_;
  events_.clear();
  events_.push_back({PrefixCacheEvent::Kind::kCleared, 0});
  for (BlockId b = 0; b < num_total_; ++b) {
    if (blocks_[b].cached) {
      events_.push_back({PrefixCacheEvent::Kind::kStored, blocks_[b].key});
    }
  }
}

void KvBlockManager::NoteInternalError(const absl::Status& status) {
  if (!status.ok() && internal_error_.ok()) {
    internal_error_ = absl::InternalError(absl::StrCat(
        "KvBlockManager: block pool refused a bookkept operation: ",
        status.ToString()));
  }
}

absl::Status KvBlockManager::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  if (!internal_error_.ok()) return internal_error_;
  auto fail = [](auto&&... parts) {
    return absl::InternalError(
        absl::StrCat("KvBlockManager invariant: ", parts...));
  };

  std::vector<int32_t> seq_refs(num_total_, 0);
  for (const auto& [id, seq] : seqs_) {
    int32_t holes = 0;
    for (const BlockId b : seq.blocks) {
      if (b == kNoBlock) {
        ++holes;
        continue;
      }
      if (b < 0 || b >= num_total_) {
        return fail("sequence ", id, " holds block ", b, " out of range");
      }
      ++seq_refs[b];
    }
    if (holes != seq.num_holes) {
      return fail("sequence ", id, " has ", holes, " holes, counted ",
                  seq.num_holes);
    }
    std::vector<BlockId> sorted = seq.blocks;
    std::erase(sorted, kNoBlock);
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return fail("sequence ", id, " holds a block twice");
    }
    const int64_t capacity = int64_t{block_size_} * seq.blocks.size();
    if (seq.num_computed_tokens > capacity ||
        seq.num_cached_tokens > seq.num_computed_tokens ||
        seq.num_cached_tokens % block_size_ != 0 ||
        seq.num_hashed_blocks > seq.num_computed_tokens / block_size_) {
      return fail("sequence ", id, " counts: cached ", seq.num_cached_tokens,
                  ", computed ", seq.num_computed_tokens, ", hashed blocks ",
                  seq.num_hashed_blocks, ", capacity ", capacity);
    }
  }

  int32_t cached = 0, evictable = 0, free_blocks = 0, used = 0;
  for (BlockId b = 0; b < num_total_; ++b) {
    const BlockState& state = blocks_[b];
    if (state.seq_refs != seq_refs[b]) {
      return fail("block ", b, " records ", state.seq_refs,
                  " sequence references, tables hold ", seq_refs[b]);
    }
    const int32_t expected = seq_refs[b] + (state.cached ? 1 : 0);
    if (pool_->ref_count(b) != expected) {
      return fail("block ", b, " has pool ref count ", pool_->ref_count(b),
                  ", expected ", expected);
    }
    if (state.cached) {
      ++cached;
      auto it = cache_.find(state.key);
      if (it == cache_.end() || it->second != b) {
        return fail("cached block ", b, " not in the cache map under its key");
      }
    }
    if (expected == 0) ++free_blocks;
    if (seq_refs[b] > 0) ++used;
    if (state.cached && seq_refs[b] == 0) ++evictable;
  }
  if (cached != static_cast<int32_t>(cache_.size())) {
    return fail(cache_.size(), " cache entries but ", cached, " cached blocks");
  }
  if (!enable_prefix_cache_ && cached != 0) {
    return fail(cached, " blocks cached with prefix caching off");
  }
  if (free_blocks != pool_->num_free()) {
    return fail(free_blocks, " unreferenced blocks but the pool has ",
                pool_->num_free(), " free");
  }

  int32_t listed = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = lru_head_; b != kNoBlock; b = blocks_[b].lru_next) {
    if (b < 0 || b >= num_total_ || ++listed > num_total_) {
      return fail("eviction list is corrupt");
    }
    if (blocks_[b].lru_prev != prev) {
      return fail("eviction list back link of block ", b);
    }
    if (!blocks_[b].cached || seq_refs[b] != 0) {
      return fail("block ", b, " on the eviction list is not evictable");
    }
    prev = b;
  }
  if (prev != lru_tail_) return fail("eviction list tail");
  if (listed != evictable || listed != num_evictable_) {
    return fail("eviction list has ", listed, " blocks, ", evictable,
                " evictable, count says ", num_evictable_);
  }
  if (free_blocks + evictable + used != num_total_) {
    return fail(free_blocks, " free + ", evictable, " evictable + ", used,
                " used != ", num_total_);
  }
  if (events_.size() > max_pending_events_) {
    return fail(events_.size(), " pending events over the bound ",
                max_pending_events_);
  }
  return absl::OkStatus();
}

int32_t KvBlockManager::num_free_blocks() const {
  absl::MutexLock lock(&mu_);
  return NumFreeLocked();
}

int32_t KvBlockManager::num_used_blocks() const {
  absl::MutexLock lock(&mu_);
  return num_total_ - NumFreeLocked();
}

int32_t KvBlockManager::num_cached_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(cache_.size());
}

int32_t KvBlockManager::num_evictable_blocks() const {
  absl::MutexLock lock(&mu_);
  return num_evictable_;
}

int32_t KvBlockManager::num_sequences() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(seqs_.size());
}

int32_t KvBlockManager::BlockRefCount(BlockId b) const {
  absl::MutexLock lock(&mu_);
  return pool_->ref_count(b);
}

KvBlockManagerStats KvBlockManager::stats() const {
  absl::MutexLock lock(&mu_);
  KvBlockManagerStats s;
  s.total_blocks = num_total_;
  s.free_blocks = NumFreeLocked();
  s.evictable_blocks = num_evictable_;
  s.used_blocks = num_total_ - s.free_blocks;
  s.cached_blocks = static_cast<int32_t>(cache_.size());
  s.sequences = static_cast<int32_t>(seqs_.size());
  s.prefix_cache_queries = prefix_cache_queries_;
  s.prefix_cache_query_tokens = prefix_cache_query_tokens_;
  s.prefix_cache_hit_tokens = prefix_cache_hit_tokens_;
  s.evictions = evictions_;
  s.event_overflows = event_overflows_;
  return s;
}

}  // namespace pdserve::engine
