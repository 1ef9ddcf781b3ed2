// The command-line flags that set pdserve's latency histogram layouts, the
// same in every process that records latencies (the router and the
// workers), so an operator tunes them once:
//
//   --itl_buckets   per-token latencies (inter-token latency, time per
//                   output token, engine steps, KV transfers)
//   --ttft_buckets  per-request latencies (time to first token,
//                   end-to-end, queueing, prefill)
//
// Each takes comma-separated upper bounds in seconds ("0.0005,0.001,...");
// empty (the default) keeps buckets.h's defaults.
#ifndef PDSERVE_METRICS_METRICS_FLAGS_H_
#define PDSERVE_METRICS_METRICS_FLAGS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "metrics/buckets.h"

namespace pdserve::metrics {

// Both layouts; INVALID_ARGUMENT naming the flag when its value is not a
// valid layout.
absl::StatusOr<LatencyBuckets> LatencyBucketsFromFlags();

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_METRICS_FLAGS_H_
