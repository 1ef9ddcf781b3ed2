#include "common/thread_pool.h"

#include <atomic>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::common {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
      }
    }
  }
}

TEST(ThreadPoolTest, GrainedChunksStartOnGrainBoundaries) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(100);
  std::atomic<int> misaligned{0};
  pool.ParallelForGrained(100, 16, [&](int64_t begin, int64_t end) {
    if (begin % 16 != 0) misaligned.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  EXPECT_EQ(misaligned.load(), 0);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, RunsWorkOnSeveralThreadsAndSurvivesManyCalls) {
  ThreadPool pool(2);
  // Many back-to-back loops (as a forward pass issues) with a sum that
  // depends on every element.
  std::vector<int64_t> data(4096);
  std::iota(data.begin(), data.end(), 0);
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<int64_t> partial(2, 0);
    std::atomic<int> calls{0};
    pool.ParallelFor(2, [&](int64_t begin, int64_t end) {
      calls.fetch_add(1);
      for (int64_t c = begin; c < end; ++c) {
        for (int64_t i = c * 2048; i < (c + 1) * 2048; ++i) {
          partial[c] += data[i];
        }
      }
    });
    ASSERT_EQ(calls.load(), 2);
    ASSERT_EQ(partial[0] + partial[1], 4095 * 4096 / 2);
  }
}

TEST(ThreadPoolTest, AvailableCpusIsPositive) { EXPECT_GE(AvailableCpus(), 1); }

}  // namespace
}  // namespace pdserve::common
