// The metrics every pdserve process exports about itself: the standard
// Prometheus process collector's names (so stock dashboards and alerts work
// unchanged) read from /proc at scrape time, and pdserve_build_info.
//
//   process_cpu_seconds_total       user + system CPU time
//   process_resident_memory_bytes   resident set size
//   process_open_fds                open file descriptors
//   process_start_time_seconds      start time, seconds since the Unix epoch
//   pdserve_build_info{version,revision}  1
//
// The project has no build stamping yet (no workspace status command), so
// the version is the constant kPdserveVersion and the revision "unknown"
// unless a binary passes other values in BuildInfo.
//
// Thread-safety: the functions may be called from any thread; the
// registered callbacks only read /proc.
#ifndef PDSERVE_METRICS_PROCESS_METRICS_H_
#define PDSERVE_METRICS_PROCESS_METRICS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/registry.h"

namespace pdserve::metrics {

inline constexpr char kPdserveVersion[] = "0.1.0";

struct BuildInfo {
  std::string version = kPdserveVersion;
  std::string revision = "unknown";
};

struct ProcessStats {
  double cpu_seconds = 0;
  double resident_memory_bytes = 0;
  double open_fds = 0;
  double start_time_seconds = 0;
};

// This process's figures, from /proc/self/stat, /proc/self/fd and
// /proc/stat (boot time). INTERNAL when /proc cannot be read or parsed.
absl::StatusOr<ProcessStats> ReadProcessStats();

// Registers the four process_* metrics and pdserve_build_info. A value that
// cannot be read at scrape time is exported as NaN.
absl::Status AddProcessMetrics(Registry* registry,
                               const BuildInfo& build = BuildInfo());

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_PROCESS_METRICS_H_
