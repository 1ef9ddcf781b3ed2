#include "metrics/gauge.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

TEST(GaugeTest, SetAddAndSubtract) {
  Gauge g;
  EXPECT_EQ(g.Value(), 0);
  g.Set(10);
  g.Inc();
  g.Add(2.5);
  g.Dec();
  g.Sub(0.5);
  EXPECT_EQ(g.Value(), 12);
  g.Set(-3);
  EXPECT_EQ(g.Value(), -3);
}

TEST(GaugeTest, ConcurrentIncAndDecBalanceExactly) {
  Gauge g;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&g, t] {
      for (int i = 0; i < kPerThread; ++i) {
        g.Inc();
        if (t % 2 == 0) g.Dec();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(g.Value(), kThreads / 2 * kPerThread);
}

}  // namespace
}  // namespace pdserve::metrics
