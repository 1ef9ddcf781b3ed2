// What a scrape reads from a registry: each family's name, help, type and
// the values of its series at that moment. The registry fills it under its
// lock (registry.h); the text format renders it without any lock
// (text_format.h), so formatting never holds up registration.
//
// Plain values; not thread-safe.
#ifndef PDSERVE_METRICS_SNAPSHOT_H_
#define PDSERVE_METRICS_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace pdserve::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge", "histogram": the word on a TYPE line.
const char* MetricTypeName(MetricType type);

struct SeriesSnapshot {
  // One per label name of the family, in the same order.
  std::vector<std::string> label_values;
  // Counters and gauges.
  double value = 0;
  // Histograms: cumulative counts, one per upper bound and then +Inf.
  std::vector<uint64_t> cumulative_counts;
  double sum = 0;
};

struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  // Histograms: finite upper bounds ("le"), increasing.
  std::vector<double> upper_bounds;
  std::vector<SeriesSnapshot> series;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_SNAPSHOT_H_
