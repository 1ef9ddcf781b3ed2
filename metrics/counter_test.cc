#include "metrics/counter.h"

#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

TEST(CounterTest, StartsAtZeroAndCountsWholeAndFractionalIncrements) {
  Counter c;
  EXPECT_EQ(c.Value(), 0);
  c.Inc();
  c.Inc(41);
  EXPECT_EQ(c.Value(), 42);
  c.Add(0.25);
  c.Add(0.5);
  EXPECT_EQ(c.Value(), 42.75);
}

TEST(CounterTest, IgnoresNegativeAndNaNAdds) {
  Counter c;
  c.Inc(3);
  c.Add(-1);
  c.Add(std::nan(""));
  EXPECT_EQ(c.Value(), 3);
}

TEST(CounterTest, ConcurrentIncrementsAreAllCounted) {
  Counter c;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&c] {
      for (int i = 0; i < kPerThread; ++i) {
        c.Inc();
        c.Add(0.5);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.Value(), 1.5 * kThreads * kPerThread);
}

}  // namespace
}  // namespace pdserve::metrics
