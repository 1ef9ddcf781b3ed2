#include "metrics/naming.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

using ::testing::HasSubstr;

std::string Why(absl::string_view name, MetricType type) {
  return std::string(CheckMetricName(name, type).message());
}

TEST(NamingTest, AcceptsConventionalNames) {
  EXPECT_TRUE(
      CheckMetricName("pdserve_requests_total", MetricType::kCounter).ok());
  EXPECT_TRUE(CheckMetricName("pdserve_time_to_first_token_seconds",
                              MetricType::kHistogram)
                  .ok());
  EXPECT_TRUE(
      CheckMetricName("pdserve_kv_blocks_used", MetricType::kGauge).ok());
  EXPECT_TRUE(CheckMetricName("pdserve_build_info", MetricType::kGauge).ok());
  for (absl::string_view standard : kStandardProcessMetrics) {
    MetricType type = standard == "process_cpu_seconds_total"
                          ? MetricType::kCounter
                          : MetricType::kGauge;
    EXPECT_TRUE(CheckMetricName(standard, type).ok()) << standard;
  }
}

TEST(NamingTest, RefusesNamesThatBreakAConvention) {
  EXPECT_THAT(Why("requests_total", MetricType::kCounter),
              HasSubstr("must start with 'pdserve_'"));
  EXPECT_THAT(Why("process_threads", MetricType::kGauge),
              HasSubstr("must start with 'pdserve_'"));
  EXPECT_THAT(Why("pdserve_Requests_total", MetricType::kCounter),
              HasSubstr("snake_case"));
  EXPECT_THAT(Why("pdserve:requests_total", MetricType::kCounter),
              HasSubstr("snake_case"));
  EXPECT_THAT(Why("pdserve_requests", MetricType::kCounter),
              HasSubstr("ends in _total"));
  EXPECT_THAT(Why("pdserve_running_total", MetricType::kGauge),
              HasSubstr("only counters"));
  EXPECT_THAT(Why("pdserve_latency_milliseconds", MetricType::kHistogram),
              HasSubstr("base unit 'seconds'"));
  EXPECT_THAT(Why("pdserve_kv_kilobytes", MetricType::kGauge),
              HasSubstr("base unit 'bytes'"));
  EXPECT_THAT(Why("pdserve_kv_usage_percent", MetricType::kGauge),
              HasSubstr("'ratio'"));
  EXPECT_THAT(Why("pdserve_step_ms", MetricType::kHistogram),
              HasSubstr("abbreviates a unit"));
  EXPECT_THAT(Why("pdserve_queue_h", MetricType::kHistogram),
              HasSubstr("abbreviates a unit"));
  EXPECT_THAT(Why("pdserve_requests_counter_total", MetricType::kCounter),
              HasSubstr("type word"));
  EXPECT_THAT(Why("pdserve_step_seconds_count", MetricType::kHistogram),
              HasSubstr("_bucket, _sum and _count"));
  EXPECT_FALSE(CheckMetricName("", MetricType::kGauge).ok());
}

TEST(NamingTest, LabelNames) {
  EXPECT_TRUE(CheckLabelNames({"model", "pool", "worker_id", "Status2"}).ok());
  EXPECT_THAT(CheckLabelNames({"le"}).message(), HasSubstr("reserved"));
  EXPECT_THAT(CheckLabelNames({"quantile"}).message(), HasSubstr("reserved"));
  EXPECT_THAT(CheckLabelNames({"__name"}).message(), HasSubstr("reserved"));
  EXPECT_THAT(CheckLabelNames({"a", "a"}).message(), HasSubstr("twice"));
  EXPECT_FALSE(CheckLabelNames({"9lives"}).ok());
  EXPECT_FALSE(CheckLabelNames({"with-dash"}).ok());
  EXPECT_FALSE(CheckLabelNames({""}).ok());
}

}  // namespace
}  // namespace pdserve::metrics
