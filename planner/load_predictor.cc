#include "planner/load_predictor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pdserve::planner {

LengthHistogram::LengthHistogram() {
  for (double b = 8; b <= (1 << 18) * 1.0001; b *= std::sqrt(2.0)) {
    bounds_.push_back(std::round(b));
  }
  counts_.assign(bounds_.size() + 1, 0);
}

absl::StatusOr<LengthHistogram> LengthHistogram::WithBounds(
    std::vector<double> bounds) {
  if (bounds.empty()) return absl::InvalidArgumentError("no bucket bounds");
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!(bounds[i] > 0) || !std::isfinite(bounds[i]) ||
        (i > 0 && bounds[i] <= bounds[i - 1])) {
      return absl::InvalidArgumentError(
          "bucket bounds must be finite, positive and increasing");
    }
  }
  LengthHistogram h;
  h.bounds_ = std::move(bounds);
  h.counts_.assign(h.bounds_.size() + 1, 0);
  return h;
}

absl::StatusOr<LengthHistogram> LengthHistogram::FromCumulative(
    std::vector<double> bounds, const std::vector<double>& cumulative,
    double sum) {
  auto h = WithBounds(std::move(bounds));
  if (!h.ok()) return h.status();
  if (cumulative.size() != h->bounds_.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "histogram has ", cumulative.size(), " cumulative counts for ",
        h->bounds_.size(), " bounds (+Inf needs one more)"));
  }
  double before = 0;
  for (size_t i = 0; i < cumulative.size(); ++i) {
    if (!(cumulative[i] >= before) || !std::isfinite(cumulative[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram counts are not cumulative at bucket ", i));
    }
    h->counts_[i] = cumulative[i] - before;
    before = cumulative[i];
  }
  if (!(sum >= 0) || !std::isfinite(sum)) {
    return absl::InvalidArgumentError("histogram sum must be >= 0");
  }
  h->count_ = before;
  h->sum_ = sum;
  return h;
}

void LengthHistogram::Add(double length, double weight) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), length) -
                   bounds_.begin();
  counts_[i] += weight;
  count_ += weight;
  sum_ += weight * length;
}

void LengthHistogram::Scale(double factor) {
  for (double& c : counts_) c *= factor;
  count_ *= factor;
  sum_ *= factor;
}

absl::Status LengthHistogram::Merge(const LengthHistogram& other) {
  if (other.bounds_ != bounds_) {
    return absl::InvalidArgumentError("histograms with different bounds");
  }
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  return absl::OkStatus();
}

double LengthHistogram::Quantile(double q) const {
  if (count_ <= 0) return 0;
  const double rank = std::clamp(q, 0.0, 1.0) * count_;
  double seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i] <= 0) continue;
    if (seen + counts_[i] >= rank) {
      const double lo = i == 0 ? 0 : bounds_[i - 1];
      if (i == bounds_.size()) return 2 * lo;
      const double hi = bounds_[i];
      return lo + (hi - lo) * (rank - seen) / counts_[i];
    }
    seen += counts_[i];
  }
  return bounds_.back();
}

double LengthHistogram::Expect(const std::function<double(double)>& f) const {
  if (count_ <= 0) return 0;
  std::vector<double> mid(counts_.size());
  double mid_sum = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    const double lo = i == 0 ? 0 : bounds_[i - 1];
    const double hi = i == bounds_.size() ? 2 * lo : bounds_[i];
    mid[i] = 0.5 * (lo + hi);
    mid_sum += counts_[i] * mid[i];
  }
  // Middles over- or under-state each bucket's mean; the exact sum fixes
  // the overall scale.
  const double scale = mid_sum > 0 && sum_ > 0 ? sum_ / mid_sum : 1;
  double total = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i] > 0) total += counts_[i] * f(mid[i] * scale);
  }
  return total / count_;
}

LoadPredictor::LoadPredictor(LoadPredictorOptions options)
    : options_(options) {}

void LoadPredictor::Observe(const IntervalLoad& load) {
  const double duration = std::max(load.duration_s, 1e-9);
  const double rate = std::max(0.0, load.requests) / duration;
  last_rate_ = rate;
  const bool sample = load.requests >= options_.min_requests_per_sample;
  if (!have_level_) {
    level_ = rate;
    trend_ = 0;
    have_level_ = true;
  } else {
    const double previous = level_;
    level_ = options_.level_alpha * rate +
             (1 - options_.level_alpha) * (level_ + trend_);
    // Until warm the trend is learned but not used: two cold samples make
    // a slope out of noise (and out of a start-up backlog).
    trend_ = options_.trend_beta * (level_ - previous) +
             (1 - options_.trend_beta) * trend_;
  }
  if (sample) ++samples_;
  prompt_.Scale(options_.length_decay);
  output_.Scale(options_.length_decay);
  // Same default bounds on both sides; a caller's own bounds are merged
  // by value into these.
  if (!prompt_.Merge(load.prompt).ok()) {
    for (size_t i = 0; i < load.prompt.counts().size(); ++i) {
      const double lo = i == 0 ? 0 : load.prompt.bounds()[i - 1];
      const double hi =
          i == load.prompt.bounds().size() ? 2 * lo : load.prompt.bounds()[i];
      if (load.prompt.counts()[i] > 0)
        prompt_.Add(0.5 * (lo + hi), load.prompt.counts()[i]);
    }
  }
  if (!output_.Merge(load.output).ok()) {
    for (size_t i = 0; i < load.output.counts().size(); ++i) {
      const double lo = i == 0 ? 0 : load.output.bounds()[i - 1];
      const double hi =
          i == load.output.bounds().size() ? 2 * lo : load.output.bounds()[i];
      if (load.output.counts()[i] > 0)
        output_.Add(0.5 * (lo + hi), load.output.counts()[i]);
    }
  }
}

LoadForecast LoadPredictor::Predict(double horizon_intervals) const {
  LoadForecast f;
  f.samples = samples_;
  f.warm = samples_ >= options_.min_samples;
  f.level = level_;
  f.last_rate = last_rate_;
  f.trend = f.warm ? trend_ : 0;
  const double cap = options_.max_trend_fraction * level_;
  const double step = std::clamp(f.trend, -cap, cap);
  // Cold: the latest interval alone. The smoothed level still remembers
  // the first samples (a start-up burst or backlog) and would carry them
  // forward; warm, the level and trend, floored at the latest.
  f.request_rate =
      f.warm ? std::max({0.0, level_ + horizon_intervals * step, last_rate_})
             : last_rate_;
  f.prompt = prompt_;
  f.output = output_;
  return f;
}

double NormalQuantile(double q) {
  q = std::clamp(q, 1e-12, 1 - 1e-12);
  double lo = -10, hi = 10;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < q ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace pdserve::planner
