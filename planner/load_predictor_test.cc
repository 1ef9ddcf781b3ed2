#include "planner/load_predictor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace pdserve::planner {
namespace {

TEST(LengthHistogramTest, QuantilesMeanAndExpectation) {
  LengthHistogram h;
  // 90 short prompts of 100 tokens, 10 long ones of 2000: the mean (280)
  // says little; the p90 and p99 tell the long tail.
  for (int i = 0; i < 90; ++i) h.Add(100);
  for (int i = 0; i < 10; ++i) h.Add(2000);
  EXPECT_DOUBLE_EQ(h.count(), 100);
  EXPECT_DOUBLE_EQ(h.Mean(), 290);
  // Within the buckets that hold them (bounds are √2 apart).
  EXPECT_GT(h.Quantile(0.5), 100 / std::sqrt(2.0));
  EXPECT_LE(h.Quantile(0.5), 100 * std::sqrt(2.0));
  EXPECT_GT(h.Quantile(0.99), 2000 / std::sqrt(2.0));
  EXPECT_LE(h.Quantile(0.99), 2000 * std::sqrt(2.0));
  // The expectation of the identity is the exact mean; of a square, near
  // the true 0.9·100² + 0.1·2000² = 409000 (within the bucket widths).
  EXPECT_NEAR(h.Expect([](double l) { return l; }), 290, 1e-9);
  EXPECT_NEAR(h.Expect([](double l) { return l * l; }), 409000, 0.15 * 409000);
  h.Scale(0.5);
  EXPECT_DOUBLE_EQ(h.count(), 50);
  EXPECT_DOUBLE_EQ(h.Mean(), 290);
  EXPECT_EQ(LengthHistogram().Quantile(0.5), 0);
  EXPECT_EQ(LengthHistogram().Expect([](double) { return 1.0; }), 0);
}

TEST(LengthHistogramTest, FromCumulativeReadsAScrapedHistogram) {
  // le=100: 3, le=200: 7, +Inf: 8, sum 1500.
  auto h = LengthHistogram::FromCumulative({100, 200}, {3, 7, 8}, 1500);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->counts(), (std::vector<double>{3, 4, 1}));
  EXPECT_DOUBLE_EQ(h->Mean(), 187.5);
  // Rank 4 of 8 is the first of 4 in (100, 200]: 125.
  EXPECT_DOUBLE_EQ(h->Quantile(0.5), 125);
  EXPECT_FALSE(LengthHistogram::FromCumulative({100, 200}, {3, 2, 8}, 1).ok());
  EXPECT_FALSE(LengthHistogram::FromCumulative({100, 200}, {3, 7}, 1).ok());
  EXPECT_FALSE(LengthHistogram::FromCumulative({200, 100}, {1, 2, 3}, 1).ok());
  EXPECT_FALSE(LengthHistogram::FromCumulative({100}, {1, 2}, -1).ok());
  LengthHistogram a;
  EXPECT_FALSE(a.Merge(*h).ok());
}

IntervalLoad Interval(double rate, double prompt = 200, double output = 100) {
  IntervalLoad l;
  l.duration_s = 30;
  l.requests = rate * 30;
  l.prompt.Add(prompt, l.requests);
  l.output.Add(output, l.requests);
  return l;
}

TEST(LoadPredictorTest, RampForecastLeadsTheLoad) {
  LoadPredictor p;
  for (double rate : {10, 12, 14, 16, 18, 20}) p.Observe(Interval(rate));
  const LoadForecast f = p.Predict(1);
  EXPECT_TRUE(f.warm);
  EXPECT_EQ(f.samples, 6);
  EXPECT_GT(f.trend, 1.0);  // about 2/s per interval
  EXPECT_LT(f.trend, 2.5);
  // Ahead of the latest 20/s, and further ahead for a longer horizon.
  EXPECT_GT(f.request_rate, 20.5);
  EXPECT_LT(f.request_rate, 24);
  EXPECT_GT(p.Predict(3).request_rate, f.request_rate + 2);
}

TEST(LoadPredictorTest, FallingLoadForecastNeverBelowTheLatest) {
  LoadPredictor p;
  for (double rate : {40, 35, 30, 25, 20}) p.Observe(Interval(rate));
  const LoadForecast f = p.Predict(1);
  EXPECT_LT(f.trend, 0);
  // The smoothed level lags above; the forecast follows it down but not
  // under what was just seen.
  EXPECT_GE(f.request_rate, 20);
  EXPECT_LT(f.request_rate, 30);
}

TEST(LoadPredictorTest, ColdStartUsesNoTrend) {
  LoadPredictor p;
  // Two samples, a steep rise: a slope from two points is noise (or a
  // start-up backlog); the forecast is what was seen, no extrapolation.
  p.Observe(Interval(2));
  p.Observe(Interval(20));
  const LoadForecast f = p.Predict(3);
  EXPECT_FALSE(f.warm);
  EXPECT_EQ(f.samples, 2);
  EXPECT_EQ(f.trend, 0);
  EXPECT_DOUBLE_EQ(f.request_rate, 20);
  // Intervals with a handful of requests are not samples at all.
  LoadPredictor q;
  for (int i = 0; i < 5; ++i) q.Observe(Interval(0.1));
  EXPECT_EQ(q.Predict().samples, 0);
}

TEST(LoadPredictorTest, TrendExtrapolationIsCapped) {
  LoadPredictor p;
  // 10x in one interval after a flat start: the forecast may not run away
  // with the jump's slope (half the level per interval at most).
  for (int i = 0; i < 4; ++i) p.Observe(Interval(10));
  p.Observe(Interval(100));
  const LoadForecast f = p.Predict(2);
  EXPECT_LE(f.request_rate, f.level * 2.0 + 1e-9);
  EXPECT_GE(f.request_rate, 100);  // the latest is still the floor
}

TEST(LoadPredictorTest, LengthsFollowRecentIntervals) {
  LoadPredictor p;
  for (int i = 0; i < 6; ++i) p.Observe(Interval(10, 100, 50));
  for (int i = 0; i < 6; ++i) p.Observe(Interval(10, 1000, 500));
  const LoadForecast f = p.Predict();
  // Decay 0.7: the last six intervals weigh 1 - 0.7^6 = 88 % of it.
  EXPECT_GT(f.prompt.Mean(), 850);
  EXPECT_GT(f.prompt.Quantile(0.5), 700);
  EXPECT_GT(f.output.Quantile(0.5), 350);
}

TEST(NormalQuantileTest, KnownValues) {
  EXPECT_NEAR(NormalQuantile(0.5), 0, 1e-9);
  EXPECT_NEAR(NormalQuantile(0.99), 2.3263, 1e-3);
  EXPECT_NEAR(NormalQuantile(0.9), 1.2816, 1e-3);
}

}  // namespace
}  // namespace pdserve::planner
