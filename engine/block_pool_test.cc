#include "engine/block_pool.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::unique_ptr<BlockPool> MakePool(int32_t num_blocks) {
  absl::StatusOr<std::unique_ptr<BlockPool>> pool =
      BlockPool::Create({.num_blocks = num_blocks});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(BlockPoolTest, CreateRejectsNonPositiveSizes) {
  for (int32_t n : {0, -1, -100}) {
    const absl::StatusOr<std::unique_ptr<BlockPool>> pool =
        BlockPool::Create({.num_blocks = n});
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument) << n;
  }
}

TEST(BlockPoolTest, FreshPoolIsAllFree) {
  std::unique_ptr<BlockPool> pool = MakePool(8);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_total(), 8);
  EXPECT_EQ(pool->num_free(), 8);
  for (BlockId id = 0; id < 8; ++id) EXPECT_EQ(pool->ref_count(id), 0);
  EXPECT_EQ(pool->ref_count(-1), 0);
  EXPECT_EQ(pool->ref_count(8), 0);
}

TEST(BlockPoolTest, AllocateIntoAppendsInPlaceAndLeavesTheTableOnError) {
  std::unique_ptr<BlockPool> pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  std::vector<BlockId> table = {7};  // ids already held, from elsewhere
  table.reserve(8);
  const BlockId* storage = table.data();
  ASSERT_TRUE(pool->AllocateInto(3, &table).ok());
  EXPECT_THAT(table, ElementsAre(7, 0, 1, 2));
  EXPECT_EQ(table.data(), storage) << "grew within the reserved room";
  const absl::Status too_many = pool->AllocateInto(2, &table);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(table, ElementsAre(7, 0, 1, 2));
  EXPECT_EQ(pool->num_free(), 1);
  EXPECT_EQ(pool->AllocateInto(-1, &table).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, AllocatesLowestIdsFirstUntilFull) {
  std::unique_ptr<BlockPool> pool = MakePool(5);
  ASSERT_NE(pool, nullptr);

  absl::StatusOr<std::vector<BlockId>> a = pool->Allocate(2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(0, 1));
  absl::StatusOr<std::vector<BlockId>> b = pool->Allocate(3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, ElementsAre(2, 3, 4));
  EXPECT_EQ(pool->num_free(), 0);
  for (BlockId id = 0; id < 5; ++id) EXPECT_EQ(pool->ref_count(id), 1);

  const absl::StatusOr<std::vector<BlockId>> c = pool->Allocate(1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("requested 1"));
  EXPECT_THAT(c.status().message(), HasSubstr("0 of 5 free"));

  // Zero blocks always succeeds, even when full.
  const absl::StatusOr<std::vector<BlockId>> empty = pool->Allocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(*empty, IsEmpty());

  // Freed blocks come back lowest first.
  ASSERT_TRUE(pool->Release({3, 1}).ok());
  absl::StatusOr<std::vector<BlockId>> d = pool->Allocate(2);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(*d, ElementsAre(1, 3));
}

TEST(BlockPoolTest, ExhaustedAllocationIsNotPartial) {
  std::unique_ptr<BlockPool> pool = MakePool(10);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->Allocate(7).ok());
  ASSERT_EQ(pool->num_free(), 3);

  const absl::StatusOr<std::vector<BlockId>> too_many = pool->Allocate(4);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_many.status().message(), HasSubstr("requested 4"));
  EXPECT_THAT(too_many.status().message(), HasSubstr("3 of 10 free"));
  // Nothing was taken: the 3 free blocks are still free and allocatable.
  EXPECT_EQ(pool->num_free(), 3);
  for (BlockId id = 7; id < 10; ++id) EXPECT_EQ(pool->ref_count(id), 0);
  absl::StatusOr<std::vector<BlockId>> rest = pool->Allocate(3);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_THAT(*rest, ElementsAre(7, 8, 9));
}

TEST(BlockPoolTest, NegativeAllocateIsInvalid) {
  std::unique_ptr<BlockPool> pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->Allocate(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->num_free(), 4);
}

TEST(BlockPoolTest, SharedBlockIsFreedOnlyAfterLastRelease) {
  std::unique_ptr<BlockPool> pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  absl::StatusOr<std::vector<BlockId>> ids = pool->Allocate(2);
  ASSERT_TRUE(ids.ok()) << ids.status();
  const BlockId shared = (*ids)[0];

  ASSERT_TRUE(pool->Ref(shared).ok());
  ASSERT_TRUE(pool->Ref(shared).ok());
  EXPECT_EQ(pool->ref_count(shared), 3);
  EXPECT_EQ(pool->num_free(), 2);

  ASSERT_TRUE(pool->Release({shared}).ok());
  EXPECT_EQ(pool->ref_count(shared), 2);
  EXPECT_EQ(pool->num_free(), 2);
  ASSERT_TRUE(pool->Release({shared}).ok());
  EXPECT_EQ(pool->ref_count(shared), 1);
  EXPECT_EQ(pool->num_free(), 2);
  ASSERT_TRUE(pool->Release({shared}).ok());
  EXPECT_EQ(pool->ref_count(shared), 0);
  EXPECT_EQ(pool->num_free(), 3);
  EXPECT_EQ(pool->ref_count((*ids)[1]), 1);
}

TEST(BlockPoolTest, OneReleaseCallMayDropSeveralReferencesToOneBlock) {
  std::unique_ptr<BlockPool> pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->Allocate(1).ok());
  ASSERT_TRUE(pool->Ref(0).ok());
  ASSERT_TRUE(pool->Release({0, 0}).ok());
  EXPECT_EQ(pool->ref_count(0), 0);
  EXPECT_EQ(pool->num_free(), 2);
}

TEST(BlockPoolTest, RefRejectsFreeAndOutOfRangeBlocks) {
  std::unique_ptr<BlockPool> pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->Ref(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Ref(-1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool->Ref(3).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool->ref_count(0), 0);
  EXPECT_EQ(pool->num_free(), 3);
}

TEST(BlockPoolTest, DoubleReleaseIsRejectedWithoutSideEffects) {
  std::unique_ptr<BlockPool> pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->Allocate(3).ok());  // 0, 1, 2
  ASSERT_TRUE(pool->Release({1}).ok());
  ASSERT_EQ(pool->num_free(), 2);

  // Block 1 is already free: the whole call fails and 0 and 2 keep their
  // references even though they come before/after it in the list.
  const absl::Status s = pool->Release({0, 1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("block 1"));
  EXPECT_EQ(pool->ref_count(0), 1);
  EXPECT_EQ(pool->ref_count(1), 0);
  EXPECT_EQ(pool->ref_count(2), 1);
  EXPECT_EQ(pool->num_free(), 2);

  // Releasing an allocated block twice in one call is also a double release.
  EXPECT_EQ(pool->Release({2, 0, 2}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->ref_count(0), 1);
  EXPECT_EQ(pool->ref_count(2), 1);
  EXPECT_EQ(pool->num_free(), 2);

  // And the free list is intact: exactly blocks 1 and 3 can be allocated.
  absl::StatusOr<std::vector<BlockId>> again = pool->Allocate(2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(*again, ElementsAre(1, 3));
}

TEST(BlockPoolTest, OutOfRangeReleaseIsRejectedWithoutSideEffects) {
  std::unique_ptr<BlockPool> pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->Allocate(2).ok());  // 0, 1
  for (const BlockId bad : {-1, 4, 1000}) {
    const absl::Status s = pool->Release({0, bad, 1});
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << bad;
    EXPECT_EQ(pool->ref_count(0), 1);
    EXPECT_EQ(pool->ref_count(1), 1);
    EXPECT_EQ(pool->num_free(), 2);
  }
  EXPECT_TRUE(pool->Release({}).ok());
  EXPECT_EQ(pool->num_free(), 2);
}

TEST(BlockPoolTest, ConcurrentAllocateRefRelease) {
  constexpr int32_t kTotal = 64;
  constexpr int kThreads = 4;
  constexpr int kIterations = 10000;
  std::unique_ptr<BlockPool> pool = MakePool(kTotal);
  ASSERT_NE(pool, nullptr);

  // held[t] lists the references thread t owns (a block appears once per
  // reference). Each thread touches only its own list until join.
  std::vector<std::vector<BlockId>> held(kThreads);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pool, &held, &failures, t] {
      std::mt19937 rng(1000 + t);
      std::vector<BlockId>& mine = held[t];
      for (int it = 0; it < kIterations; ++it) {
        const int action = std::uniform_int_distribution<int>(0, 9)(rng);
        if (action < 5) {
          const int32_t n = std::uniform_int_distribution<int32_t>(0, 8)(rng);
          absl::StatusOr<std::vector<BlockId>> got = pool->Allocate(n);
          if (got.ok()) {
            if (got->size() != static_cast<size_t>(n)) ++failures[t];
            mine.insert(mine.end(), got->begin(), got->end());
          } else if (got.status().code() !=
                     absl::StatusCode::kResourceExhausted) {
            ++failures[t];
          }
        } else if (action < 6) {
          if (mine.empty()) continue;
          const BlockId id = mine[std::uniform_int_distribution<size_t>(
              0, mine.size() - 1)(rng)];
          if (pool->Ref(id).ok()) {
            mine.push_back(id);
          } else {
            ++failures[t];
          }
        } else {
          if (mine.empty()) continue;
          const size_t k =
              std::uniform_int_distribution<size_t>(1, mine.size())(rng);
          std::shuffle(mine.begin(), mine.end(), rng);
          const std::vector<BlockId> drop(mine.end() - k, mine.end());
          if (pool->Release(drop).ok()) {
            mine.resize(mine.size() - k);
          } else {
            ++failures[t];
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();

  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(failures[t], 0) << "thread " << t;

  // Every reference any thread holds is accounted for in the pool, and the
  // allocated blocks plus the free ones are all the blocks.
  std::map<BlockId, int32_t> refs;
  for (const std::vector<BlockId>& mine : held) {
    for (const BlockId id : mine) ++refs[id];
  }
  for (const auto& [id, count] : refs) {
    EXPECT_EQ(pool->ref_count(id), count) << "block " << id;
  }
  const int32_t allocated = static_cast<int32_t>(refs.size());
  EXPECT_EQ(pool->num_free() + allocated, kTotal);
  int32_t nonzero = 0;
  for (BlockId id = 0; id < kTotal; ++id) nonzero += pool->ref_count(id) > 0;
  EXPECT_EQ(nonzero, allocated);

  for (const std::vector<BlockId>& mine : held) {
    ASSERT_TRUE(pool->Release(mine).ok());
  }
  EXPECT_EQ(pool->num_free(), kTotal);
  for (BlockId id = 0; id < kTotal; ++id) EXPECT_EQ(pool->ref_count(id), 0);
}

}  // namespace
}  // namespace pdserve::engine
