#include "metrics/registry.h"

#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "metrics/buckets.h"
#include "metrics/naming.h"

namespace pdserve::metrics {
namespace {

// A family whose series and values are read at scrape time.
class CallbackFamily final : public internal::Collectable {
 public:
  CallbackFamily(MetricOptions options, MetricType type,
                 std::function<std::vector<Sample>()> read)
      : options_(std::move(options)), type_(type), read_(std::move(read)) {}

  FamilySnapshot Collect() const override {
    FamilySnapshot out;
    out.name = options_.name;
    out.help = options_.help;
    out.type = type_;
    out.label_names = options_.label_names;
    for (Sample& sample : read_()) {
      // A callback that returns the wrong number of label values would
      // render a malformed line: drop the sample instead.
      if (sample.label_values.size() != options_.label_names.size()) continue;
      if (static_cast<int>(out.series.size()) >= options_.max_series) break;
      SeriesSnapshot& s = out.series.emplace_back();
      s.label_values = std::move(sample.label_values);
      s.value = sample.value;
    }
    return out;
  }

 private:
  const MetricOptions options_;
  const MetricType type_;
  const std::function<std::vector<Sample>()> read_;
};

void FillSeries(const Counter& c, SeriesSnapshot* s) { s->value = c.Value(); }
void FillSeries(const Gauge& g, SeriesSnapshot* s) { s->value = g.Value(); }
void FillSeries(const Histogram& h, SeriesSnapshot* s) {
  s->cumulative_counts = h.CumulativeCounts();
  s->sum = h.Sum();
}

}  // namespace

template <typename T>
Family<T>::Family(MetricOptions options, MetricType type,
                  std::function<std::unique_ptr<T>()> make_series)
    : options_(std::move(options)),
      type_(type),
      make_series_(std::move(make_series)) {
  if (options_.label_names.empty()) {
    absl::MutexLock lock(&mu_);
    series_.emplace(std::vector<std::string>(), make_series_());
  }
}

template <typename T>
absl::StatusOr<T*> Family<T>::WithLabels(
    absl::Span<const absl::string_view> values) {
  if (values.size() != options_.label_names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.name, " has ", options_.label_names.size(),
                     " labels; got ", values.size(), " values"));
  }
  std::vector<std::string> key(values.begin(), values.end());
  absl::MutexLock lock(&mu_);
  auto it = series_.find(key);
  if (it != series_.end()) return it->second.get();
  if (static_cast<int>(series_.size()) >= options_.max_series) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.name, " already has ", series_.size(),
        " series (max_series); label values must come from a small fixed "
        "set, never from requests"));
  }
  return series_.emplace(std::move(key), make_series_()).first->second.get();
}

template <typename T>
FamilySnapshot Family<T>::Collect() const {
  FamilySnapshot out;
  out.name = options_.name;
  out.help = options_.help;
  out.type = type_;
  out.label_names = options_.label_names;
  absl::MutexLock lock(&mu_);
  out.series.reserve(series_.size());
  for (const auto& [labels, series] : series_) {
    SeriesSnapshot& s = out.series.emplace_back();
    s.label_values = labels;
    FillSeries(*series, &s);
    if constexpr (std::is_same_v<T, Histogram>) {
      if (out.upper_bounds.empty()) {
        out.upper_bounds.assign(series->upper_bounds().begin(),
                                series->upper_bounds().end());
      }
    }
  }
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

absl::Status Registry::Reserve(const MetricOptions& options, MetricType type) {
  PD_RETURN_IF_ERROR(CheckMetricName(options.name, type));
  PD_RETURN_IF_ERROR(CheckLabelNames(options.label_names));
  if (options.help.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.name, " needs help text"));
  }
  if (options.max_series < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.name, ": max_series must be >= 1"));
  }
  std::vector<std::string> names = {options.name};
  if (type == MetricType::kHistogram) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      names.push_back(absl::StrCat(options.name, suffix));
    }
  }
  for (const std::string& name : names) {
    auto it = taken_names_.find(name);
    if (it != taken_names_.end()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric ", options.name, ": ", name, " is taken by ", it->second));
    }
  }
  for (const std::string& name : names)
    taken_names_.emplace(name, options.name);
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<Family<T>*> Registry::Add(
    const MetricOptions& options, MetricType type,
    std::function<std::unique_ptr<T>()> make) {
  absl::MutexLock lock(&mu_);
  PD_RETURN_IF_ERROR(Reserve(options, type));
  auto family = std::make_unique<Family<T>>(options, type, std::move(make));
  Family<T>* out = family.get();
  families_.push_back(std::move(family));
  return out;
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(
    const MetricOptions& options) {
  return Add<Counter>(options, MetricType::kCounter,
                      [] { return std::make_unique<Counter>(); });
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(const MetricOptions& options) {
  if (absl::EndsWith(options.name, "_info")) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.name, ": *_info gauges are registered with AddInfo"));
  }
  return Add<Gauge>(options, MetricType::kGauge,
                    [] { return std::make_unique<Gauge>(); });
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(
    const MetricOptions& options, std::vector<double> upper_bounds) {
  absl::Status buckets = CheckBuckets(upper_bounds);
  if (!buckets.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.name, ": ", buckets.message()));
  }
  return Add<Histogram>(options, MetricType::kHistogram,
                        [bounds = std::move(upper_bounds)] {
                          return std::make_unique<Histogram>(bounds);
                        });
}

absl::Status Registry::AddCallback(const MetricOptions& options,
                                   MetricType type,
                                   std::function<std::vector<Sample>()> read) {
  absl::MutexLock lock(&mu_);
  PD_RETURN_IF_ERROR(Reserve(options, type));
  families_.push_back(
      std::make_unique<CallbackFamily>(options, type, std::move(read)));
  return absl::OkStatus();
}

namespace {

// An unlabelled callback as a family of one series.
absl::StatusOr<std::function<std::vector<Sample>()>> OneSeries(
    const MetricOptions& options, std::function<double()> read) {
  if (!options.label_names.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.name, ": a callback returning one value has no labels"));
  }
  return [read = std::move(read)] {
    return std::vector<Sample>{Sample{{}, read()}};
  };
}

}  // namespace

absl::Status Registry::AddCounterCallback(const MetricOptions& options,
                                          std::function<double()> read) {
  PD_ASSIGN_OR_RETURN(auto samples, OneSeries(options, std::move(read)));
  return AddCallback(options, MetricType::kCounter, std::move(samples));
}

absl::Status Registry::AddGaugeCallback(const MetricOptions& options,
                                        std::function<double()> read) {
  PD_ASSIGN_OR_RETURN(auto samples, OneSeries(options, std::move(read)));
  return AddCallback(options, MetricType::kGauge, std::move(samples));
}

absl::Status Registry::AddCounterCallback(
    const MetricOptions& options, std::function<std::vector<Sample>()> read) {
  return AddCallback(options, MetricType::kCounter, std::move(read));
}

absl::Status Registry::AddGaugeCallback(
    const MetricOptions& options, std::function<std::vector<Sample>()> read) {
  return AddCallback(options, MetricType::kGauge, std::move(read));
}

absl::Status Registry::AddInfo(
    absl::string_view name, absl::string_view help,
    const std::vector<std::pair<std::string, std::string>>& labels) {
  if (!absl::EndsWith(name, "_info")) {
    return absl::InvalidArgumentError(
        absl::StrCat("info metric ", name, " must end in _info"));
  }
  MetricOptions options;
  options.name = std::string(name);
  options.help = std::string(help);
  options.max_series = 1;
  std::vector<absl::string_view> values;
  for (const auto& [label, value] : labels) {
    options.label_names.push_back(label);
    values.push_back(value);
  }
  PD_ASSIGN_OR_RETURN(GaugeFamily * family,
                      Add<Gauge>(options, MetricType::kGauge,
                                 [] { return std::make_unique<Gauge>(); }));
  PD_ASSIGN_OR_RETURN(Gauge * gauge, family->WithLabels(values));
  gauge->Set(1);
  return absl::OkStatus();
}

std::vector<FamilySnapshot> Registry::Collect() const {
  absl::MutexLock lock(&mu_);
  std::vector<FamilySnapshot> out;
  out.reserve(families_.size());
  for (const auto& family : families_) out.push_back(family->Collect());
  return out;
}

}  // namespace pdserve::metrics
