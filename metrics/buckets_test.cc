#include "metrics/buckets.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BucketsTest, CheckBucketsWantsFiniteIncreasingBounds) {
  EXPECT_TRUE(CheckBuckets({0.1, 0.2, 1}).ok());
  EXPECT_FALSE(CheckBuckets({}).ok());
  EXPECT_FALSE(CheckBuckets({1, 1}).ok());
  EXPECT_FALSE(CheckBuckets({2, 1}).ok());
  EXPECT_FALSE(CheckBuckets({1, std::numeric_limits<double>::infinity()}).ok());
  EXPECT_FALSE(CheckBuckets({std::nan("")}).ok());
}

TEST(BucketsTest, ExponentialBuckets) {
  absl::StatusOr<std::vector<double>> b = ExponentialBuckets(0.0005, 2, 4);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, ElementsAre(0.0005, 0.001, 0.002, 0.004));
  EXPECT_FALSE(ExponentialBuckets(0, 2, 4).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 1, 4).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 2, 0).ok());
}

TEST(BucketsTest, ExponentialRangeSpansTimeToFirstToken) {
  // 1 ms to 10 minutes, the time-to-first-token range of issue 17.
  absl::StatusOr<std::vector<double>> b =
      ExponentialBucketsRange(0.001, 600, 30);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 30);
  EXPECT_EQ(b->front(), 0.001);
  EXPECT_EQ(b->back(), 600);
  for (size_t i = 1; i < b->size(); ++i) {
    EXPECT_NEAR((*b)[i] / (*b)[i - 1], (*b)[1] / (*b)[0], 1e-9);
  }
  EXPECT_FALSE(ExponentialBucketsRange(1, 1, 5).ok());
  EXPECT_FALSE(ExponentialBucketsRange(1, 2, 1).ok());
}

TEST(BucketsTest, LinearBuckets) {
  absl::StatusOr<std::vector<double>> b = LinearBuckets(1, 2, 3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, ElementsAre(1, 3, 5));
  EXPECT_FALSE(LinearBuckets(1, 0, 3).ok());
}

TEST(BucketsTest, ParseBucketsFromAFlag) {
  absl::StatusOr<std::vector<double>> b = ParseBuckets("0.0005, 0.001,2.5");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, ElementsAre(0.0005, 0.001, 2.5));
  absl::StatusOr<std::vector<double>> bad = ParseBuckets("0.1,x");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'x'"));
  EXPECT_FALSE(ParseBuckets("").ok());
  EXPECT_FALSE(ParseBuckets("1,0.5").ok());
}

}  // namespace
}  // namespace pdserve::metrics
