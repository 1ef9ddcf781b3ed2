// RunLoad: sends a workload to a target on an arrival schedule and collects
// each request's record.
//
// Arrivals (as vLLM's `bench serve`):
//   request_rate finite  open loop: inter-arrival times drawn from a gamma
//                        distribution with shape `burstiness` and mean
//                        1 / request_rate (burstiness 1: Poisson; below 1
//                        burstier, above 1 more regular);
//   request_rate inf     every request at once;
//   trace timestamps     when the workload carries them (replay), they win.
// max_concurrency > 0 caps the requests in flight; with an infinite rate
// that is a closed loop of that many clients.
//
// Thread-safety: one run per call; the target must take concurrent Sends.
#ifndef PDSERVE_LOADGEN_RUNNER_H_
#define PDSERVE_LOADGEN_RUNNER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/time/time.h"
#include "loadgen/target.h"
#include "loadgen/workload.h"

namespace pdserve::loadgen {

struct LoadOptions {
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int32_t max_concurrency = 0;
  absl::Duration request_timeout = absl::Minutes(10);
  uint64_t seed = 0;
  // Called about every progress_interval while the run goes, and once at
  // its end.
  struct Progress {
    int64_t total = 0, sent = 0, finished = 0, failed = 0;
    absl::Duration elapsed;
  };
  std::function<void(const Progress&)> on_progress;
  absl::Duration progress_interval = absl::Seconds(2);
};

struct LoadResult {
  std::vector<RequestRecord> records;  // in workload order
  // First send to last answer.
  absl::Duration duration;
};

// Offsets from the run's start, non-decreasing. INVALID_ARGUMENT-free:
// a rate <= 0 or a burstiness <= 0 gives all zeros (callers validate).
std::vector<absl::Duration> ArrivalOffsets(int64_t n, double request_rate,
                                           double burstiness, uint64_t seed);

LoadResult RunLoad(Target& target, const std::vector<BenchRequest>& requests,
                   const LoadOptions& options);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_LOADGEN_RUNNER_H_
