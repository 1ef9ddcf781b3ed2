// A real Prometheus server (Debian's prometheus package) scrapes a local
// cluster (router, 1 prefill, 1 decode worker, the default model) every
// second while `pdctl bench` drives a fixed load; then its HTTP API is
// queried and held to the bench's own figures:
//   - pdserve_requests_total{status="ok"}, pdserve_prompt_tokens_total and
//     pdserve_generation_tokens_total equal the bench's counts exactly, and
//     the workers' pdserve_worker_generated_tokens_total add up to the same;
//   - histogram_quantile(0.5, ...) of the router's TTFT and ITL histograms
//     is the bench's p50 within the width of the bucket it falls in (the
//     server measures from arrival, the client from sending: the same
//     figure but for a loopback hop), and the buckets exported are the
//     contract's;
//   - every PromQL expression of deploy/grafana/pdserve.json, its variables
//     given their defaults and the served model, returns data, and every
//     series name it uses exists;
//   - `promtool check metrics` passes every process's /metrics page.
// Every query and its answer is printed, for the record.
//
// `pdctl bench` sends one warm-up request before its load (two output
// tokens, a prompt as long as the first request's); the servers count it,
// the bench's JSON does not, so the expected counts add it.
//
// To see a check fail, break what it guards: PDSERVE_METRICS_TEST_BREAK=
//   count      expects one request more than the bench sent;
//   dashboard  adds an expression with a misspelt metric name;
//   quantile   compares with 8 x the bench's TTFT and ITL p50s. A bucket
//              is a factor of 1.58 wide for TTFT and 2 for ITL, so the
//              check is coarse: it catches a factor of 2.5 (TTFT) to 4
//              (ITL) or more, a wrong unit or clock, not a small bias;
//   promtool   adds a counter without `_total` to the router's page.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "metrics/buckets.h"
#include "model/default_model.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testing.h"
#include "tests/metrics/prometheus_testing.h"

namespace pdserve {
namespace {

using json = nlohmann::json;
using testing::PrometheusServer;

constexpr int kRequests = 24;
constexpr int kPromptTokens = 64;
constexpr int kOutputTokens = 16;
// The warm-up request's output (bench_command.cc: min(output_tokens, 2)).
constexpr int kWarmUpOutputTokens = 2;
constexpr absl::Duration kScrapeInterval = absl::Seconds(1);

std::string BreakMode() {
  const char* mode = std::getenv("PDSERVE_METRICS_TEST_BREAK");
  return mode == nullptr ? "" : mode;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The bucket [lower, upper] of `bounds` (+Inf implicit) that holds `value`.
std::pair<double, double> BucketOf(const std::vector<double>& bounds,
                                   double value) {
  double lower = 0;
  for (double upper : bounds) {
    if (value <= upper) return {lower, upper};
    lower = upper;
  }
  return {lower, HUGE_VAL};
}

class PrometheusScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::DefaultModelPathOrEmpty().empty()) {
      GTEST_SKIP() << model::kNoDefaultModel;
    }
    for (const char* binary :
         {testing::kPrometheusBinary, testing::kPromtoolBinary}) {
      ASSERT_EQ(::access(binary, X_OK), 0)
          << binary
          << " is missing: install Debian's prometheus package "
             "(scripts/setup.sh does)";
    }
    work_dir_ = testing::MakeWorkDir("prometheus-scrape");
    cli::LocalClusterOptions options;
    options.bin_dir = testing::BinDir();
    options.work_dir = work_dir_;
    options.model_path = testing::DefaultModelPathOrEmpty();
    options.worker_args = {"--threads=1", "--kv_cache_mb=64"};
    options.startup_timeout = absl::Seconds(60);
    auto cluster = cli::LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  void TearDown() override {
    // Prometheus first: it would log every failed scrape of a stopped
    // process.
    if (prometheus_ != nullptr) prometheus_->Stop();
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop(absl::Seconds(20)).ok());
    }
  }

  // Where each process serves /metrics (LocalProcess::metrics_address:
  // the router's HTTP port, a worker's --metrics_listen port, both from
  // their port files).
  std::map<std::string, std::string> MetricsAddresses() {
    std::map<std::string, std::string> addresses;
    for (const cli::LocalProcess& p : cluster_->processes()) {
      EXPECT_FALSE(p.metrics_address.empty())
          << p.name << " reported no metrics address";
      if (!p.metrics_address.empty()) addresses[p.name] = p.metrics_address;
    }
    return addresses;
  }

  // Runs the query, prints it with its answer, returns the answer's data.
  json Ask(const std::string& promql) {
    absl::StatusOr<json> data = prometheus_->Query(promql);
    if (!data.ok()) {
      std::cout << "PromQL: " << promql << "\n  => ERROR " << data.status()
                << std::endl;
      ADD_FAILURE() << data.status();
      return json::object(
          {{"resultType", "vector"}, {"result", json::array()}});
    }
    std::cout << "PromQL: " << promql << "\n  => "
              << testing::DescribeResult(*data) << std::endl;
    return *data;
  }

  // A query whose answer must be one sample; its value (NaN if not).
  double AskScalar(const std::string& promql) {
    absl::StatusOr<double> value = prometheus_->QueryScalar(promql);
    std::cout << "PromQL: " << promql << "\n  => "
              << (value.ok() ? absl::StrCat(*value)
                             : absl::StrCat("ERROR ", value.status().message()))
              << std::endl;
    EXPECT_TRUE(value.ok()) << value.status();
    return value.ok() ? *value : std::nan("");
  }

  std::string work_dir_;
  std::unique_ptr<cli::LocalCluster> cluster_;
  std::unique_ptr<PrometheusServer> prometheus_;
};

TEST_F(PrometheusScrapeTest, CountersQuantilesDashboardAndPromtool) {
  const std::map<std::string, std::string> addresses = MetricsAddresses();
  ASSERT_EQ(addresses.size(), 3u);

  // promtool on every process's page, before any load too: a family must
  // be well-formed from the start, not only once it has samples.
  for (const auto& [name, address] : addresses) {
    absl::StatusOr<std::string> text = testing::FetchMetrics(address);
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    testing::PromtoolResult check = testing::PromtoolCheckMetrics(
        *text, work_dir_, absl::StrCat(name, "-idle"));
    EXPECT_EQ(check.exit_code, 0)
        << "promtool check metrics on " << name << " (idle):\n"
        << check.output;
    EXPECT_EQ(check.output, "") << name;
  }

  testing::PrometheusOptions options;
  options.work_dir = work_dir_;
  options.scrape_interval = kScrapeInterval;
  options.jobs = {{"pdserve-router", {addresses.at("router")}},
                  {"pdserve-prefill", {addresses.at("prefill-0")}},
                  {"pdserve-decode", {addresses.at("decode-0")}}};
  const absl::Time prometheus_start = absl::Now();
  auto prometheus = PrometheusServer::Start(options);
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  prometheus_ = std::move(*prometheus);
  const absl::Status up =
      prometheus_->AwaitScrapedAfter(prometheus_start, absl::Seconds(30));
  ASSERT_TRUE(up.ok()) << up << "\nprometheus log:\n"
                       << cli::TailOfFile(prometheus_->log_path());
  std::cout << "Prometheus " << prometheus_->url()
            << " scrapes every 1 s: router " << addresses.at("router")
            << ", prefill " << addresses.at("prefill-0") << ", decode "
            << addresses.at("decode-0") << std::endl;

  // The load: the real pdctl bench, Poisson arrivals, fixed lengths.
  const std::string bench_json = absl::StrCat(work_dir_, "/bench.json");
  SubprocessOptions bench;
  bench.argv = {absl::StrCat(testing::BinDir(), "/cli/pdctl"),
                "bench",
                absl::StrCat("--target=grpc://", cluster_->router_address()),
                "--workload=fixed",
                absl::StrCat("--num_requests=", kRequests),
                absl::StrCat("--prompt_tokens=", kPromptTokens),
                absl::StrCat("--output_tokens=", kOutputTokens),
                "--request_rate=6",
                "--seed=17",
                "--timeout_s=120",
                absl::StrCat("--json=", bench_json)};
  bench.log_path = absl::StrCat(work_dir_, "/bench.log");
  auto bench_process = Subprocess::Start(bench);
  ASSERT_TRUE(bench_process.ok()) << bench_process.status();
  absl::StatusOr<int> bench_status = (*bench_process)->Wait(absl::Seconds(150));
  ASSERT_TRUE(bench_status.ok())
      << "pdctl bench did not finish: " << cli::TailOfFile(bench.log_path);
  ASSERT_EQ(*bench_status, 0) << DescribeWaitStatus(*bench_status) << "\n"
                              << cli::TailOfFile(bench.log_path);
  const absl::Time bench_end = absl::Now();
  std::cout << cli::TailOfFile(bench.log_path, 1500) << std::endl;

  const json report = json::parse(ReadFile(bench_json));
  const json& run = report["runs"][0];
  ASSERT_EQ(run["failed"].get<int64_t>(), 0) << run.dump(1);
  int64_t ok_requests = 0, prompt_tokens = 0, output_tokens = 0;
  for (const json& r : run["requests"]) {
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    ++ok_requests;
    prompt_tokens += r["prompt_tokens"].get<int64_t>();
    output_tokens += r["output_tokens"].get<int64_t>();
  }
  ASSERT_EQ(ok_requests, kRequests);
  EXPECT_EQ(output_tokens, kRequests * kOutputTokens);
  // The warm-up request.
  ok_requests += 1;
  prompt_tokens += run["requests"][0]["prompt_tokens"].get<int64_t>();
  output_tokens += kWarmUpOutputTokens;
  if (BreakMode() == "count") ok_requests += 1;

  // Two more scrape intervals, and a scrape of every target that began
  // after the last answer.
  absl::SleepFor(2 * kScrapeInterval);
  const absl::Status scraped =
      prometheus_->AwaitScrapedAfter(bench_end, absl::Seconds(10));
  ASSERT_TRUE(scraped.ok()) << scraped;

  // The served model's name, as the router labels its series.
  const json models = Ask("group by (model) (pdserve_requests_total)");
  ASSERT_EQ(models["result"].size(), 1u);
  const std::string model =
      models["result"][0]["metric"]["model"].get<std::string>();

  // --- Counters: exactly the bench's counts.
  EXPECT_EQ(AskScalar(R"(sum(pdserve_requests_total{status="ok"}))"),
            ok_requests);
  EXPECT_EQ(
      AskScalar(R"(sum(pdserve_requests_total{status!="ok"}) or vector(0))"),
      0);
  EXPECT_EQ(AskScalar("sum(pdserve_prompt_tokens_total)"), prompt_tokens);
  EXPECT_EQ(AskScalar("sum(pdserve_generation_tokens_total)"), output_tokens);
  EXPECT_EQ(AskScalar("sum(pdserve_request_success_total)"), ok_requests);
  // Each worker counts the tokens it produced (the prefill worker the first
  // of each request it prefilled, the decode worker the rest); together
  // they are the router's.
  Ask("sum by (role) (pdserve_worker_generated_tokens_total)");
  EXPECT_EQ(AskScalar("sum(pdserve_worker_generated_tokens_total)"),
            output_tokens);
  EXPECT_EQ(AskScalar("sum(pdserve_e2e_request_latency_seconds_count)"),
            ok_requests);
  EXPECT_EQ(AskScalar("sum(pdserve_time_to_first_token_seconds_count)"),
            ok_requests);
  // The length distributions a planner reads: one arrival per request, and
  // sums equal to the token counters.
  EXPECT_EQ(AskScalar("sum(pdserve_request_prompt_tokens_count)"), ok_requests);
  EXPECT_EQ(AskScalar("sum(pdserve_request_prompt_tokens_sum)"), prompt_tokens);
  EXPECT_EQ(AskScalar("sum(pdserve_request_generation_tokens_count)"),
            ok_requests);
  EXPECT_EQ(AskScalar("sum(pdserve_request_generation_tokens_sum)"),
            output_tokens);

  // --- Quantiles: the bench's p50 within the width of its bucket.
  // The exported buckets are the contract's (ExponentialBucketsRange(0.001,
  // 600, 30) for TTFT, ExponentialBuckets(0.0005, 2, 14) for ITL).
  const std::vector<double> ttft_bounds =
      *metrics::ExponentialBucketsRange(0.001, 600, 30);
  const std::vector<double> itl_bounds =
      *metrics::ExponentialBuckets(0.0005, 2, 14);
  auto exported_bounds = [&](const std::string& family) {
    std::vector<double> bounds;
    const json data = Ask(absl::StrCat("count by (le) (", family, "_bucket)"));
    for (const json& s : data["result"]) {
      double le = 0;
      if (absl::SimpleAtod(s["metric"]["le"].get<std::string>(), &le) &&
          std::isfinite(le)) {
        bounds.push_back(le);
      }
    }
    std::sort(bounds.begin(), bounds.end());
    return bounds;
  };
  EXPECT_EQ(exported_bounds("pdserve_time_to_first_token_seconds"),
            ttft_bounds);
  EXPECT_EQ(exported_bounds("pdserve_inter_token_latency_seconds"), itl_bounds);

  struct QuantileCheck {
    std::string family;
    std::string bench_field;
    const std::vector<double>* bounds;
  };
  for (const QuantileCheck& c :
       {QuantileCheck{"pdserve_time_to_first_token_seconds", "ttft_ms",
                      &ttft_bounds},
        QuantileCheck{"pdserve_inter_token_latency_seconds", "itl_ms",
                      &itl_bounds}}) {
    double bench_p50 = run[c.bench_field]["p50"].get<double>() / 1000;
    if (BreakMode() == "quantile") bench_p50 *= 8;
    // Directly on the cumulative buckets: the cluster served nothing but
    // the bench (and its warm-up request).
    const double server_p50 = AskScalar(absl::StrCat(
        "histogram_quantile(0.5, sum by (le) (", c.family, "_bucket))"));
    const auto [lower, upper] = BucketOf(*c.bounds, bench_p50);
    const auto [server_lower, server_upper] = BucketOf(*c.bounds, server_p50);
    const double width = std::max(upper - lower, server_upper - server_lower);
    std::cout << absl::StrFormat(
                     "%s p50: bench %.4f s (bucket %.4f..%.4f), "
                     "Prometheus %.4f s, allowed difference %.4f s",
                     c.bench_field, bench_p50, lower, upper, server_p50, width)
              << std::endl;
    EXPECT_LE(std::abs(server_p50 - bench_p50), width)
        << c.family << ": Prometheus p50 " << server_p50 << " s, bench p50 "
        << bench_p50 << " s, bucket " << lower << ".." << upper;
  }

  // --- The dashboard: every expression returns data.
  const std::string dashboard =
      absl::StrCat(testing::BinDir(), "/deploy/grafana/pdserve.json");
  auto queries = testing::DashboardQueries(dashboard);
  ASSERT_TRUE(queries.ok()) << queries.status();
  auto values = testing::DashboardDefaults(dashboard);
  ASSERT_TRUE(values.ok()) << values.status();
  (*values)["model"] = model;
  if (BreakMode() == "dashboard") {
    queries->push_back(
        {"broken on purpose", "sum(rate(pdserve_generation_token_total[1m]))"});
  }
  auto names = prometheus_->MetricNames();
  ASSERT_TRUE(names.ok()) << names.status();
  const std::set<std::string> known(names->begin(), names->end());
  for (const testing::DashboardQuery& q : *queries) {
    auto expr = testing::SubstituteVariables(q.expr, *values);
    ASSERT_TRUE(expr.ok()) << q.panel << ": " << expr.status();
    for (const std::string& name : testing::MetricNamesIn(*expr)) {
      EXPECT_TRUE(known.count(name))
          << "dashboard panel '" << q.panel << "' uses " << name
          << ", which no process exports";
    }
    const json data = Ask(*expr);
    EXPECT_FALSE(data["result"].empty())
        << "dashboard panel '" << q.panel << "': no data for " << *expr;
  }

  // --- promtool on every page again, now that every family has samples.
  for (const auto& [name, address] : addresses) {
    absl::StatusOr<std::string> text = testing::FetchMetrics(address);
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    if (BreakMode() == "promtool" && name == "router") {
      *text +=
          "# HELP pdserve_broken Broken.\n# TYPE pdserve_broken counter\n"
          "pdserve_broken 1\n";
    }
    testing::PromtoolResult check =
        testing::PromtoolCheckMetrics(*text, work_dir_, name);
    std::cout << "promtool check metrics < " << name << " /metrics ("
              << text->size() << " bytes): exit " << check.exit_code
              << (check.output.empty() ? "" : ", ") << check.output
              << std::endl;
    EXPECT_EQ(check.exit_code, 0) << name << ":\n" << check.output;
    EXPECT_EQ(check.output, "") << name;
  }
}

}  // namespace
}  // namespace pdserve
