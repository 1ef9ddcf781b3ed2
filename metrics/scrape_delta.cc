#include "metrics/scrape_delta.h"

#include <algorithm>
#include <map>
#include <utility>

namespace pdserve::metrics {
namespace {

double Increase(double older, double newer) {
  return newer >= older ? newer - older : newer;
}

}  // namespace

std::optional<double> CounterIncrease(const ParsedMetrics* older,
                                      const ParsedMetrics& newer,
                                      absl::string_view family) {
  const ParsedFamily* now = newer.Find(family);
  if (now == nullptr || now->samples.empty()) return std::nullopt;
  std::map<std::pair<std::string, Labels>, double> before;
  if (const ParsedFamily* then = older ? older->Find(family) : nullptr) {
    for (const ParsedSample& s : then->samples) {
      before[{s.name, s.labels}] = s.value;
    }
  }
  double total = 0;
  for (const ParsedSample& s : now->samples) {
    const auto it = before.find({s.name, s.labels});
    total += Increase(it == before.end() ? 0 : it->second, s.value);
  }
  return total;
}

namespace {

// The series of histogram `family` in `older`, by labels.
std::map<Labels, const ParsedHistogram*> SeriesBefore(
    const ParsedMetrics* older, absl::string_view family) {
  std::map<Labels, const ParsedHistogram*> before;
  if (const ParsedFamily* then = older ? older->Find(family) : nullptr) {
    for (const ParsedHistogram& h : then->histograms) before[h.labels] = &h;
  }
  return before;
}

// The older bucket counts of `now`'s series, by bound (empty when it is
// new), and whether the series was reset in between (a bucket went down).
std::map<double, double> OldCounts(
    const ParsedHistogram& now,
    const std::map<Labels, const ParsedHistogram*>& before, bool* reset) {
  std::map<double, double> old_counts;
  if (const auto it = before.find(now.labels); it != before.end()) {
    for (const ParsedBucket& b : it->second->buckets) {
      old_counts[b.upper_bound] = b.cumulative_count;
    }
  }
  *reset = std::any_of(
      now.buckets.begin(), now.buckets.end(), [&](const ParsedBucket& b) {
        const auto it = old_counts.find(b.upper_bound);
        return it != old_counts.end() && b.cumulative_count < it->second;
      });
  return old_counts;
}

}  // namespace

std::vector<ParsedBucket> BucketIncrease(const ParsedMetrics* older,
                                         const ParsedMetrics& newer,
                                         absl::string_view family) {
  const ParsedFamily* now = newer.Find(family);
  if (now == nullptr || now->histograms.empty()) return {};
  const std::map<Labels, const ParsedHistogram*> before =
      SeriesBefore(older, family);
  std::map<double, double> by_bound;
  for (const ParsedHistogram& h : now->histograms) {
    bool reset = false;
    const std::map<double, double> old_counts = OldCounts(h, before, &reset);
    for (const ParsedBucket& b : h.buckets) {
      const auto it = old_counts.find(b.upper_bound);
      const double then = reset || it == old_counts.end() ? 0 : it->second;
      by_bound[b.upper_bound] += b.cumulative_count - then;
    }
  }
  std::vector<ParsedBucket> out;
  out.reserve(by_bound.size());
  for (const auto& [bound, count] : by_bound) out.push_back({bound, count});
  return out;
}

std::optional<double> HistogramSumIncrease(const ParsedMetrics* older,
                                           const ParsedMetrics& newer,
                                           absl::string_view family) {
  const ParsedFamily* now = newer.Find(family);
  if (now == nullptr || now->histograms.empty()) return std::nullopt;
  const std::map<Labels, const ParsedHistogram*> before =
      SeriesBefore(older, family);
  double total = 0;
  for (const ParsedHistogram& h : now->histograms) {
    bool reset = false;
    OldCounts(h, before, &reset);
    const auto it = before.find(h.labels);
    total += h.sum - (reset || it == before.end() ? 0 : it->second->sum);
  }
  return total;
}

std::optional<double> GaugeSum(const ParsedMetrics& metrics,
                               absl::string_view family) {
  const ParsedFamily* f = metrics.Find(family);
  if (f == nullptr || f->samples.empty()) return std::nullopt;
  double total = 0;
  for (const ParsedSample& s : f->samples) total += s.value;
  return total;
}

std::optional<double> GaugeMax(const ParsedMetrics& metrics,
                               absl::string_view family) {
  const ParsedFamily* f = metrics.Find(family);
  if (f == nullptr || f->samples.empty()) return std::nullopt;
  double most = f->samples.front().value;
  for (const ParsedSample& s : f->samples) most = std::max(most, s.value);
  return most;
}

}  // namespace pdserve::metrics
