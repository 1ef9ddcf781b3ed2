// Naming rules for pdserve's metrics, checked when a metric is registered so
// that a badly named metric fails the process's tests instead of reaching
// dashboards.
//
// They are Prometheus' conventions, as `promtool check metrics` lints them,
// plus our prefix:
//   - snake_case: [a-z_][a-z0-9_]*; colons are left to recording rules;
//   - a `pdserve_` prefix, except the standard process_* names every
//     Prometheus client exports (kStandardProcessMetrics);
//   - counters end in `_total`, other types do not;
//   - base units only (`_seconds`, `_bytes`; never milliseconds, kilobytes,
//     percent), and no abbreviated units (`_ms`, `_s`, `_kb`, `_h`);
//   - no type word (counter, gauge, histogram, summary) as a name part;
//   - histogram names do not end in `_bucket`, `_sum` or `_count`, which
//     their series append.
// Label names: [a-zA-Z_][a-zA-Z0-9_]*, unique, no `__` prefix (reserved),
// and neither `le` nor `quantile` (the histogram and summary labels).
//
// Thread-safety: pure functions.
#ifndef PDSERVE_METRICS_NAMING_H_
#define PDSERVE_METRICS_NAMING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "metrics/snapshot.h"

namespace pdserve::metrics {

inline constexpr absl::string_view kMetricPrefix = "pdserve_";

// The only names allowed without kMetricPrefix.
inline constexpr absl::string_view kStandardProcessMetrics[] = {
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_start_time_seconds",
};

// OK, or INVALID_ARGUMENT saying which rule `name` breaks.
absl::Status CheckMetricName(absl::string_view name, MetricType type);

// OK, or INVALID_ARGUMENT saying which label name breaks which rule.
absl::Status CheckLabelNames(absl::Span<const std::string> label_names);

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_NAMING_H_
