#include "metrics/text_parse.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/buckets.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"

namespace pdserve::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

MetricOptions Options(std::string name, std::vector<std::string> labels = {}) {
  MetricOptions o;
  o.name = std::move(name);
  o.help = "Help with a \\ backslash\nand a newline.";
  o.label_names = std::move(labels);
  return o;
}

std::vector<double> Bounds(const ParsedHistogram& h) {
  std::vector<double> out;
  for (const ParsedBucket& b : h.buckets) out.push_back(b.upper_bound);
  return out;
}
std::vector<double> Counts(const ParsedHistogram& h) {
  std::vector<double> out;
  for (const ParsedBucket& b : h.buckets) out.push_back(b.cumulative_count);
  return out;
}

TEST(TextParseTest, ReadsBackWhatRenderTextWritesForARealRegistry) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  Registry registry;
  CounterFamily* requests = *registry.AddCounter(
      Options("pdserve_requests_total", {"model", "status"}));
  (*requests->WithLabels({"m\"1\\\n", "ok"}))->Inc(7);
  (*requests->WithLabels({"m2", "cancelled"}))->Inc();
  GaugeFamily* usage =
      *registry.AddGauge(Options("pdserve_kv_cache_usage_ratio"));
  (*usage->WithLabels({}))->Set(0.1 + 0.2);  // 0.30000000000000004
  HistogramFamily* ttft = *registry.AddHistogram(
      Options("pdserve_time_to_first_token_seconds", {"model"}),
      *ExponentialBuckets(0.0005, 2, 14));
  Histogram* a = *ttft->WithLabels({"a"});
  a->Observe(0.0004);
  a->Observe(0.003);
  a->Observe(100);  // +Inf only
  Histogram* b = *ttft->WithLabels({"b"});
  b->Observe(1e-5);

  absl::StatusOr<ParsedMetrics> parsed = ParseText(RenderText(registry));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->families.size(), 3);

  const ParsedFamily* r = parsed->Find("pdserve_requests_total");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->type, ParsedType::kCounter);
  EXPECT_EQ(r->help, "Help with a \\ backslash\nand a newline.");
  ASSERT_EQ(r->samples.size(), 2);
  EXPECT_EQ(r->samples[0].name, "pdserve_requests_total");
  EXPECT_EQ(r->samples[0].labels,
            (Labels{{"model", "m\"1\\\n"}, {"status", "ok"}}));
  EXPECT_EQ(r->samples[0].value, 7);
  EXPECT_EQ(r->samples[1].labels,
            (Labels{{"model", "m2"}, {"status", "cancelled"}}));
  EXPECT_EQ(r->samples[1].value, 1);

  const ParsedFamily* u = parsed->Find("pdserve_kv_cache_usage_ratio");
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->type, ParsedType::kGauge);
  ASSERT_EQ(u->samples.size(), 1);
  EXPECT_EQ(u->samples[0].value, 0.1 + 0.2);  // every digit read back
  EXPECT_TRUE(u->samples[0].labels.empty());

  const ParsedFamily* t = parsed->Find("pdserve_time_to_first_token_seconds");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, ParsedType::kHistogram);
  EXPECT_TRUE(t->samples.empty());
  ASSERT_EQ(t->histograms.size(), 2);
  const ParsedHistogram& ha = t->histograms[0];
  EXPECT_EQ(ha.labels, (Labels{{"model", "a"}}));
  std::vector<double> expected_bounds = *ExponentialBuckets(0.0005, 2, 14);
  expected_bounds.push_back(kInf);
  EXPECT_EQ(Bounds(ha), expected_bounds);
  //  0.0005: 1, 0.001: 1, 0.002: 1, 0.004: 2, ... 4.096: 2, +Inf: 3.
  std::vector<double> counts = Counts(ha);
  EXPECT_EQ(counts.front(), 1);
  EXPECT_EQ(counts[2], 1);
  EXPECT_EQ(counts[3], 2);
  EXPECT_EQ(counts[13], 2);
  EXPECT_EQ(counts[14], 3);
  EXPECT_EQ(ha.count, 3);
  EXPECT_DOUBLE_EQ(ha.sum, 100.0034);
  EXPECT_EQ(t->histograms[1].labels, (Labels{{"model", "b"}}));
  EXPECT_EQ(t->histograms[1].count, 1);
  EXPECT_EQ(t->histograms[1].buckets.front().cumulative_count, 1);

  EXPECT_EQ(parsed->Find("pdserve_missing"), nullptr);
}

TEST(TextParseTest, ReadsTheFormatsOtherLiberties) {
  const std::string text =
      "# a comment, ignored\n"
      "\n"
      "  # TYPE  up   gauge  \n"
      "up{job=\"a\",} 1 1700000000000\n"
      "up {job=\"b\" , instance = \"x\"}\t+Inf\n"
      "up{job=\"c\"} -inf\n"
      "up{job=\"d\"} NaN\n"
      "up{job=\"e\"} 1.5e-3\n"
      "no_type_line 42\n"
      "# TYPE rpc summary\n"
      "rpc{quantile=\"0.5\"} 0.2\n"
      "rpc_sum 10\n"
      "rpc_count 5\n"
      "# HELP h A histogram with buckets out of order.\n"
      "# TYPE h histogram\n"
      "h_bucket{le=\"+Inf\"} 4\n"
      "h_bucket{le=\"1e0\"} 3\n"
      "h_sum 2.5\n"
      "h_bucket{le=\"0.5\"} 1\n"
      "h_count 4";  // no final newline
  absl::StatusOr<ParsedMetrics> parsed = ParseText(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ParsedFamily* up = parsed->Find("up");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->type, ParsedType::kGauge);
  ASSERT_EQ(up->samples.size(), 5);
  EXPECT_EQ(up->samples[0].value, 1);
  EXPECT_EQ(up->samples[1].labels, (Labels{{"instance", "x"}, {"job", "b"}}));
  EXPECT_TRUE(std::isinf(up->samples[1].value) && up->samples[1].value > 0);
  EXPECT_TRUE(std::isinf(up->samples[2].value) && up->samples[2].value < 0);
  EXPECT_TRUE(std::isnan(up->samples[3].value));
  EXPECT_EQ(up->samples[4].value, 0.0015);

  const ParsedFamily* untyped = parsed->Find("no_type_line");
  ASSERT_NE(untyped, nullptr);
  EXPECT_EQ(untyped->type, ParsedType::kUntyped);
  EXPECT_EQ(untyped->samples[0].value, 42);

  const ParsedFamily* rpc = parsed->Find("rpc");
  ASSERT_NE(rpc, nullptr);
  EXPECT_EQ(rpc->type, ParsedType::kSummary);
  ASSERT_EQ(rpc->samples.size(), 3);
  EXPECT_EQ(rpc->samples[1].name, "rpc_sum");
  EXPECT_EQ(rpc->samples[2].name, "rpc_count");
  EXPECT_EQ(parsed->Find("rpc_sum"), nullptr);

  const ParsedFamily* h = parsed->Find("h");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->help, "A histogram with buckets out of order.");
  ASSERT_EQ(h->histograms.size(), 1);
  EXPECT_THAT(Bounds(h->histograms[0]),
              ElementsAre(0.5, 1, std::numeric_limits<double>::infinity()));
  EXPECT_THAT(Counts(h->histograms[0]), ElementsAre(1, 3, 4));
  EXPECT_EQ(h->histograms[0].sum, 2.5);
  EXPECT_EQ(h->histograms[0].count, 4);
  EXPECT_EQ(parsed->families.size(), 4);
}

TEST(TextParseTest, EmptyInputHasNoFamilies) {
  absl::StatusOr<ParsedMetrics> parsed = ParseText("");
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->families.empty());
}

struct BadCase {
  std::string text;
  std::string message;
};

TEST(TextParseTest, MalformedInputIsAnErrorNamingTheLine) {
  const std::vector<BadCase> cases = {
      {"ok 1\n1bad 1\n", "line 2: a sample must start with a metric name"},
      {"bad-name 1\n", "line 1: invalid character '-' after metric name bad"},
      {"x\n", "line 1: sample x has no value"},
      {"x one\n", "line 1: invalid value 'one' for x"},
      {"x 1e\n", "invalid value '1e'"},
      {"x ++1\n", "invalid value '++1'"},
      {"x 1 2 3\n", "line 1: invalid timestamp or trailing text"},
      {"x 1 1.5\n", "invalid timestamp"},
      {"x{a=\"1\" 1\n", "expected ',' or '}' after label a of x"},
      {"x{a=\"1\n", "unterminated value of label a of x"},
      {"x{a=1} 1\n", "label a of x needs a quoted value"},
      {"x{a} 1\n", "expected '=' after label a of x"},
      {"x{1a=\"\"} 1\n", "invalid label name in x"},
      {"x{a=\"\\t\"} 1\n", "invalid escape sequence in label a of x"},
      {"x{a=\"1\",a=\"2\"} 1\n", "label a twice in x"},
      {"x{a=\"1", "unterminated value of label a"},
      {"x{a=\"1\"", "expected ',' or '}' after label a"},
      {"x{", "unterminated label set of x"},
      {"x{a=\"1\"} 1\nx{a=\"1\"} 2\n", "line 2: duplicate series x{a=\"1\"}"},
      {"# TYPE x gauge\n# TYPE x gauge\n", "line 2: second TYPE line for x"},
      {"# HELP x a\n# HELP x b\n", "line 2: second HELP line for x"},
      {"x 1\n# TYPE x gauge\n", "line 2: TYPE line for x after its samples"},
      {"# TYPE x meter\n", "line 1: unknown type 'meter' for x"},
      {"# TYPE x gauge extra\n", "unknown type 'gauge extra' for x"},
      {"# TYPE\n", "line 1: TYPE line without a valid metric name"},
      {"# HELP x\\y bad\n", "invalid metric name in HELP line"},
      {"# HELP x bad \\t escape\n", "invalid escape sequence in HELP of x"},
      {"# TYPE h histogram\nh 1\n",
       "line 2: histogram h has a sample without _bucket, _sum or _count"},
      {"# TYPE h histogram\nh_bucket 1\n", "h_bucket without an le label"},
      {"# TYPE h histogram\nh_bucket{le=\"x\"} 1\n",
       "h_bucket has an invalid le \"x\""},
      {"# TYPE h histogram\nh_bucket{le=\"NaN\"} 1\n", "invalid le"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 1\n",
       "line 2: histogram h has no le=\"+Inf\" bucket"},
      {"# TYPE h histogram\nh_sum 1\nh_count 1\n",
       "histogram h has no le=\"+Inf\" bucket"},
      {"# TYPE h histogram\nh_bucket{a=\"1\",le=\"1\"} 5\n"
       "h_bucket{a=\"1\",le=\"+Inf\"} 4\n",
       "line 2: histogram h{a=\"1\"}: bucket counts decrease"},
      {"# TYPE h histogram\nh_bucket{le=\"+Inf\"} 4\nh_count 5\n",
       "_count 5 differs from the +Inf bucket 4"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"1.0\"} 1\n",
       "two buckets with the same bound in h"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<ParsedMetrics> parsed = ParseText(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.message))
        << c.text;
  }
}

// Every cut of a real scrape, and every single byte replaced by a few
// troublesome ones, parses or fails cleanly (run under ASan by
// scripts/test.sh).
TEST(TextParseTest, TruncatedOrCorruptedScrapesNeverCrash) {
  Registry registry;
  HistogramFamily* h = *registry.AddHistogram(
      Options("pdserve_inter_token_latency_seconds", {"model"}),
      *ExponentialBuckets(0.0005, 2, 4));
  (*h->WithLabels({"m"}))->Observe(0.001);
  (*(*registry.AddCounter(Options("pdserve_requests_total", {"status"})))
        ->WithLabels({"ok"}))
      ->Inc(3);
  const std::string text = RenderText(registry);
  int failures = 0;
  for (size_t n = 0; n <= text.size(); ++n) {
    failures += !ParseText(text.substr(0, n)).ok();
  }
  for (size_t i = 0; i < text.size(); ++i) {
    for (char c : {'\0', '"', '{', '}', '\\', '#', ' ', '\n', 'e'}) {
      std::string corrupted = text;
      corrupted[i] = c;
      failures += !ParseText(corrupted).ok();
    }
  }
  EXPECT_GT(failures, 0);  // the loop did meet malformed text
}

}  // namespace
}  // namespace pdserve::metrics
