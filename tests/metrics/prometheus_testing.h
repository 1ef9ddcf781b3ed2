// Helpers for tests that check pdserve's metrics with the real Prometheus
// server and promtool (Debian's prometheus package, which scripts/setup.sh
// installs): start a Prometheus that scrapes given targets, wait until it
// scrapes them, query its HTTP API; fetch a /metrics page; run `promtool
// check metrics`; read the PromQL expressions of a Grafana dashboard.
#ifndef PDSERVE_TESTS_METRICS_PROMETHEUS_TESTING_H_
#define PDSERVE_TESTS_METRICS_PROMETHEUS_TESTING_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"

namespace pdserve::testing {

inline constexpr char kPrometheusBinary[] = "/usr/bin/prometheus";
inline constexpr char kPromtoolBinary[] = "/usr/bin/promtool";

// One scrape job: its name (Prometheus' `job` label) and host:port targets,
// scraped at /metrics.
struct ScrapeJob {
  std::string name;
  std::vector<std::string> targets;
};

struct PrometheusOptions {
  std::string binary = kPrometheusBinary;
  // Config, TSDB and log go here; must exist.
  std::string work_dir;
  std::vector<ScrapeJob> jobs;
  absl::Duration scrape_interval = absl::Seconds(1);
  absl::Duration startup_timeout = absl::Seconds(30);
};

// A Prometheus server as a child process (common/subprocess.h): it is killed
// when the object is destroyed, and by the kernel if the test process dies,
// so a failing test leaves none behind.
// Thread-safety: not thread-safe; use from one thread.
class PrometheusServer {
 public:
  // Writes the config, starts the server on a free loopback port and waits
  // until its API answers. Errors carry the end of its log.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const PrometheusOptions& options);
  ~PrometheusServer();
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  // "http://127.0.0.1:PORT".
  const std::string& url() const { return url_; }
  const std::string& log_path() const { return log_path_; }

  // Waits until every configured target has been scraped successfully at
  // or after `since` (health "up"); DEADLINE_EXCEEDED lists those that are
  // not, with their last error.
  absl::Status AwaitScrapedAfter(absl::Time since, absl::Duration timeout);

  // GET /api/v1/query?query=...: the `data` object ({resultType, result})
  // of a successful answer; an error carries Prometheus' own message.
  absl::StatusOr<nlohmann::json> Query(const std::string& promql);
  // A query whose answer is one sample: its value (NaN stays NaN).
  // NOT_FOUND for an empty answer, FAILED_PRECONDITION for several series.
  absl::StatusOr<double> QueryScalar(const std::string& promql);

  // Every metric name Prometheus holds (GET /api/v1/label/__name__/values).
  absl::StatusOr<std::vector<std::string>> MetricNames();

  // Stops the server (SIGTERM, then SIGKILL after `grace`).
  void Stop(absl::Duration grace = absl::Seconds(5));

 private:
  PrometheusServer() = default;
  absl::StatusOr<nlohmann::json> Get(const std::string& path_and_query);

  std::unique_ptr<Subprocess> process_;
  std::string url_;
  std::string log_path_;
  int port_ = 0;
};

// A loopback port that was free a moment ago (bound, then released).
absl::StatusOr<int> FreeLoopbackPort();

// A short text for a query's answer: "{labels} value" per series.
std::string DescribeResult(const nlohmann::json& data);

// GET http://ADDRESS/metrics: the body of a 200 answer.
absl::StatusOr<std::string> FetchMetrics(const std::string& address);

struct PromtoolResult {
  int exit_code = -1;
  std::string output;
};
// `promtool check metrics` on `text` (file and output under `work_dir`,
// named after `tag`).
PromtoolResult PromtoolCheckMetrics(const std::string& text,
                                    const std::string& work_dir,
                                    const std::string& tag);

// One PromQL expression of a Grafana dashboard.
struct DashboardQuery {
  std::string panel;
  std::string expr;
};

// Every target expression of every panel (rows' nested panels included) of
// a Grafana dashboard JSON file.
absl::StatusOr<std::vector<DashboardQuery>> DashboardQueries(
    const std::string& path);

// The default value (`current.value`) of each of the dashboard's template
// variables that has a single one.
absl::StatusOr<std::map<std::string, std::string>> DashboardDefaults(
    const std::string& path);

// `expr` with Grafana's `$name` and `${name}` replaced from `values`;
// INVALID_ARGUMENT names a variable without a value.
absl::StatusOr<std::string> SubstituteVariables(
    const std::string& expr, const std::map<std::string, std::string>& values);

// The series names an expression selects: identifiers starting with
// `pdserve_` or `process_` (a histogram's as written, e.g. `..._bucket`).
std::vector<std::string> MetricNamesIn(const std::string& expr);

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_METRICS_PROMETHEUS_TESTING_H_
