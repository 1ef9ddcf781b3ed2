#include "metrics/histogram.h"

#include <algorithm>
#include <utility>

namespace pdserve::metrics {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    counts_[i].store(0, std::memory_order_relaxed);
  }
}

void Histogram::Observe(double v) {
  // lower_bound: the first bound not below v, i.e. v <= bound. NaN compares
  // false with everything, so it would land in the first bucket.
  size_t bucket =
      v != v ? upper_bounds_.size()
             : static_cast<size_t>(std::lower_bound(upper_bounds_.begin(),
                                                    upper_bounds_.end(), v) -
                                   upper_bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(upper_bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

uint64_t Histogram::Count() const {
  uint64_t total = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
  }
  return total;
}

}  // namespace pdserve::metrics
