#include "metrics/histogram_quantile.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Prometheus' own cases (promql/promqltest/testdata/histograms.test,
// "testhistogram" at 50m): buckets 0.1: 50, 0.2: 70, 1: 110, +Inf: 120.
TEST(HistogramQuantileTest, AgreesWithPrometheusOwnTestData) {
  const std::vector<ParsedBucket> positive = {
      {0.1, 50}, {0.2, 70}, {1, 110}, {kInf, 120}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.2, positive), 0.048);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, positive), 0.15);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.8, positive), 0.72);
  // A first bucket at or below 0 answers its bound: -0.2: 10, -0.1: 20,
  // 0.3: 20, +Inf: 30.
  const std::vector<ParsedBucket> negative = {
      {-0.2, 10}, {-0.1, 20}, {0.3, 20}, {kInf, 30}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.2, negative), -0.2);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, negative), -0.15);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.8, negative), 0.3);
}

TEST(HistogramQuantileTest, InterpolatesLinearlyInsideTheBucket) {
  const std::vector<ParsedBucket> b = {{1, 10}, {2, 20}, {kInf, 20}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, b), 1);     // rank 10: end of le=1
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.75, b), 1.5);  // rank 15: mid le=2
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.25, b), 0.5);  // from 0 to 1
  EXPECT_DOUBLE_EQ(HistogramQuantile(0, b), 0);
  EXPECT_DOUBLE_EQ(HistogramQuantile(1, b), 2);
}

TEST(HistogramQuantileTest, TheInfBucketAnswersTheHighestFiniteBound) {
  const std::vector<ParsedBucket> b = {{0.5, 2}, {1, 5}, {kInf, 10}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.9, b), 1);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.51, b), 1);
  EXPECT_DOUBLE_EQ(HistogramQuantile(1, b), 1);
}

TEST(HistogramQuantileTest, SortsMergesAndMakesCountsMonotonic) {
  // Out of order, and le=2 lower than le=1 (read at another moment):
  // raised to 5, so q=0.6 (rank 6) lies in le=4 from 2: 2 + 2 * 1/5.
  EXPECT_DOUBLE_EQ(
      HistogramQuantile(0.6, {{kInf, 10}, {2, 4}, {1, 5}, {4, 10}}), 2.4);
  // Two series with the same bounds, as `sum by (le)` leaves them.
  EXPECT_DOUBLE_EQ(
      HistogramQuantile(
          0.75, {{1, 4}, {2, 8}, {kInf, 8}, {1, 6}, {2, 12}, {kInf, 12}}),
      1.5);
}

TEST(HistogramQuantileTest, UndefinedCases) {
  const std::vector<ParsedBucket> b = {{1, 10}, {kInf, 20}};
  EXPECT_EQ(HistogramQuantile(-0.1, b), -kInf);
  EXPECT_EQ(HistogramQuantile(1.1, b), kInf);
  EXPECT_TRUE(std::isnan(HistogramQuantile(std::nan(""), b)));
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {})));
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {{1, 10}, {2, 20}})));
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {{kInf, 20}})));
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {{1, 0}, {kInf, 0}})));
}

}  // namespace
}  // namespace pdserve::metrics
