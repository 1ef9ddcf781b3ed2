// `promtool check metrics` (Debian's prometheus package, which
// scripts/setup.sh installs) parses and lints what a registry holding every
// kind of metric renders: the same check issue 17 runs on every process's
// /metrics. A missing promtool fails the test rather than skipping it, so
// the suite cannot pass without the check.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "metrics/buckets.h"
#include "metrics/process_metrics.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"

namespace pdserve::metrics {
namespace {

constexpr char kPromtool[] = "/usr/bin/promtool";

std::string TempPath(absl::string_view name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct PromtoolResult {
  int exit_code = -1;
  std::string output;
};

// Runs `promtool check metrics` on `text`.
PromtoolResult CheckMetrics(const std::string& text, absl::string_view tag) {
  const std::string input = TempPath(absl::StrCat(tag, ".prom"));
  const std::string log = TempPath(absl::StrCat(tag, ".log"));
  std::ofstream(input) << text;
  std::ofstream(log).close();
  SubprocessOptions options;
  options.argv = {
      "/bin/sh", "-c",
      absl::StrCat("exec ", kPromtool, " check metrics < '", input, "'")};
  options.log_path = log;
  PromtoolResult result;
  absl::StatusOr<std::unique_ptr<Subprocess>> promtool =
      Subprocess::Start(options);
  if (!promtool.ok()) {
    result.output = std::string(promtool.status().message());
    return result;
  }
  absl::StatusOr<int> status = (*promtool)->Wait(absl::Seconds(60));
  result.output = ReadAll(log);
  if (status.ok() && WIFEXITED(*status))
    result.exit_code = WEXITSTATUS(*status);
  return result;
}

MetricOptions Options(std::string name, std::vector<std::string> labels = {}) {
  MetricOptions o;
  o.name = std::move(name);
  o.help = absl::StrCat("What ", o.name,
                        " measures, with \"quotes\", a \\ "
                        "and a\nnewline.");
  o.label_names = std::move(labels);
  return o;
}

class PromtoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(kPromtool, X_OK), 0)
        << kPromtool << " is missing: install Debian's prometheus package "
        << "(scripts/setup.sh does)";
  }
};

TEST_F(PromtoolTest, AcceptsEveryKindOfMetric) {
  Registry registry;
  ASSERT_TRUE(AddProcessMetrics(&registry).ok());
  CounterFamily* requests = *registry.AddCounter(
      Options("pdserve_requests_total", {"endpoint", "status"}));
  (*requests->WithLabels({"/v1/completions", "ok"}))->Inc(12);
  (*requests->WithLabels({"generate", "error \"quoted\"\\\nline"}))->Inc();
  (*(*registry.AddCounter(Options("pdserve_busy_seconds_total")))
        ->WithLabels({}))
      ->Add(0.125);
  ASSERT_TRUE(
      registry.AddCounter(Options("pdserve_retries_total", {"reason"})).ok());
  GaugeFamily* kv =
      *registry.AddGauge(Options("pdserve_kv_blocks", {"worker", "state"}));
  (*kv->WithLabels({"d0", "used"}))->Set(40);
  (*kv->WithLabels({"d0", "free"}))->Set(-1.5e-9);
  ASSERT_TRUE(registry
                  .AddGaugeCallback(
                      Options("pdserve_headroom_ratio"),
                      [] { return std::numeric_limits<double>::infinity(); })
                  .ok());
  HistogramFamily* itl = *registry.AddHistogram(
      Options("pdserve_inter_token_latency_seconds", {"model"}),
      *ExponentialBuckets(0.0005, 2, 14));
  Histogram* h = *itl->WithLabels({"smollm2"});
  for (int i = 0; i < 100; ++i) h->Observe(0.0001 * i * i);
  HistogramFamily* ttft =
      *registry.AddHistogram(Options("pdserve_time_to_first_token_seconds"),
                             *ExponentialBucketsRange(0.001, 600, 30));
  (*ttft->WithLabels({}))->Observe(std::nan(""));
  ASSERT_TRUE(
      registry
          .AddHistogram(Options("pdserve_step_seconds", {"pool"}), {0.01, 0.1})
          .ok());

  const std::string text = RenderText(registry);
  PromtoolResult result = CheckMetrics(text, "every_kind");
  EXPECT_EQ(result.exit_code, 0) << result.output << "\non:\n" << text;
  EXPECT_EQ(result.output, "") << text;
}

// The check is not vacuous: promtool does refuse what our naming rules
// keep out of a registry.
TEST_F(PromtoolTest, RefusesWhatTheNamingRulesKeepOut) {
  PromtoolResult result = CheckMetrics(
      "# HELP pdserve_latency_milliseconds Latency.\n"
      "# TYPE pdserve_latency_milliseconds gauge\n"
      "pdserve_latency_milliseconds 1\n"
      "# HELP pdserve_requests Requests.\n"
      "# TYPE pdserve_requests counter\n"
      "pdserve_requests 1\n",
      "bad_names");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("\"_total\" suffix"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("base unit"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace pdserve::metrics
