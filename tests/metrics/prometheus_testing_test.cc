// The Prometheus harness itself, against pd-metrics-demo (no model, no
// cluster): a real Prometheus scrapes it and answers queries; wrong queries
// and missing series are errors, not empty successes; promtool passes the
// demo's page and refuses a bad one; the dashboard's expressions all parse
// and take every variable they use.
#include "tests/metrics/prometheus_testing.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"

namespace pdserve::testing {
namespace {

TEST(SubstituteVariablesTest, ReplacesBothFormsAndRefusesUnknownNames) {
  const std::map<std::string, std::string> values = {{"model", "m"},
                                                     {"t", "0.5"}};
  EXPECT_EQ(*SubstituteVariables(R"(x{model=~"$model"} > ${t} + $t)", values),
            R"(x{model=~"m"} > 0.5 + 0.5)");
  EXPECT_FALSE(SubstituteVariables("rate(x[$__rate_interval])", values).ok());
}

TEST(MetricNamesInTest, FindsEverySeriesName) {
  EXPECT_EQ(MetricNamesIn("sum(rate(pdserve_a_bucket{le=\"1\"}[1m])) / "
                          "process_open_fds * on (job) pdserve_build_info"),
            (std::vector<std::string>{"pdserve_a_bucket", "pdserve_build_info",
                                      "process_open_fds"}));
}

TEST(DashboardTest, EveryExpressionTakesTheDefaults) {
  const std::string path =
      absl::StrCat(BinDir(), "/deploy/grafana/pdserve.json");
  auto queries = DashboardQueries(path);
  ASSERT_TRUE(queries.ok()) << queries.status();
  EXPECT_GT(queries->size(), 20u);
  auto values = DashboardDefaults(path);
  ASSERT_TRUE(values.ok()) << values.status();
  ASSERT_TRUE(values->count("ttft_slo_seconds"));
  ASSERT_TRUE(values->count("itl_slo_seconds"));
  (*values)["model"] = "m";
  for (const DashboardQuery& q : *queries) {
    auto expr = SubstituteVariables(q.expr, *values);
    EXPECT_TRUE(expr.ok()) << q.panel << ": " << expr.status();
    EXPECT_FALSE(MetricNamesIn(q.expr).empty() &&
                 q.expr.find("vector(") == std::string::npos)
        << q.panel << ": " << q.expr << " reads no pdserve metric";
  }
}

class PrometheusHarnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(kPrometheusBinary, X_OK), 0)
        << kPrometheusBinary
        << " is missing: install Debian's prometheus package "
           "(scripts/setup.sh does)";
    ASSERT_EQ(::access(kPromtoolBinary, X_OK), 0) << kPromtoolBinary;
    work_dir_ = MakeWorkDir("harness");
    auto port = FreeLoopbackPort();
    ASSERT_TRUE(port.ok()) << port.status();
    demo_address_ = absl::StrCat("127.0.0.1:", *port);
    SubprocessOptions demo;
    demo.argv = {absl::StrCat(BinDir(), "/metrics/pd-metrics-demo"),
                 absl::StrCat("--listen=", demo_address_)};
    demo.log_path = absl::StrCat(work_dir_, "/demo.log");
    auto started = Subprocess::Start(demo);
    ASSERT_TRUE(started.ok()) << started.status();
    demo_ = std::move(*started);
  }

  std::string work_dir_;
  std::string demo_address_;
  std::unique_ptr<Subprocess> demo_;
};

TEST_F(PrometheusHarnessTest, ScrapesAndAnswers) {
  PrometheusOptions options;
  options.work_dir = work_dir_;
  options.jobs = {{"demo", {demo_address_}}};
  const absl::Time start = absl::Now();
  auto prometheus = PrometheusServer::Start(options);
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  ASSERT_TRUE((*prometheus)->AwaitScrapedAfter(start, absl::Seconds(20)).ok());

  auto up = (*prometheus)->QueryScalar(R"(up{job="demo"})");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(*up, 1);
  auto tokens = (*prometheus)->QueryScalar("pdserve_demo_tokens_total");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_GT(*tokens, 0);
  auto itl = (*prometheus)
                 ->QueryScalar(
                     "histogram_quantile(0.5, sum by (le) "
                     "(pdserve_demo_inter_token_latency_seconds_bucket))");
  ASSERT_TRUE(itl.ok()) << itl.status();
  EXPECT_GT(*itl, 0.0005);
  EXPECT_LT(*itl, 0.032);

  // A typo'd name is an empty answer, which QueryScalar reports.
  EXPECT_EQ(
      (*prometheus)->QueryScalar("pdserve_demo_tokenz_total").status().code(),
      absl::StatusCode::kNotFound);
  // Bad PromQL is an error carrying Prometheus' message.
  auto bad = (*prometheus)->Query("sum(rate(x[1m])");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad_data"), std::string::npos)
      << bad.status();

  auto names = (*prometheus)->MetricNames();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_NE(
      std::find(names->begin(), names->end(), "process_resident_memory_bytes"),
      names->end());
}

TEST_F(PrometheusHarnessTest, PromtoolPassesTheDemoAndRefusesBadNames) {
  absl::StatusOr<std::string> text;
  for (int i = 0; i < 50; ++i) {
    text = FetchMetrics(demo_address_);
    if (text.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(text.ok()) << text.status();
  PromtoolResult good = PromtoolCheckMetrics(*text, work_dir_, "demo");
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_EQ(good.output, "");
  PromtoolResult bad = PromtoolCheckMetrics(
      "# HELP pdserve_requests Requests.\n"
      "# TYPE pdserve_requests counter\npdserve_requests 1\n",
      work_dir_, "bad");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
}

}  // namespace
}  // namespace pdserve::testing
