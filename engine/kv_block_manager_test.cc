#include "engine/kv_block_manager.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/block_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Kind = PrefixCacheEvent::Kind;

std::unique_ptr<KvBlockManager> Make(int32_t num_blocks, int32_t block_size,
                                     bool prefix_cache = true,
                                     int32_t max_pending_events = 0) {
  absl::StatusOr<std::unique_ptr<KvBlockManager>> m =
      KvBlockManager::Create({.num_blocks = num_blocks,
                              .block_size = block_size,
                              .enable_prefix_cache = prefix_cache,
                              .max_pending_events = max_pending_events});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// Tokens start, start + 1, ..., start + n - 1.
std::vector<int32_t> Range(int32_t start, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a,
                            const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Adds a sequence, reserves its prompt and marks it all computed.
void AddComputed(KvBlockManager& m, SeqId id,
                 const std::vector<int32_t>& prompt) {
  ASSERT_TRUE(m.AddSequence(id, prompt).ok());
  ASSERT_TRUE(m.Reserve(id, prompt.size()).ok());
  ASSERT_TRUE(m.MarkComputed(id, prompt, prompt.size()).ok());
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
}

TEST(KvBlockManagerTest, CreateRejectsBadOptions) {
  EXPECT_EQ(KvBlockManager::Create({.num_blocks = 0, .block_size = 16})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockManager::Create({.num_blocks = 4, .block_size = 0})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockManager::Create(
                {.num_blocks = 4, .block_size = 4, .max_pending_events = -1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvBlockManagerTest, FreshManagerIsAllFree) {
  auto m = Make(8, 4);
  const KvBlockManagerStats s = m->stats();
  EXPECT_EQ(s.total_blocks, 8);
  EXPECT_EQ(s.free_blocks, 8);
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(m->num_total_blocks(), 8);
  EXPECT_EQ(m->block_size(), 4);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, AddSequenceRejectsDuplicatesAndEmptyPrompts) {
  auto m = Make(8, 4);
  ASSERT_TRUE(m->AddSequence(1, Range(0, 5)).ok());
  EXPECT_EQ(m->AddSequence(1, Range(0, 5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->AddSequence(2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->num_sequences(), 1);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, ReserveGrowsTheTableBlockByBlock) {
  auto m = Make(8, 4);
  ASSERT_TRUE(m->AddSequence(1, Range(0, 5)).ok());
  EXPECT_EQ(m->BlocksNeeded(1, 5), 2);
  ASSERT_TRUE(m->Reserve(1, 5).ok());
  EXPECT_THAT(m->BlockTable(1), ElementsAre(0, 1));
  EXPECT_EQ(m->BlocksNeeded(1, 8), 0);
  ASSERT_TRUE(m->Reserve(1, 8).ok());  // Still two blocks.
  ASSERT_TRUE(m->Reserve(1, 3).ok());  // Never shrinks.
  EXPECT_THAT(m->CopyBlockTable(1), ElementsAre(0, 1));
  ASSERT_TRUE(m->Reserve(1, 9).ok());
  EXPECT_THAT(m->BlockTable(1), ElementsAre(0, 1, 2));
  EXPECT_EQ(m->num_used_blocks(), 3);
  EXPECT_EQ(m->num_free_blocks(), 5);
  EXPECT_EQ(m->BlocksNeeded(99, 4), -1);
  EXPECT_EQ(m->BlocksNeeded(1, -1), -1);
  EXPECT_EQ(m->Reserve(99, 4).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m->Reserve(1, -1).code(), absl::StatusCode::kInvalidArgument);
  // 33 tokens need 9 blocks: more than the pool will ever have.
  EXPECT_EQ(m->Reserve(1, 33).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(m->CanReserve(1, 33));
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, ComputedFullBlocksAreStoredWithEvents) {
  auto m = Make(8, 4);
  const std::vector<int32_t> prompt = Range(100, 10);
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 1, prompt));
  const std::vector<uint64_t> keys = ChainKeys(prompt, 4);
  EXPECT_EQ(m->num_cached_blocks(), 2);  // The partial third block is not.
  EXPECT_THAT(m->TakeEvents(),
              ElementsAre(PrefixCacheEvent{Kind::kStored, keys[0]},
                          PrefixCacheEvent{Kind::kStored, keys[1]}));
  EXPECT_THAT(m->TakeEvents(), IsEmpty());
  // Cached and held: one sequence reference plus the cache's.
  const auto table = m->CopyBlockTable(1);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(m->BlockRefCount(table[0]), 2);
  EXPECT_EQ(m->BlockRefCount(table[1]), 2);
  EXPECT_EQ(m->BlockRefCount(table[2]), 1);
  // Completing the third block (generated tokens) stores it too.
  const std::vector<int32_t> tokens = Concat(prompt, {7, 8});
  ASSERT_TRUE(m->MarkComputed(1, tokens, 12).ok());
  EXPECT_THAT(m->TakeEvents(), ElementsAre(PrefixCacheEvent{
                                   Kind::kStored, ChainKeys(tokens, 4)[2]}));
  EXPECT_EQ(m->num_computed_tokens(1), 12);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, HitsOnlyOnFullCachedBlocks) {
  auto m = Make(16, 4);
  const std::vector<int32_t> a = Range(0, 10);  // Blocks [0..3] [4..7] [8 9].
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 1, a));
  const auto a_table = m->CopyBlockTable(1);

  // Same 10 tokens then more: the partial block was never cached.
  const std::vector<int32_t> b = Concat(a, {50, 51, 52});
  EXPECT_EQ(*m->AddSequence(2, b), 8);
  EXPECT_THAT(m->BlockTable(2), ElementsAre(a_table[0], a_table[1]));
  EXPECT_EQ(m->num_cached_tokens(2), 8);
  EXPECT_EQ(m->num_computed_tokens(2), 8);

  // Diverging inside the second block: only the first is shared.
  std::vector<int32_t> c = Range(0, 12);
  c[6] = 99;
  EXPECT_EQ(*m->AddSequence(3, c), 4);
  EXPECT_THAT(m->BlockTable(3), ElementsAre(a_table[0]));

  // Diverging in the first token: nothing.
  std::vector<int32_t> d = Range(0, 12);
  d[0] = 99;
  EXPECT_EQ(*m->AddSequence(4, d), 0);
  EXPECT_THAT(m->BlockTable(4), IsEmpty());

  const KvBlockManagerStats s = m->stats();
  EXPECT_EQ(s.prefix_cache_queries, 4u);
  EXPECT_EQ(s.prefix_cache_query_tokens, 10u + 13u + 12u + 12u);
  EXPECT_EQ(s.prefix_cache_hit_tokens, 0u + 8u + 4u + 0u);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, AtLeastOnePromptTokenIsLeftToCompute) {
  auto m = Make(16, 4);
  ASSERT_NO_FATAL_FAILURE(
      AddComputed(*m, 1, Range(0, 12)));  // Three full cached blocks.
  ASSERT_EQ(m->num_cached_blocks(), 3);
  // Fully cached prompts of 12, 8 and 4 tokens: the last block is recomputed.
  EXPECT_EQ(*m->AddSequence(2, Range(0, 12)), 8);
  EXPECT_EQ(*m->AddSequence(3, Range(0, 8)), 4);
  EXPECT_EQ(*m->AddSequence(4, Range(0, 4)), 0);
  // One token past a cached block boundary gets all of them.
  EXPECT_EQ(*m->AddSequence(5, Range(0, 9)), 8);
  EXPECT_EQ(*m->AddSequence(6, Range(0, 13)), 12);
  EXPECT_EQ(*m->AddSequence(7, Range(0, 1)), 0);
  // The side-effect-free count is not capped.
  EXPECT_EQ(m->CountCachedPrefixBlocks(Range(0, 12)), 3);
  EXPECT_EQ(m->CountCachedPrefixBlocks(Range(0, 11)), 2);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, SameBlockAfterADifferentPrefixIsNoHit) {
  auto m = Make(16, 4);
  const std::vector<int32_t> x = Range(0, 4), y = Range(10, 4),
                             z = Range(20, 4);
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 1, Concat(Concat(x, y), {1})));
  ASSERT_EQ(m->num_cached_blocks(), 2);
  // Block "y" is cached, but after "x", not after "z".
  const std::vector<int32_t> other = Concat(Concat(z, y), {1});
  EXPECT_EQ(m->CountCachedPrefixBlocks(other), 0);
  EXPECT_EQ(*m->AddSequence(2, other), 0);
  EXPECT_NE(ChainKeys(other, 4)[1], ChainKeys(Concat(x, y), 4)[1]);
  // Nor does "y" at the start of a prompt match the cached "y" after "x".
  EXPECT_EQ(m->CountCachedPrefixBlocks(y), 0);
  EXPECT_EQ(*m->AddSequence(3, Concat(y, {1})), 0);
  // Computing it caches a second, distinct entry for the same block content.
  ASSERT_TRUE(m->Reserve(2, other.size()).ok());
  ASSERT_TRUE(m->MarkComputed(2, other, other.size()).ok());
  EXPECT_EQ(m->num_cached_blocks(), 4);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, SharersShareBlockIdsAndRefCounts) {
  auto m = Make(16, 4);
  const std::vector<int32_t> prefix = Range(0, 8);
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 1, Concat(prefix, {100, 101})));
  const std::vector<int32_t> b_prompt = Concat(prefix, {200, 201, 202});
  ASSERT_EQ(*m->AddSequence(2, b_prompt), 8);
  ASSERT_TRUE(m->Reserve(2, b_prompt.size()).ok());
  const auto a_table = m->CopyBlockTable(1);
  const auto b_table = m->CopyBlockTable(2);
  ASSERT_EQ(a_table.size(), 3u);
  ASSERT_EQ(b_table.size(), 3u);
  EXPECT_EQ(b_table[0], a_table[0]);
  EXPECT_EQ(b_table[1], a_table[1]);
  EXPECT_NE(b_table[2], a_table[2]);
  // Two sequences plus the cache.
  EXPECT_EQ(m->BlockRefCount(a_table[0]), 3);
  EXPECT_EQ(m->BlockRefCount(a_table[1]), 3);
  EXPECT_EQ(m->BlockRefCount(a_table[2]), 1);
  EXPECT_EQ(m->BlockRefCount(b_table[2]), 1);
  EXPECT_EQ(m->num_used_blocks(), 4);  // Shared blocks count once.
  EXPECT_EQ(m->num_free_blocks(), 12);
  ASSERT_TRUE(m->CheckInvariants().ok());

  // Freeing one sharer leaves the other's blocks intact and unevictable.
  EXPECT_TRUE(m->FreeSequence(1));
  EXPECT_FALSE(m->FreeSequence(1));
  EXPECT_THAT(m->BlockTable(2), ElementsAreArray(b_table));
  EXPECT_EQ(m->BlockRefCount(a_table[0]), 2);
  EXPECT_EQ(m->BlockRefCount(a_table[1]), 2);
  EXPECT_EQ(m->BlockRefCount(a_table[2]), 0);  // Uncached: free again.
  EXPECT_EQ(m->num_evictable_blocks(), 0);
  EXPECT_EQ(m->num_used_blocks(), 3);
  // Filling the rest of the pool cannot take B's blocks.
  ASSERT_TRUE(m->AddSequence(3, Range(500, 1)).ok());
  ASSERT_TRUE(m->Reserve(3, 13 * 4).ok());
  EXPECT_EQ(m->Reserve(2, 16).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(m->BlockTable(2), ElementsAreArray(b_table));
  EXPECT_EQ(m->CountCachedPrefixBlocks(prefix), 2);
  ASSERT_TRUE(m->CheckInvariants().ok());

  // Once the last sharer goes, the cached blocks stay resident, evictable.
  EXPECT_TRUE(m->FreeSequence(2));
  EXPECT_EQ(m->BlockRefCount(a_table[0]), 1);
  EXPECT_EQ(m->num_evictable_blocks(), 2);
  EXPECT_EQ(m->num_cached_blocks(), 2);
  EXPECT_EQ(m->num_free_blocks(), 3);  // b_table[2] + 2 evictable.
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, EvictsLeastRecentlyUsedFirst) {
  auto m = Make(8, 2);
  const std::vector<int32_t> a = Range(0, 4), b = Range(10, 4);
  const std::vector<uint64_t> ka = ChainKeys(a, 2), kb = ChainKeys(b, 2);
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 1, a));
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 2, b));
  m->FreeSequence(1);  // Eviction order now: a1, a0.
  m->FreeSequence(2);  // Then b1, b0.
  m->TakeEvents();
  ASSERT_EQ(m->num_evictable_blocks(), 4);
  ASSERT_EQ(m->num_free_blocks(), 8);

  // The 4 unallocated blocks go first, then one eviction: a's last block.
  ASSERT_TRUE(m->AddSequence(3, Range(100, 1)).ok());
  ASSERT_TRUE(m->Reserve(3, 10).ok());
  EXPECT_THAT(m->TakeEvents(),
              ElementsAre(PrefixCacheEvent{Kind::kRemoved, ka[1]}));
  EXPECT_EQ(m->CountCachedPrefixBlocks(a), 1);
  EXPECT_EQ(m->CountCachedPrefixBlocks(b), 2);

  // A hit makes b's blocks the most recently used once released again.
  ASSERT_EQ(*m->AddSequence(4, Concat(b, {1})), 4);
  m->FreeSequence(4);  // Order: a0, b1, b0.
  ASSERT_TRUE(m->Reserve(3, 12).ok());
  EXPECT_THAT(m->TakeEvents(),
              ElementsAre(PrefixCacheEvent{Kind::kRemoved, ka[0]}));
  ASSERT_TRUE(m->Reserve(3, 16).ok());
  EXPECT_THAT(m->TakeEvents(),
              ElementsAre(PrefixCacheEvent{Kind::kRemoved, kb[1]},
                          PrefixCacheEvent{Kind::kRemoved, kb[0]}));
  EXPECT_EQ(m->num_cached_blocks(), 0);
  EXPECT_EQ(m->stats().evictions, 4u);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, BlocksHeldBySequencesAreNeverEvicted) {
  auto m = Make(4, 2);
  ASSERT_NO_FATAL_FAILURE(
      AddComputed(*m, 1, Range(0, 4)));  // Two cached blocks, held by seq 1.
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 2, Range(10, 4)));
  m->FreeSequence(2);  // Two evictable.
  ASSERT_TRUE(m->AddSequence(3, Range(20, 1)).ok());
  EXPECT_FALSE(m->CanReserve(3, 6));
  EXPECT_EQ(m->Reserve(3, 6).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(m->Reserve(3, 4).ok());  // Takes the two evictable ones.
  EXPECT_EQ(m->CountCachedPrefixBlocks(Range(0, 4)), 2);
  EXPECT_EQ(m->CountCachedPrefixBlocks(Range(10, 4)), 0);
  EXPECT_EQ(m->num_free_blocks(), 0);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, ReserveIsAllOrNothing) {
  auto m = Make(6, 4);
  ASSERT_NO_FATAL_FAILURE(
      AddComputed(*m, 1, Range(0, 8)));  // Two cached blocks.
  m->FreeSequence(1);                    // Now evictable.
  m->TakeEvents();
  ASSERT_TRUE(m->AddSequence(2, Range(50, 1)).ok());
  ASSERT_TRUE(m->Reserve(2, 12).ok());  // 3 of the 4 unallocated blocks.
  const auto table = m->CopyBlockTable(2);
  ASSERT_TRUE(m->AddSequence(3, Range(60, 1)).ok());
  // 4 blocks wanted, 1 unallocated + 2 evictable: refused, nothing evicted.
  EXPECT_EQ(m->BlocksNeeded(3, 16), 4);
  EXPECT_FALSE(m->CanReserve(3, 16));
  const absl::Status refused = m->Reserve(3, 16);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("needs 4 more blocks"));
  EXPECT_THAT(refused.message(),
              HasSubstr("3 free (1 unallocated + 2 evictable) of 6"));
  EXPECT_THAT(m->BlockTable(3), IsEmpty());
  EXPECT_THAT(m->BlockTable(2), ElementsAreArray(table));
  EXPECT_EQ(m->num_cached_blocks(), 2);
  EXPECT_EQ(m->num_free_blocks(), 3);
  EXPECT_THAT(m->TakeEvents(), IsEmpty());
  EXPECT_EQ(m->stats().evictions, 0u);
  ASSERT_TRUE(m->CheckInvariants().ok());
  // Exactly what is free fits.
  EXPECT_TRUE(m->CanReserve(3, 12));
  ASSERT_TRUE(m->Reserve(3, 12).ok());
  EXPECT_EQ(m->num_free_blocks(), 0);
  EXPECT_EQ(m->num_cached_blocks(), 0);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, MarkComputedValidatesAndChangesNothingOnError) {
  auto m = Make(8, 4);
  const std::vector<int32_t> t = Range(0, 8);
  ASSERT_TRUE(m->AddSequence(1, t).ok());
  EXPECT_EQ(m->MarkComputed(2, t, 4).code(), absl::StatusCode::kNotFound);
  // Not reserved yet.
  EXPECT_EQ(m->MarkComputed(1, t, 4).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->Reserve(1, 8).ok());
  EXPECT_EQ(m->MarkComputed(1, t, 9).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->MarkComputed(1, t, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->num_cached_blocks(), 0);
  ASSERT_TRUE(m->MarkComputed(1, t, 5).ok());
  EXPECT_EQ(m->num_cached_blocks(), 1);
  EXPECT_EQ(m->MarkComputed(1, t, 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->num_computed_tokens(1), 5);
  ASSERT_TRUE(m->MarkComputed(1, t, 5).ok());  // Repeating is fine.
  EXPECT_EQ(m->num_cached_blocks(), 1);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, DuplicateKeyKeepsTheExistingEntry) {
  auto m = Make(8, 4);
  const std::vector<int32_t> t = Range(0, 6);
  // Both start before either has computed, so neither hits.
  ASSERT_EQ(*m->AddSequence(1, t), 0);
  ASSERT_EQ(*m->AddSequence(2, t), 0);
  ASSERT_TRUE(m->Reserve(1, 6).ok());
  ASSERT_TRUE(m->Reserve(2, 6).ok());
  ASSERT_TRUE(m->MarkComputed(1, t, 6).ok());
  ASSERT_TRUE(m->MarkComputed(2, t, 6).ok());
  EXPECT_EQ(m->num_cached_blocks(), 1);
  EXPECT_THAT(m->TakeEvents(),
              ElementsAre(PrefixCacheEvent{Kind::kStored, ChainKeys(t, 4)[0]}));
  const BlockId first_of_1 = m->CopyBlockTable(1)[0];
  const BlockId first_of_2 = m->CopyBlockTable(2)[0];
  EXPECT_EQ(m->BlockRefCount(first_of_1), 2);
  EXPECT_EQ(m->BlockRefCount(first_of_2), 1);
  m->FreeSequence(2);
  EXPECT_EQ(m->BlockRefCount(first_of_2), 0);
  EXPECT_EQ(m->num_evictable_blocks(), 0);
  // A later prompt hits sequence 1's block.
  EXPECT_EQ(*m->AddSequence(3, t), 4);
  EXPECT_THAT(m->BlockTable(3), ElementsAre(first_of_1));
  EXPECT_TRUE(m->CheckInvariants().ok());
}

// FreeBlocks (sliding windows, attention sinks) leaves holes that keep
// later positions in place: cached blocks become evictable, others free;
// holes count for no block of the pool, so a long sequence with holes may
// reach past the pool's size; hits never hand out a hole.
TEST(KvBlockManagerTest, FreedBlocksBecomeHoles) {
  auto m = Make(8, 4);
  AddComputed(*m, 1, Range(0, 16));  // 4 full cached blocks
  ASSERT_TRUE(m->Reserve(1, 20).ok());
  const std::vector<BlockId> before = m->CopyBlockTable(1);
  absl::StatusOr<int32_t> freed = m->FreeBlocks(1, 0, 2);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 2);
  EXPECT_THAT(m->CopyBlockTable(1),
              ElementsAre(kNoBlock, kNoBlock, before[2], before[3], before[4]));
  EXPECT_EQ(m->num_used_blocks(), 3);
  EXPECT_EQ(m->num_evictable_blocks(), 2);
  EXPECT_EQ(m->num_cached_blocks(), 4);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  // Holes are skipped; the range is clipped to the table.
  EXPECT_EQ(*m->FreeBlocks(1, -3, 3), 1);
  EXPECT_EQ(*m->FreeBlocks(1, 0, 3), 0);
  EXPECT_EQ(m->FreeBlocks(9, 0, 1).status().code(),
            absl::StatusCode::kNotFound);
  // 40 tokens are 10 table entries, more than the pool's 8, but only 7 of
  // them blocks; 44 take the eighth, 45 would need a ninth.
  ASSERT_TRUE(m->CanReserve(1, 40));
  ASSERT_TRUE(m->Reserve(1, 40).ok());
  EXPECT_EQ(m->CopyBlockTable(1).size(), 10u);
  EXPECT_EQ(m->num_used_blocks(), 7);
  EXPECT_EQ(m->Reserve(1, 44).code(), absl::StatusCode::kOk);
  EXPECT_EQ(m->Reserve(1, 45).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->MarkComputed(1, Range(0, 40), 40).ok());
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  // Another sequence with the same prefix shares only a run of cached
  // blocks from the first on, never a hole.
  ASSERT_TRUE(m->AddSequence(2, Range(0, 41)).ok());
  for (BlockId b : m->CopyBlockTable(2)) EXPECT_NE(b, kNoBlock);
  EXPECT_EQ(m->num_cached_tokens(2),
            4 * static_cast<int32_t>(m->CopyBlockTable(2).size()));
  ASSERT_TRUE(m->FreeSequence(1));
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  ASSERT_TRUE(m->FreeSequence(2));
  EXPECT_EQ(m->num_used_blocks(), 0);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();

  // Without prefix caching a freed block is free at once.
  auto plain = Make(4, 4, /*prefix_cache=*/false);
  ASSERT_TRUE(plain->AddSequence(1, Range(0, 16)).ok());
  ASSERT_TRUE(plain->Reserve(1, 16).ok());
  EXPECT_EQ(*plain->FreeBlocks(1, 0, 2), 2);
  EXPECT_EQ(plain->num_free_blocks(), 2);
  plain->Reset();
  EXPECT_EQ(plain->num_free_blocks(), 4);
  ASSERT_TRUE(plain->CheckInvariants().ok()) << plain->CheckInvariants();
}

TEST(KvBlockManagerTest, ClearCacheAndReset) {
  auto m = Make(8, 2);
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 1, Range(0, 4)));
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 2, Range(10, 4)));
  m->FreeSequence(2);
  ASSERT_EQ(m->num_cached_blocks(), 4);
  ASSERT_EQ(m->num_evictable_blocks(), 2);

  m->ClearCache();
  EXPECT_THAT(m->TakeEvents(),
              ElementsAre(PrefixCacheEvent{Kind::kCleared, 0}));
  EXPECT_EQ(m->num_cached_blocks(), 0);
  EXPECT_EQ(m->num_evictable_blocks(), 0);
  EXPECT_EQ(m->num_used_blocks(), 2);  // Sequence 1 keeps its blocks.
  EXPECT_EQ(m->num_free_blocks(), 6);
  EXPECT_EQ(*m->AddSequence(3, Range(0, 5)), 0);
  ASSERT_TRUE(m->CheckInvariants().ok());
  // Sequence 1's blocks were hashed already; they are freed normally.
  m->FreeSequence(1);
  EXPECT_EQ(m->num_free_blocks(), 8);
  ASSERT_TRUE(m->CheckInvariants().ok());

  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 4, Range(0, 6)));
  m->Reset();
  EXPECT_EQ(m->num_sequences(), 0);
  EXPECT_EQ(m->num_free_blocks(), 8);
  EXPECT_EQ(m->num_cached_blocks(), 0);
  EXPECT_THAT(m->TakeEvents(),
              ElementsAre(PrefixCacheEvent{Kind::kCleared, 0}));
  EXPECT_EQ(m->stats().prefix_cache_queries, 4u);  // Counters survive.
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, WithoutPrefixCachingNothingIsShared) {
  auto m = Make(8, 2, /*prefix_cache=*/false);
  ASSERT_NO_FATAL_FAILURE(AddComputed(*m, 1, Range(0, 6)));
  EXPECT_EQ(m->num_cached_blocks(), 0);
  EXPECT_EQ(*m->AddSequence(2, Range(0, 6)), 0);
  EXPECT_EQ(m->CountCachedPrefixBlocks(Range(0, 6)), 0);
  m->FreeSequence(1);
  EXPECT_EQ(m->num_free_blocks(), 8);
  EXPECT_EQ(m->num_evictable_blocks(), 0);
  m->Reset();
  EXPECT_THAT(m->TakeEvents(), IsEmpty());
  EXPECT_EQ(m->stats().prefix_cache_queries, 0u);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

// Applies events to a router-side index of cached keys.
void Apply(const std::vector<PrefixCacheEvent>& events,
           absl::flat_hash_set<uint64_t>& index) {
  for (const PrefixCacheEvent& e : events) {
    switch (e.kind) {
      case Kind::kStored:
        index.insert(e.key);
        break;
      case Kind::kRemoved:
        index.erase(e.key);
        break;
      case Kind::kCleared:
        index.clear();
        break;
    }
  }
}

// Leading chain keys of `tokens` present in `index`.
int32_t CountInIndex(const absl::flat_hash_set<uint64_t>& index,
                     const std::vector<int32_t>& tokens, int block_size) {
  int32_t n = 0;
  for (const uint64_t key : ChainKeys(tokens, block_size)) {
    if (!index.contains(key)) break;
    ++n;
  }
  return n;
}

TEST(KvBlockManagerTest, EventOverflowCollapsesToASnapshot) {
  // 4 blocks: the bound is raised to 2 * (4 + 1) = 10 events.
  auto m = Make(4, 2, true, /*max_pending_events=*/1);
  absl::flat_hash_set<uint64_t> index;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(Range(100 * i, 4));
    ASSERT_NO_FATAL_FAILURE(
        AddComputed(*m, i, prompts.back()));  // 2 stores (+ evictions).
    m->FreeSequence(i);
  }
  EXPECT_GE(m->stats().event_overflows, 1u);
  const std::vector<PrefixCacheEvent> events = m->TakeEvents();
  EXPECT_LE(events.size(), 10u);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().kind, Kind::kCleared);
  Apply(events, index);
  EXPECT_EQ(index.size(), static_cast<size_t>(m->num_cached_blocks()));
  for (const auto& p : prompts) {
    EXPECT_EQ(CountInIndex(index, p, 2), m->CountCachedPrefixBlocks(p));
  }
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockManagerTest, ConcurrentUseKeepsTheBooksStraight) {
  auto m = Make(64, 4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 300; ++i) {
        const SeqId id = t * 1000 + i;
        // Shared prefixes across threads: prompts from a few templates.
        std::vector<int32_t> prompt = Range(1000 * (rng() % 3), 9);
        prompt.push_back(static_cast<int32_t>(rng() % 5));
        if (!m->AddSequence(id, prompt).ok()) continue;
        if (m->Reserve(id, prompt.size()).ok()) {
          (void)m->MarkComputed(id, prompt, prompt.size());
        }
        m->FreeSequence(id);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  EXPECT_EQ(m->num_sequences(), 0);
  EXPECT_EQ(m->num_used_blocks(), 0);
  EXPECT_EQ(m->num_free_blocks(), 64);
}

// Thousands of random operations, checking the books after each against
// independently kept expectations.
TEST(KvBlockManagerTest, RandomizedStress) {
  constexpr int kBlocks = 24;
  constexpr int kBlockSize = 3;
  auto m = Make(kBlocks, kBlockSize);
  std::mt19937 rng(20240611);
  auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  // A few prompt stems so that prompts share prefixes often.
  std::vector<std::vector<int32_t>> stems;
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> stem;
    for (int i = 0; i < 12; ++i) stem.push_back(uniform(0, 5));
    stems.push_back(stem);
  }
  struct Live {
    std::vector<int32_t> tokens;  // Prompt, then generated tokens.
    int32_t computed = 0;
  };
  // Ordered, so the random picks below (by position) do not depend on
  // hash iteration order, which absl seeds per process: the run, and the
  // path counts checked at the end, are the same every time.
  std::map<SeqId, Live> live;
  absl::flat_hash_set<uint64_t> index;  // Router view from the events.
  SeqId next_id = 0;
  int hits = 0, refusals = 0, evictions_seen = 0;

  for (int step = 0; step < 6000; ++step) {
    const int op = uniform(0, 99);
    if (op < 25) {  // Add a sequence.
      const auto& stem = stems[uniform(0, stems.size() - 1)];
      std::vector<int32_t> prompt(stem.begin(),
                                  stem.begin() + uniform(0, stem.size()));
      for (int n = uniform(prompt.empty() ? 1 : 0, 4); n > 0; --n) {
        prompt.push_back(uniform(0, 5));
      }
      const int32_t count = m->CountCachedPrefixBlocks(prompt);
      const int32_t expected_hit =
          std::min<int32_t>(count, (prompt.size() - 1) / kBlockSize) *
          kBlockSize;
      const SeqId id = next_id++;
      absl::StatusOr<int32_t> hit = m->AddSequence(id, prompt);
      ASSERT_TRUE(hit.ok()) << hit.status();
      ASSERT_EQ(*hit, expected_hit) << "step " << step;
      ASSERT_LT(*hit, static_cast<int32_t>(prompt.size()));
      ASSERT_EQ(m->BlockTable(id).size(), *hit / kBlockSize);
      if (*hit > 0) ++hits;
      live[id] = {prompt, *hit};
    } else if (op < 55 && !live.empty()) {  // Reserve (and compute).
      auto it = live.begin();
      std::advance(it, uniform(0, live.size() - 1));
      const SeqId id = it->first;
      Live& seq = it->second;
      const int32_t target = seq.computed + uniform(1, 8);
      while (static_cast<int32_t>(seq.tokens.size()) < target) {
        seq.tokens.push_back(uniform(0, 5));
      }
      const int32_t needed = m->BlocksNeeded(id, target);
      const int32_t free_before = m->num_free_blocks();
      const size_t table_before = m->BlockTable(id).size();
      const bool predicted = m->CanReserve(id, target);
      const absl::Status reserved = m->Reserve(id, target);
      ASSERT_EQ(reserved.ok(), predicted) << reserved;
      const int32_t want = (target + kBlockSize - 1) / kBlockSize;
      if (reserved.ok()) {
        ASSERT_EQ(m->BlockTable(id).size(),
                  std::max<size_t>(want, table_before));
        ASSERT_EQ(m->num_free_blocks(), free_before - needed);
        ASSERT_TRUE(m->MarkComputed(id, seq.tokens, target).ok());
        seq.computed = target;
      } else {
        ++refusals;
        ASSERT_EQ(reserved.code(), want > kBlocks
                                       ? absl::StatusCode::kInvalidArgument
                                       : absl::StatusCode::kResourceExhausted);
        ASSERT_GT(needed, free_before);
        ASSERT_EQ(m->BlockTable(id).size(), table_before);
        ASSERT_EQ(m->num_free_blocks(), free_before);
      }
    } else if (op < 85 && !live.empty()) {  // Free.
      auto it = live.begin();
      std::advance(it, uniform(0, live.size() - 1));
      ASSERT_TRUE(m->FreeSequence(it->first));
      live.erase(it);
    } else if (op < 87) {
      m->ClearCache();
    } else if (op < 88) {
      m->Reset();
      live.clear();
    } else {
      const std::vector<PrefixCacheEvent> events = m->TakeEvents();
      for (const auto& e : events) evictions_seen += e.kind == Kind::kRemoved;
      Apply(events, index);
      ASSERT_EQ(index.size(), static_cast<size_t>(m->num_cached_blocks()));
      for (const auto& stem : stems) {
        ASSERT_EQ(CountInIndex(index, stem, kBlockSize),
                  m->CountCachedPrefixBlocks(stem));
      }
    }
    const absl::Status ok = m->CheckInvariants();
    ASSERT_TRUE(ok.ok()) << "step " << step << ": " << ok;
    const KvBlockManagerStats s = m->stats();
    ASSERT_EQ(s.free_blocks + s.used_blocks, kBlocks);
    ASSERT_EQ(s.sequences, static_cast<int32_t>(live.size()));
    // Every live sequence's blocks are used, so they bound the used count.
    std::set<BlockId> held;
    for (const auto& [id, seq] : live) {
      for (const BlockId b : m->BlockTable(id)) held.insert(b);
    }
    ASSERT_EQ(static_cast<int32_t>(held.size()), s.used_blocks);
  }
  // The run exercised the interesting paths.
  EXPECT_GT(hits, 100);
  EXPECT_GT(refusals, 10);
  EXPECT_GT(evictions_seen, 10);
}

}  // namespace
}  // namespace pdserve::engine
