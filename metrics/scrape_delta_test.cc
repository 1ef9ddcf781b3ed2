#include "metrics/scrape_delta.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/histogram_quantile.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"
#include "metrics/text_parse.h"

namespace pdserve::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

ParsedMetrics Parse(const std::string& text) {
  absl::StatusOr<ParsedMetrics> parsed = ParseText(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *parsed : ParsedMetrics();
}

ParsedMetrics Scrape(const Registry& registry) {
  return Parse(RenderText(registry));
}

MetricOptions Options(std::string name, std::vector<std::string> labels) {
  MetricOptions o;
  o.name = std::move(name);
  o.help = "Help.";
  o.label_names = std::move(labels);
  return o;
}

std::vector<double> Counts(const std::vector<ParsedBucket>& buckets) {
  std::vector<double> out;
  for (const ParsedBucket& b : buckets) out.push_back(b.cumulative_count);
  return out;
}

TEST(ScrapeDeltaTest, CounterIncreaseBetweenTwoScrapesOfARealRegistry) {
  Registry registry;
  CounterFamily* requests =
      *registry.AddCounter(Options("pdserve_requests_total", {"status"}));
  (*requests->WithLabels({"ok"}))->Inc(10);
  const ParsedMetrics t0 = Scrape(registry);
  (*requests->WithLabels({"ok"}))->Inc(5);
  (*requests->WithLabels({"cancelled"}))->Inc(2);  // new since t0: from 0
  const ParsedMetrics t1 = Scrape(registry);
  EXPECT_EQ(CounterIncrease(&t0, t1, "pdserve_requests_total"), 7);
  EXPECT_EQ(CounterIncrease(nullptr, t1, "pdserve_requests_total"), 17);
  EXPECT_EQ(CounterIncrease(&t0, t1, "pdserve_missing_total"), std::nullopt);
}

TEST(ScrapeDeltaTest, ACounterThatWentDownWasReset) {
  const ParsedMetrics before =
      Parse("a_total{w=\"1\"} 100\na_total{w=\"2\"} 5\n");
  const ParsedMetrics after = Parse("a_total{w=\"1\"} 3\na_total{w=\"2\"} 9\n");
  EXPECT_EQ(CounterIncrease(&before, after, "a_total"), 3 + 4);
}

TEST(ScrapeDeltaTest, GaugesInOneScrape) {
  const ParsedMetrics m =
      Parse("# TYPE g gauge\ng{a=\"1\"} 2\ng{a=\"2\"} 0.5\n# TYPE e gauge\n");
  EXPECT_EQ(GaugeSum(m, "g"), 2.5);
  EXPECT_EQ(GaugeMax(m, "g"), 2);
  EXPECT_EQ(GaugeSum(m, "e"), std::nullopt);
  EXPECT_EQ(GaugeMax(m, "missing"), std::nullopt);
}

TEST(ScrapeDeltaTest,
     BucketIncreaseSumsSeriesByBoundAndGivesTheWindowsQuantile) {
  Registry registry;
  HistogramFamily* itl = *registry.AddHistogram(
      Options("pdserve_inter_token_latency_seconds", {"model"}), {0.01, 0.1});
  Histogram* a = *itl->WithLabels({"a"});
  Histogram* b = *itl->WithLabels({"b"});
  // Before the window: slow tokens only.
  for (int i = 0; i < 100; ++i) a->Observe(0.05);
  const ParsedMetrics t0 = Scrape(registry);
  // In the window: 30 fast, 10 slow, spread over both series.
  for (int i = 0; i < 20; ++i) a->Observe(0.005);
  for (int i = 0; i < 10; ++i) b->Observe(0.005);
  for (int i = 0; i < 10; ++i) b->Observe(0.05);
  const ParsedMetrics t1 = Scrape(registry);

  const std::vector<ParsedBucket> delta =
      BucketIncrease(&t0, t1, "pdserve_inter_token_latency_seconds");
  ASSERT_EQ(delta.size(), 3);
  EXPECT_EQ(delta[0].upper_bound, 0.01);
  EXPECT_EQ(delta[2].upper_bound, kInf);
  EXPECT_THAT(Counts(delta), ::testing::ElementsAre(30, 40, 40));
  // p50 of the window: rank 20 of 30 in le=0.01, so 0.01 * 20/30; the
  // cumulative buckets since start would say rank 70 of 140, in le=0.1.
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, delta), 0.01 * 20 / 30);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.99, delta),
                   0.01 + 0.09 * (39.6 - 30) / 10);
  EXPECT_GT(HistogramQuantile(
                0.5, BucketIncrease(nullptr, t1,
                                    "pdserve_inter_token_latency_seconds")),
            0.01);
  EXPECT_TRUE(BucketIncrease(&t0, t1, "pdserve_missing_seconds").empty());
}

TEST(ScrapeDeltaTest, AHistogramWithABucketGoneDownWasReset) {
  const ParsedMetrics before = Parse(
      "# TYPE h histogram\n"
      "h_bucket{le=\"1\"} 50\nh_bucket{le=\"+Inf\"} 60\n");
  // Restarted: fewer observations in le=1, but more in +Inf than before.
  const ParsedMetrics after = Parse(
      "# TYPE h histogram\n"
      "h_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 70\n");
  EXPECT_THAT(Counts(BucketIncrease(&before, after, "h")),
              ::testing::ElementsAre(2, 70));
}

TEST(ScrapeDeltaTest, HistogramSumIncreaseFollowsEachSeriesAndItsResets) {
  const ParsedMetrics before = Parse(
      "# TYPE h histogram\n"
      "h_bucket{w=\"a\",le=\"+Inf\"} 4\nh_sum{w=\"a\"} 40\n"
      "h_count{w=\"a\"} 4\n"
      "h_bucket{w=\"b\",le=\"+Inf\"} 9\nh_sum{w=\"b\"} 90\n"
      "h_count{w=\"b\"} 9\n");
  // a grew by 2 observations summing 25; b restarted (its count went
  // down): all of its 3 observations, summing 12, are new; c is new.
  const ParsedMetrics after = Parse(
      "# TYPE h histogram\n"
      "h_bucket{w=\"a\",le=\"+Inf\"} 6\nh_sum{w=\"a\"} 65\n"
      "h_count{w=\"a\"} 6\n"
      "h_bucket{w=\"b\",le=\"+Inf\"} 3\nh_sum{w=\"b\"} 12\n"
      "h_count{w=\"b\"} 3\n"
      "h_bucket{w=\"c\",le=\"+Inf\"} 1\nh_sum{w=\"c\"} 7\n"
      "h_count{w=\"c\"} 1\n");
  EXPECT_EQ(HistogramSumIncrease(&before, after, "h"), 25 + 12 + 7);
  EXPECT_EQ(HistogramSumIncrease(nullptr, after, "h"), 65 + 12 + 7);
  EXPECT_FALSE(HistogramSumIncrease(&before, after, "missing").has_value());
}

}  // namespace
}  // namespace pdserve::metrics
