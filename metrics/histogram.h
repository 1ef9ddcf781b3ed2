// Histogram: one series of a Prometheus histogram (latencies, sizes).
//
// Observe finds the value's bucket by binary search over the upper bounds
// and adds to that bucket's count and to the sum with relaxed atomics: no
// lock, no allocation. Counts are kept per bucket and made cumulative (and
// summed into _count) only at scrape time, so an observation touches one
// count rather than every bucket above it. _count is derived from the same
// bucket counts, so a scrape always shows _count equal to the +Inf bucket;
// _sum is read separately and may lag an observation made during the scrape.
//
// Ownership: a registry's family owns its histograms; callers hold the
// pointer for the registry's lifetime. Thread-safety: every method may be
// called from any thread.
#ifndef PDSERVE_METRICS_HISTOGRAM_H_
#define PDSERVE_METRICS_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"

namespace pdserve::metrics {

class Histogram {
 public:
  // `upper_bounds` must be finite and strictly increasing (see
  // buckets.h's CheckBuckets; the registry checks before it creates one).
  // The +Inf bucket is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `v` in the first bucket whose upper bound is >= v (Prometheus'
  // "le"); NaN and values above every bound go to +Inf only.
  void Observe(double v);

  absl::Span<const double> upper_bounds() const { return upper_bounds_; }

  // Cumulative counts, one per upper bound and then +Inf (= the count).
  std::vector<uint64_t> CumulativeCounts() const;
  uint64_t Count() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> upper_bounds_;
  // One per upper bound, then +Inf; not cumulative.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_HISTOGRAM_H_
