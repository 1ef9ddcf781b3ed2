#include "metrics/scrape_client.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "httplib.h"

namespace pdserve::metrics {
namespace {

struct Target {
  std::string host;
  int port = 0;
};

absl::StatusOr<Target> ParseAddress(absl::string_view address) {
  absl::string_view rest = address;
  absl::ConsumePrefix(&rest, "http://");
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  Target target;
  absl::string_view host =
      colon == absl::string_view::npos ? "" : rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || !absl::SimpleAtoi(rest.substr(colon + 1), &target.port) ||
      target.port <= 0 || target.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address, "' is not host:port (or a URL)"));
  }
  target.host = std::string(host);
  // Listening on every interface says nothing about where to connect; this
  // host is one of them.
  if (target.host == "0.0.0.0") target.host = "127.0.0.1";
  if (target.host == "::") target.host = "::1";
  return target;
}

}  // namespace

absl::StatusOr<std::string> FetchMetricsText(absl::string_view address,
                                             absl::Duration timeout) {
  absl::StatusOr<Target> target = ParseAddress(address);
  if (!target.ok()) return target.status();
  const std::string url =
      absl::StrCat("http://",
                   absl::StrContains(target->host, ':')
                       ? absl::StrCat("[", target->host, "]")
                       : target->host,
                   ":", target->port, "/metrics");
  httplib::Client client(target->host, target->port);
  const int64_t us =
      std::max<int64_t>(absl::ToInt64Microseconds(timeout), 1000);
  client.set_connection_timeout(us / 1000000, us % 1000000);
  client.set_read_timeout(us / 1000000, us % 1000000);
  client.set_write_timeout(us / 1000000, us % 1000000);
  httplib::Result res = client.Get("/metrics");
  if (!res) {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": ", httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": HTTP ", res->status));
  }
  return std::move(res->body);
}

absl::StatusOr<ParsedMetrics> ScrapeMetrics(absl::string_view address,
                                            absl::Duration timeout) {
  absl::StatusOr<std::string> text = FetchMetricsText(address, timeout);
  if (!text.ok()) return text.status();
  absl::StatusOr<ParsedMetrics> parsed = ParseText(*text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics from ", address, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace pdserve::metrics
