// Histogram bucket layouts: checking a list of upper bounds, the usual
// exponential and linear series, and parsing a list given in a flag.
//
// Latency histograms of an LLM server span four orders of magnitude (a
// 0.5 ms inter-token gap on a fast GPU, a 10-minute time to first token
// behind a long queue), so their layouts are exponential; the flag form lets
// an operator refine the range without a rebuild.
//
// Thread-safety: pure functions.
#ifndef PDSERVE_METRICS_BUCKETS_H_
#define PDSERVE_METRICS_BUCKETS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pdserve::metrics {

// OK when `upper_bounds` is non-empty, finite and strictly increasing (the
// +Inf bucket is implicit and must not be listed); INVALID_ARGUMENT naming
// the first offending bound otherwise.
absl::Status CheckBuckets(absl::Span<const double> upper_bounds);

// start, start*factor, ..., `count` bounds; start > 0, factor > 1.
absl::StatusOr<std::vector<double>> ExponentialBuckets(double start,
                                                       double factor,
                                                       int count);

// `count` >= 2 bounds from `min` to `max` (both included), each a constant
// factor above the last: ExponentialBucketsRange(0.001, 600, 30) spans
// 1 ms .. 10 min.
absl::StatusOr<std::vector<double>> ExponentialBucketsRange(double min,
                                                            double max,
                                                            int count);

// start, start+width, ..., `count` bounds; width > 0.
absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width,
                                                  int count);

// A flag's comma-separated upper bounds ("0.0005,0.001,0.0025"), checked
// with CheckBuckets.
absl::StatusOr<std::vector<double>> ParseBuckets(absl::string_view text);

// The default layouts of pdserve's latency histograms. Per token
// (inter-token latency, time per output token, an engine step, a KV
// transfer): 0.5 ms .. 4.096 s, doubling (14 bounds). Per request (time to
// first token, end-to-end, queueing, prefill): 1 ms .. 10 min (30 bounds).
std::vector<double> DefaultItlBuckets();
std::vector<double> DefaultTtftBuckets();

// The two layouts a process records its latencies with.
struct LatencyBuckets {
  std::vector<double> itl = DefaultItlBuckets();
  std::vector<double> ttft = DefaultTtftBuckets();
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_BUCKETS_H_
