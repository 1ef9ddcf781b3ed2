#include "metrics/metrics_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "metrics/buckets.h"

ABSL_FLAG(std::string, itl_buckets, "",
          "upper bounds (seconds, comma-separated) of the per-token latency "
          "histograms: inter-token latency, time per output token, engine "
          "steps, KV transfers (default 0.0005 doubling to 4.096)");
ABSL_FLAG(std::string, ttft_buckets, "",
          "upper bounds (seconds, comma-separated) of the per-request "
          "latency histograms: time to first token, end-to-end, queueing, "
          "prefill (default 0.001 to 600 in 30 exponential steps)");

namespace pdserve::metrics {
namespace {

absl::StatusOr<std::vector<double>> FromFlag(
    const char* name, const std::string& value,
    std::vector<double> (*default_layout)()) {
  if (value.empty()) return default_layout();
  absl::StatusOr<std::vector<double>> parsed = ParseBuckets(value);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<LatencyBuckets> LatencyBucketsFromFlags() {
  LatencyBuckets buckets;
  PD_ASSIGN_OR_RETURN(buckets.itl,
                      FromFlag("itl_buckets", absl::GetFlag(FLAGS_itl_buckets),
                               &DefaultItlBuckets));
  PD_ASSIGN_OR_RETURN(
      buckets.ttft, FromFlag("ttft_buckets", absl::GetFlag(FLAGS_ttft_buckets),
                             &DefaultTtftBuckets));
  return buckets;
}

}  // namespace pdserve::metrics
