// The Prometheus text exposition format, version 0.0.4: what GET /metrics
// returns. Every process renders its registry with RenderText, either from
// its own metrics server (metrics_server.h) or, for the router, on the HTTP
// port it already serves.
//
// Per family: `# HELP name text` (backslash and newline escaped), `# TYPE
// name counter|gauge|histogram`, then one line per series,
// `name{label="value",...} value`, label values with backslash, double
// quote and newline escaped. A histogram series is its cumulative
// `name_bucket{...,le="bound"}` lines ending with le="+Inf", then
// `name_sum` and `name_count`. Values and bounds are written as Go's
// Prometheus clients write them (FormatValue), or NaN, +Inf, -Inf.
//
// Thread-safety: pure functions (RenderText(const Registry&) collects under
// the registry's lock).
#ifndef PDSERVE_METRICS_TEXT_FORMAT_H_
#define PDSERVE_METRICS_TEXT_FORMAT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "metrics/registry.h"
#include "metrics/snapshot.h"

namespace pdserve::metrics {

// The Content-Type of a RenderText response.
inline constexpr char kTextContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

std::string RenderText(absl::Span<const FamilySnapshot> families);
std::string RenderText(const Registry& registry);

// Exposed for tests and for callers that write single lines.
std::string FormatValue(double v);
std::string EscapeLabelValue(absl::string_view value);
std::string EscapeHelp(absl::string_view help);

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_TEXT_FORMAT_H_
