#include "metrics/histogram.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

using ::testing::ElementsAre;

TEST(HistogramTest, CountsEachValueInTheFirstBucketItIsAtMost) {
  Histogram h({1, 2, 5});
  EXPECT_THAT(h.CumulativeCounts(), ElementsAre(0, 0, 0, 0));
  h.Observe(0.5);  // le=1
  h.Observe(1);    // le=1: bounds are inclusive
  h.Observe(1.5);  // le=2
  h.Observe(5);    // le=5
  h.Observe(7);    // +Inf only
  EXPECT_THAT(h.CumulativeCounts(), ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(h.Count(), 5);
  EXPECT_EQ(h.Sum(), 15);
}

TEST(HistogramTest, NegativeInfiniteAndNaNValues) {
  Histogram h({0, 1});
  h.Observe(-2);  // le=0
  h.Observe(std::numeric_limits<double>::infinity());
  EXPECT_THAT(h.CumulativeCounts(), ElementsAre(1, 1, 2));
  h.Observe(std::nan(""));  // +Inf only, never the first bucket
  EXPECT_THAT(h.CumulativeCounts(), ElementsAre(1, 1, 3));
  EXPECT_TRUE(std::isnan(h.Sum()));
}

TEST(HistogramTest, ManyThreadsObservingKeepExactTotals) {
  Histogram h({0.001, 0.01, 0.1, 1});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50000;
  // Exactly representable values, so the sum is exact whatever the order.
  const double values[] = {0.0078125, 0.0625, 0.5, 4};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, &values] {
      for (int i = 0; i < kPerThread; ++i) h.Observe(values[i % 4]);
    });
  }
  for (std::thread& t : threads) t.join();
  const uint64_t quarter = kThreads * kPerThread / 4;
  EXPECT_THAT(h.CumulativeCounts(),
              ElementsAre(0, quarter, 2 * quarter, 3 * quarter, 4 * quarter));
  EXPECT_EQ(h.Sum(), quarter * (0.0078125 + 0.0625 + 0.5 + 4));
}

}  // namespace
}  // namespace pdserve::metrics
