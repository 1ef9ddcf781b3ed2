#include "tests/metrics/prometheus_testing.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/local_cluster.h"
#include "httplib.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

}  // namespace

// Another process may take the port before Prometheus binds it; Start()
// then sees the server exit and tries again.
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return absl::InternalError("cannot bind a loopback port");
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

namespace {

// Prometheus' durations: whole milliseconds ("1500ms").
std::string PromDuration(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Milliseconds(d), "ms");
}

std::string ConfigYaml(const PrometheusOptions& options) {
  std::string yaml = absl::StrCat(
      "global:\n  scrape_interval: ", PromDuration(options.scrape_interval),
      "\n  scrape_timeout: ", PromDuration(options.scrape_interval),
      "\n  evaluation_interval: ", PromDuration(options.scrape_interval),
      "\nscrape_configs:\n");
  for (const ScrapeJob& job : options.jobs) {
    absl::StrAppend(&yaml, "  - job_name: '", job.name,
                    "'\n    metrics_path: /metrics\n    static_configs:\n"
                    "      - targets: ['",
                    absl::StrJoin(job.targets, "', '"), "']\n");
  }
  return yaml;
}

absl::StatusOr<json> ParseApiAnswer(const httplib::Result& response,
                                    const std::string& what) {
  if (!response) {
    return absl::UnavailableError(absl::StrCat(
        what, ": no answer: ", httplib::to_string(response.error())));
  }
  json body = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return absl::InternalError(absl::StrCat(what, ": HTTP ", response->status,
                                            ", not JSON: ", response->body));
  }
  if (response->status != 200 || body.value("status", "") != "success") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": HTTP ", response->status, ": ", body.value("errorType", ""),
        ": ", body.value("error", ""), " ", response->body.substr(0, 500)));
  }
  return body["data"];
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const PrometheusOptions& options) {
  if (::access(options.binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.binary,
                     " is missing: install Debian's prometheus package "
                     "(scripts/setup.sh does)"));
  }
  const std::string config = absl::StrCat(options.work_dir, "/prometheus.yml");
  std::ofstream(config) << ConfigYaml(options);
  absl::Status last = absl::UnknownError("not started");
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto server = std::unique_ptr<PrometheusServer>(new PrometheusServer());
    auto port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    server->port_ = *port;
    server->url_ = absl::StrCat("http://127.0.0.1:", *port);
    server->log_path_ =
        absl::StrCat(options.work_dir, "/prometheus-", attempt, ".log");
    SubprocessOptions subprocess;
    subprocess.argv = {
        options.binary,
        absl::StrCat("--config.file=", config),
        absl::StrCat("--storage.tsdb.path=", options.work_dir, "/tsdb-",
                     attempt),
        absl::StrCat("--web.listen-address=127.0.0.1:", *port),
        // The test is the only user; no console templates needed.
        "--log.level=info",
    };
    subprocess.log_path = server->log_path_;
    auto process = Subprocess::Start(subprocess);
    if (!process.ok()) return process.status();
    server->process_ = std::move(*process);
    const absl::Time give_up = absl::Now() + options.startup_timeout;
    httplib::Client client(server->url_);
    client.set_connection_timeout(1);
    while (absl::Now() < give_up && server->process_->running()) {
      auto ready = client.Get("/-/ready");
      if (ready && ready->status == 200) return server;
      absl::SleepFor(absl::Milliseconds(100));
    }
    last = absl::UnavailableError(
        absl::StrCat("prometheus did not become ready on ", server->url_,
                     server->process_->running() ? " in time" : " (it exited)",
                     "; log:\n", cli::TailOfFile(server->log_path_)));
  }
  return last;
}

PrometheusServer::~PrometheusServer() { Stop(absl::Seconds(2)); }

void PrometheusServer::Stop(absl::Duration grace) {
  if (process_ != nullptr && process_->running()) process_->Stop(grace);
}

absl::StatusOr<json> PrometheusServer::Get(const std::string& path_and_query) {
  httplib::Client client(url_);
  client.set_read_timeout(30);
  return ParseApiAnswer(client.Get(path_and_query.c_str()), path_and_query);
}

absl::Status PrometheusServer::AwaitScrapedAfter(absl::Time since,
                                                 absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  std::vector<std::string> pending;
  while (true) {
    pending.clear();
    absl::StatusOr<json> data = Get("/api/v1/targets?state=active");
    if (!data.ok()) {
      pending.push_back(std::string(data.status().message()));
    } else if ((*data)["activeTargets"].empty()) {
      pending.push_back("no active targets yet");
    } else {
      for (const json& target : (*data)["activeTargets"]) {
        absl::Time last_scrape = absl::InfinitePast();
        std::string error;
        absl::ParseTime(absl::RFC3339_full,
                        target.value("lastScrape", std::string()), &last_scrape,
                        &error);
        const std::string health = target.value("health", "");
        if (health != "up" || last_scrape < since) {
          pending.push_back(absl::StrCat(
              target.value("scrapeUrl", "?"), " health=", health,
              " lastScrape=", target.value("lastScrape", std::string()),
              " lastError=", target.value("lastError", std::string())));
        }
      }
    }
    if (pending.empty()) return absl::OkStatus();
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("targets not scraped: ", absl::StrJoin(pending, "; ")));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<json> PrometheusServer::Query(const std::string& promql) {
  httplib::Client client(url_);
  client.set_read_timeout(30);
  httplib::Params form{{"query", promql}};
  return ParseApiAnswer(client.Post("/api/v1/query", form), promql);
}

absl::StatusOr<double> PrometheusServer::QueryScalar(
    const std::string& promql) {
  absl::StatusOr<json> data = Query(promql);
  if (!data.ok()) return data.status();
  const json& result = (*data)["result"];
  std::string text;
  if ((*data)["resultType"] == "scalar") {
    text = result[1].get<std::string>();
  } else if (result.size() == 1) {
    text = result[0]["value"][1].get<std::string>();
  } else if (result.empty()) {
    return absl::NotFoundError(absl::StrCat("no data for ", promql));
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        result.size(), " series for ", promql, ": ", DescribeResult(*data)));
  }
  if (text == "NaN") return std::nan("");
  if (text == "+Inf") return HUGE_VAL;
  if (text == "-Inf") return -HUGE_VAL;
  double value = 0;
  if (!absl::SimpleAtod(text, &value)) {
    return absl::InternalError(absl::StrCat("bad sample '", text, "'"));
  }
  return value;
}

absl::StatusOr<std::vector<std::string>> PrometheusServer::MetricNames() {
  absl::StatusOr<json> data = Get("/api/v1/label/__name__/values");
  if (!data.ok()) return data.status();
  return data->get<std::vector<std::string>>();
}

std::string DescribeResult(const json& data) {
  const json& result = data["result"];
  if (data.value("resultType", "") == "scalar") {
    return absl::StrCat("scalar ", result[1].get<std::string>());
  }
  std::vector<std::string> parts;
  for (const json& series : result) {
    std::vector<std::string> labels;
    for (const auto& [name, value] : series["metric"].items()) {
      labels.push_back(
          absl::StrCat(name, "=\"", value.get<std::string>(), "\""));
    }
    const std::string value = series.contains("value")
                                  ? series["value"][1].get<std::string>()
                                  : "(range)";
    parts.push_back(absl::StrCat("{", absl::StrJoin(labels, ","), "} ", value));
  }
  if (parts.empty()) return "(empty)";
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<std::string> FetchMetrics(const std::string& address) {
  httplib::Client client(absl::StrCat("http://", address));
  client.set_read_timeout(10);
  auto response = client.Get("/metrics");
  if (!response) {
    return absl::UnavailableError(absl::StrCat(
        "GET http://", address,
        "/metrics: no answer: ", httplib::to_string(response.error())));
  }
  if (response->status != 200) {
    return absl::InternalError(absl::StrCat("GET http://", address,
                                            "/metrics: HTTP ", response->status,
                                            ": ", response->body));
  }
  return response->body;
}

PromtoolResult PromtoolCheckMetrics(const std::string& text,
                                    const std::string& work_dir,
                                    const std::string& tag) {
  const std::string input = absl::StrCat(work_dir, "/", tag, ".prom");
  const std::string log = absl::StrCat(work_dir, "/", tag, ".promtool.log");
  std::ofstream(input) << text;
  std::ofstream(log).close();
  SubprocessOptions options;
  options.argv = {
      "/bin/sh", "-c",
      absl::StrCat("exec ", kPromtoolBinary, " check metrics < '", input, "'")};
  options.log_path = log;
  PromtoolResult result;
  auto promtool = Subprocess::Start(options);
  if (!promtool.ok()) {
    result.output = std::string(promtool.status().message());
    return result;
  }
  absl::StatusOr<int> status = (*promtool)->Wait(absl::Seconds(60));
  std::ifstream in(log);
  std::stringstream output;
  output << in.rdbuf();
  result.output = output.str();
  if (status.ok() && WIFEXITED(*status))
    result.exit_code = WEXITSTATUS(*status);
  return result;
}

namespace {

absl::StatusOr<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  json value = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not JSON"));
  }
  return value;
}

void CollectQueries(const json& panels, std::vector<DashboardQuery>* out) {
  for (const json& panel : panels) {
    if (panel.contains("panels")) CollectQueries(panel["panels"], out);
    if (!panel.contains("targets")) continue;
    for (const json& target : panel["targets"]) {
      if (target.contains("expr")) {
        out->push_back(
            {panel.value("title", ""), target["expr"].get<std::string>()});
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<DashboardQuery>> DashboardQueries(
    const std::string& path) {
  absl::StatusOr<json> dashboard = ReadJsonFile(path);
  if (!dashboard.ok()) return dashboard.status();
  std::vector<DashboardQuery> queries;
  CollectQueries((*dashboard)["panels"], &queries);
  return queries;
}

absl::StatusOr<std::map<std::string, std::string>> DashboardDefaults(
    const std::string& path) {
  absl::StatusOr<json> dashboard = ReadJsonFile(path);
  if (!dashboard.ok()) return dashboard.status();
  std::map<std::string, std::string> values;
  for (const json& variable : (*dashboard)["templating"]["list"]) {
    if (!variable.contains("current") ||
        !variable["current"].contains("value") ||
        !variable["current"]["value"].is_string()) {
      continue;
    }
    values[variable["name"].get<std::string>()] =
        variable["current"]["value"].get<std::string>();
  }
  return values;
}

namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_';
}

// The run of name characters at `pos`.
std::string NameAt(const std::string& text, size_t pos) {
  size_t end = pos;
  while (end < text.size() && IsNameChar(text[end])) ++end;
  return text.substr(pos, end - pos);
}

}  // namespace

// Hand-scanned rather than with std::regex, whose headers GCC 12 warns
// about (maybe-uninitialized) in the sanitizer build.
absl::StatusOr<std::string> SubstituteVariables(
    const std::string& expr, const std::map<std::string, std::string>& values) {
  std::string out;
  for (size_t i = 0; i < expr.size();) {
    if (expr[i] != '$') {
      out += expr[i++];
      continue;
    }
    // ${name} or $name.
    const bool braced = i + 1 < expr.size() && expr[i + 1] == '{';
    const size_t start = i + (braced ? 2 : 1);
    const std::string name = NameAt(expr, start);
    size_t end = start + name.size();
    if (name.empty() || (braced && (end >= expr.size() || expr[end] != '}'))) {
      out += expr[i++];
      continue;
    }
    if (braced) ++end;
    auto value = values.find(name);
    if (value == values.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no value for $", name, " in ", expr));
    }
    out += value->second;
    i = end;
  }
  return out;
}

std::vector<std::string> MetricNamesIn(const std::string& expr) {
  std::set<std::string> names;
  for (size_t i = 0; i < expr.size();) {
    if (!IsNameChar(expr[i]) || (i > 0 && IsNameChar(expr[i - 1]))) {
      ++i;
      continue;
    }
    const std::string word = NameAt(expr, i);
    if (absl::StartsWith(word, "pdserve_") ||
        absl::StartsWith(word, "process_")) {
      names.insert(word);
    }
    i += word.size();
  }
  return {names.begin(), names.end()};
}

}  // namespace pdserve::testing
