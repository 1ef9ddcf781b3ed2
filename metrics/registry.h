// Registry: the metric families one process exports, and the series (label
// values) of each.
//
// Registration happens at startup: AddCounter / AddGauge / AddHistogram
// check the name against naming.h's rules and return a Family. The caller
// then creates each series it will record to, once, with
// Family::WithLabels({"value", ...}), and keeps the returned Counter* /
// Gauge* / Histogram* (a handle): the recording path calls Inc / Set /
// Observe on it and never looks anything up, takes no lock and allocates
// nothing. Label names are fixed at registration; label values come from
// small fixed sets (model, pool, worker id, status, reason) and never from
// requests: a family refuses series beyond its max_series. A family without
// labels has its one series from the start, so it is exported as 0 before
// anything is recorded.
//
// Values only known when asked (CPU time, open files, a pool's size) are
// registered as callbacks, labelled or not, which run at scrape time under
// the registry's lock and must not call back into the registry.
//
// Ownership: the registry owns its families, which own their series; every
// returned pointer stays valid for the registry's lifetime.
// Thread-safety: every method may be called from any thread. Registration
// and Collect take the registry's lock; WithLabels takes the family's.
#ifndef PDSERVE_METRICS_REGISTRY_H_
#define PDSERVE_METRICS_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "metrics/counter.h"
#include "metrics/gauge.h"
#include "metrics/histogram.h"
#include "metrics/snapshot.h"

namespace pdserve::metrics {

struct MetricOptions {
  // Checked by CheckMetricName (naming.h).
  std::string name;
  // Required: what is measured, in which unit, and when it moves.
  std::string help;
  // Fixed for the family; each series gives one value per name.
  std::vector<std::string> label_names;
  // WithLabels refuses further series (RESOURCE_EXHAUSTED), so a label fed
  // from unbounded input fails loudly instead of growing every scrape.
  int max_series = 256;
};

// One series of a callback family, read at scrape time.
struct Sample {
  std::vector<std::string> label_values;
  double value = 0;
};

namespace internal {

// What the registry holds: something that can describe itself at scrape
// time.
class Collectable {
 public:
  virtual ~Collectable() = default;
  virtual FamilySnapshot Collect() const = 0;
};

}  // namespace internal

// The series of one family, by label values. T is Counter, Gauge or
// Histogram.
template <typename T>
class Family final : public internal::Collectable {
 public:
  // Not for direct use: the registry creates families.
  Family(MetricOptions options, MetricType type,
         std::function<std::unique_ptr<T>()> make_series);

  // The series with these label values (one per label name, in order),
  // created on first use; the same pointer on every later call.
  // INVALID_ARGUMENT for the wrong number of values, RESOURCE_EXHAUSTED when
  // the family already has max_series series.
  absl::StatusOr<T*> WithLabels(absl::Span<const absl::string_view> values);

  FamilySnapshot Collect() const override;

 private:
  const MetricOptions options_;
  const MetricType type_;
  const std::function<std::unique_ptr<T>()> make_series_;
  mutable absl::Mutex mu_;
  // Ordered, so that scrapes list series in a stable order.
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_
      ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // INVALID_ARGUMENT for a name, label name or help that breaks the rules,
  // ALREADY_EXISTS when the name (or a series name it produces) is taken.
  absl::StatusOr<CounterFamily*> AddCounter(const MetricOptions& options);
  // Names ending in _info are for AddInfo.
  absl::StatusOr<GaugeFamily*> AddGauge(const MetricOptions& options);
  // `upper_bounds`: see buckets.h (CheckBuckets and the series helpers).
  absl::StatusOr<HistogramFamily*> AddHistogram(
      const MetricOptions& options, std::vector<double> upper_bounds);

  // Unlabelled families whose value `read` returns at each scrape. `read`
  // runs under the registry's lock and must not use the registry.
  absl::Status AddCounterCallback(const MetricOptions& options,
                                  std::function<double()> read);
  absl::Status AddGaugeCallback(const MetricOptions& options,
                                std::function<double()> read);
  // Labelled families whose series `read` returns at each scrape (each
  // sample's label values in options.label_names' order; at most
  // max_series samples are exported). For values another component already
  // keeps (a worker's KV blocks by state, the pools' sizes by state), so
  // nothing has to copy them on the serving path.
  absl::Status AddCounterCallback(const MetricOptions& options,
                                  std::function<std::vector<Sample>()> read);
  absl::Status AddGaugeCallback(const MetricOptions& options,
                                std::function<std::vector<Sample>()> read);

  // An info metric: a gauge named *_info with value 1, whose labels carry
  // facts (version, revision) that queries join on.
  absl::Status AddInfo(
      absl::string_view name, absl::string_view help,
      const std::vector<std::pair<std::string, std::string>>& labels);

  // Every family's current values, in registration order.
  std::vector<FamilySnapshot> Collect() const;

 private:
  // Checks `options` for `type` and reserves the series names it produces.
  absl::Status Reserve(const MetricOptions& options, MetricType type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AddCallback(const MetricOptions& options, MetricType type,
                           std::function<std::vector<Sample>()> read);
  template <typename T>
  absl::StatusOr<Family<T>*> Add(const MetricOptions& options, MetricType type,
                                 std::function<std::unique_ptr<T>()> make);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<internal::Collectable>> families_
      ABSL_GUARDED_BY(mu_);
  // Every series name in use (a histogram's _bucket, _sum and _count too).
  std::map<std::string, std::string, std::less<>> taken_names_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_REGISTRY_H_
