// The client side of GET /metrics: fetches a process's Prometheus text
// (cpp-httplib, plain HTTP, as the servers use) and parses it
// (text_parse.h). `pdctl top` scrapes the router and every worker with it.
//
// `address` is "host:port" or "[v6addr]:port", optionally written as a URL
// ("http://host:port", any path after it is ignored: the path is always
// /metrics). An unspecified host (0.0.0.0, ::), as a process listening on
// every interface may advertise itself, is scraped on loopback.
//
// Errors: INVALID_ARGUMENT for a malformed address or a body that is not
// the text format (the parser's message, after the URL); UNAVAILABLE when
// the connection fails, times out (`timeout` bounds the connect, the send
// and each read) or the answer is not HTTP 200. Messages name the URL.
//
// Thread-safety: stateless functions; each call opens its own connection.
#ifndef PDSERVE_METRICS_SCRAPE_CLIENT_H_
#define PDSERVE_METRICS_SCRAPE_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "metrics/text_parse.h"

namespace pdserve::metrics {

// The body of GET http://address/metrics.
absl::StatusOr<std::string> FetchMetricsText(absl::string_view address,
                                             absl::Duration timeout);

// The same, parsed.
absl::StatusOr<ParsedMetrics> ScrapeMetrics(absl::string_view address,
                                            absl::Duration timeout);

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_SCRAPE_CLIENT_H_
