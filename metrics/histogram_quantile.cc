#include "metrics/histogram_quantile.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pdserve::metrics {
namespace {

// Prometheus' tolerance for counts that differ only by float noise.
constexpr double kSmallDeltaTolerance = 1e-12;

// Go's almostEqual from Prometheus' promql package.
bool AlmostEqual(double a, double b, double epsilon) {
  constexpr double kMinNormal = std::numeric_limits<double>::min();
  if (a == b) return true;
  const double abs_sum = std::abs(a) + std::abs(b);
  const double diff = std::abs(a - b);
  if (a == 0 || b == 0 || abs_sum < kMinNormal) {
    return diff < epsilon * kMinNormal;
  }
  return diff / std::min(abs_sum, std::numeric_limits<double>::max()) < epsilon;
}

}  // namespace

double HistogramQuantile(double q, std::vector<ParsedBucket> buckets) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (std::isnan(q)) return kNaN;
  if (q < 0) return -kInf;
  if (q > 1) return kInf;
  if (buckets.empty()) return kNaN;
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const ParsedBucket& a, const ParsedBucket& b) {
                     return a.upper_bound < b.upper_bound;
                   });
  if (!(std::isinf(buckets.back().upper_bound) &&
        buckets.back().upper_bound > 0)) {
    return kNaN;
  }
  // coalesceBuckets: one bucket per bound, counts added.
  std::vector<ParsedBucket> merged;
  for (const ParsedBucket& b : buckets) {
    if (!merged.empty() && merged.back().upper_bound == b.upper_bound) {
      merged.back().cumulative_count += b.cumulative_count;
    } else {
      merged.push_back(b);
    }
  }
  // ensureMonotonicAndIgnoreSmallDeltas.
  double previous = merged[0].cumulative_count;
  for (size_t i = 1; i < merged.size(); ++i) {
    const double current = merged[i].cumulative_count;
    if (current == previous) continue;
    if (AlmostEqual(previous, current, kSmallDeltaTolerance) ||
        current < previous) {
      merged[i].cumulative_count = previous;
      continue;
    }
    previous = current;
  }
  if (merged.size() < 2) return kNaN;
  const double observations = merged.back().cumulative_count;
  if (observations == 0 || std::isnan(observations)) return kNaN;
  double rank = q * observations;
  // sort.Search over all but the +Inf bucket: the first whose count
  // reaches the rank, or the +Inf bucket's index when none does.
  size_t b = 0;
  while (b < merged.size() - 1 && merged[b].cumulative_count < rank) ++b;
  if (b == merged.size() - 1) return merged[merged.size() - 2].upper_bound;
  if (b == 0 && merged[0].upper_bound <= 0) return merged[0].upper_bound;
  double bucket_start = 0;
  const double bucket_end = merged[b].upper_bound;
  double count = merged[b].cumulative_count;
  if (b > 0) {
    bucket_start = merged[b - 1].upper_bound;
    count -= merged[b - 1].cumulative_count;
    rank -= merged[b - 1].cumulative_count;
  }
  return bucket_start + (bucket_end - bucket_start) * (rank / count);
}

}  // namespace pdserve::metrics
