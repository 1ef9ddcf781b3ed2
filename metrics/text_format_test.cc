#include "metrics/text_format.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "metrics/registry.h"

namespace pdserve::metrics {
namespace {

MetricOptions Options(std::string name, std::string help,
                      std::vector<std::string> labels = {}) {
  MetricOptions o;
  o.name = std::move(name);
  o.help = std::move(help);
  o.label_names = std::move(labels);
  return o;
}

TEST(TextFormatTest, FormatsValuesAsPrometheusReadsThem) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-2.5), "-2.5");
  EXPECT_EQ(FormatValue(0.0005), "0.0005");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e-7), "1e-07");
  EXPECT_EQ(FormatValue(1e-5), "1e-05");
  EXPECT_EQ(FormatValue(123456), "123456");
  EXPECT_EQ(FormatValue(1e6), "1e+06");
  EXPECT_EQ(FormatValue(123456789012), "1.23456789012e+11");
  EXPECT_EQ(FormatValue(600), "600");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(TextFormatTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue(R"(a\b"c)"
                             "\n"
                             "d"),
            R"(a\\b\"c\nd)");
  // HELP keeps double quotes as they are.
  EXPECT_EQ(EscapeHelp("say \"hi\"\\\n"), R"(say "hi"\\\n)");
}

TEST(TextFormatTest, GoldenRegistry) {
  Registry registry;
  CounterFamily* requests = *registry.AddCounter(
      Options("pdserve_requests_total", "Requests by status.", {"status"}));
  (*requests->WithLabels({"ok"}))->Inc(3);
  (*requests->WithLabels({"error"}))->Inc();
  GaugeFamily* running = *registry.AddGauge(
      Options("pdserve_requests_running", "Requests \\ running\nnow."));
  (*running->WithLabels({}))->Set(2);
  HistogramFamily* ttft = *registry.AddHistogram(
      Options("pdserve_time_to_first_token_seconds", "TTFT.", {"model"}),
      {0.0005, 0.01, 1});
  Histogram* h = *ttft->WithLabels({"tiny \"q4\"\\x\ny"});
  h->Observe(0.0005);
  h->Observe(0.25);
  h->Observe(30);
  HistogramFamily* step = *registry.AddHistogram(
      Options("pdserve_step_seconds", "Step time."), {0.5});
  (*step->WithLabels({}))->Observe(std::nan(""));
  ASSERT_TRUE(registry
                  .AddGaugeCallback(
                      Options("pdserve_free_ratio", "Free."),
                      [] { return std::numeric_limits<double>::infinity(); })
                  .ok());
  ASSERT_TRUE(
      registry
          .AddCounter(Options("pdserve_retries_total", "Retries.", {"reason"}))
          .ok());

  EXPECT_EQ(RenderText(registry),
            R"(# HELP pdserve_requests_total Requests by status.
# TYPE pdserve_requests_total counter
pdserve_requests_total{status="error"} 1
pdserve_requests_total{status="ok"} 3
# HELP pdserve_requests_running Requests \\ running\nnow.
# TYPE pdserve_requests_running gauge
pdserve_requests_running 2
# HELP pdserve_time_to_first_token_seconds TTFT.
# TYPE pdserve_time_to_first_token_seconds histogram
pdserve_time_to_first_token_seconds_bucket{model="tiny \"q4\"\\x\ny",le="0.0005"} 1
pdserve_time_to_first_token_seconds_bucket{model="tiny \"q4\"\\x\ny",le="0.01"} 1
pdserve_time_to_first_token_seconds_bucket{model="tiny \"q4\"\\x\ny",le="1"} 2
pdserve_time_to_first_token_seconds_bucket{model="tiny \"q4\"\\x\ny",le="+Inf"} 3
pdserve_time_to_first_token_seconds_sum{model="tiny \"q4\"\\x\ny"} 30.2505
pdserve_time_to_first_token_seconds_count{model="tiny \"q4\"\\x\ny"} 3
# HELP pdserve_step_seconds Step time.
# TYPE pdserve_step_seconds histogram
pdserve_step_seconds_bucket{le="0.5"} 0
pdserve_step_seconds_bucket{le="+Inf"} 1
pdserve_step_seconds_sum NaN
pdserve_step_seconds_count 1
# HELP pdserve_free_ratio Free.
# TYPE pdserve_free_ratio gauge
pdserve_free_ratio +Inf
# HELP pdserve_retries_total Retries.
# TYPE pdserve_retries_total counter
)");
}

TEST(TextFormatTest, EmptyRegistryRendersNothing) {
  Registry registry;
  EXPECT_EQ(RenderText(registry), "");
}

}  // namespace
}  // namespace pdserve::metrics
