// What the planner knows about load: length distributions (histograms, as
// a router's Prometheus histogram gives them) and a trend-aware forecast of
// the next interval's request rate and lengths.
//
// Not thread-safe: one planner loop owns each object.
#ifndef PDSERVE_PLANNER_LOAD_PREDICTOR_H_
#define PDSERVE_PLANNER_LOAD_PREDICTOR_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::planner {

// Token lengths in buckets with upper bounds (the last bucket is +Inf),
// like a Prometheus histogram, plus the exact sum. Counts may be
// fractional (decayed histograms).
class LengthHistogram {
 public:
  // Bounds 8, 8·√2, 16, ... up to 2^18 tokens: within 41 % everywhere.
  LengthHistogram();
  // INVALID_ARGUMENT unless bounds are positive and increasing.
  static absl::StatusOr<LengthHistogram> WithBounds(std::vector<double> bounds);
  // From a scraped histogram: cumulative counts per bound (the `le`
  // series, +Inf last, so one more than bounds) and the `_sum`.
  // INVALID_ARGUMENT when the counts are not cumulative or do not match.
  static absl::StatusOr<LengthHistogram> FromCumulative(
      std::vector<double> bounds, const std::vector<double>& cumulative,
      double sum);

  void Add(double length, double weight = 1);
  // Multiplies every count and the sum by factor (decay).
  void Scale(double factor);
  // Adds another histogram's counts; INVALID_ARGUMENT if the bounds differ.
  absl::Status Merge(const LengthHistogram& other);

  double count() const { return count_; }
  double sum() const { return sum_; }
  double Mean() const { return count_ > 0 ? sum_ / count_ : 0; }
  // Prometheus' histogram_quantile: linear within the bucket (0 when
  // empty; the +Inf bucket answers its lower bound times 2).
  double Quantile(double q) const;
  // E[f(L)]: each bucket's count at a representative length (its middle,
  // all scaled so that their mean is the exact mean). 0 when empty.
  double Expect(const std::function<double(double)>& f) const;

  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<double>& counts() const { return counts_; }

 private:
  std::vector<double> bounds_;  // upper bounds; counts_ has one more (+Inf)
  std::vector<double> counts_;
  double count_ = 0, sum_ = 0;
};

// One planning interval's load, as observed.
struct IntervalLoad {
  double duration_s = 30;
  double requests = 0;     // arrived in the interval
  LengthHistogram prompt;  // prompt tokens of those requests
  LengthHistogram output;  // output tokens of requests that finished
};

struct LoadForecast {
  double request_rate = 0;         // requests/s expected over the horizon
  double level = 0;                // smoothed rate now
  double trend = 0;                // rate change per interval (0 until warm)
  double last_rate = 0;            // the latest interval's rate
  LengthHistogram prompt, output;  // recent intervals, decayed
  int samples = 0;                 // intervals seen with requests
  bool warm = false;               // samples >= min_samples
};

struct LoadPredictorOptions {
  double level_alpha = 0.5;  // Holt's smoothing of the level
  double trend_beta = 0.3;   // ... and of the trend
  // Each older interval's lengths weigh this much less than the next.
  double length_decay = 0.7;
  // Intervals with requests before the trend is used (and the planner
  // stops blending toward the current replicas).
  int min_samples = 3;
  // An interval with fewer requests does not count as a sample (its rate
  // still updates the level).
  double min_requests_per_sample = 10;
  // The trend's extrapolation is capped at this fraction of the level per
  // interval: one steep interval must not double the forecast.
  double max_trend_fraction = 0.5;
};

class LoadPredictor {
 public:
  explicit LoadPredictor(LoadPredictorOptions options = {});

  void Observe(const IntervalLoad& load);
  // The rate expected `horizon_intervals` ahead. Warm: Holt's level +
  // horizon × trend (capped), never below the latest interval's rate (a
  // burst just seen is not smoothed away). Cold: the latest interval's rate
  // alone (no trend, and no memory of the first noisy samples). Lengths
  // from the decayed histograms.
  LoadForecast Predict(double horizon_intervals = 1) const;

 private:
  LoadPredictorOptions options_;
  double level_ = 0, trend_ = 0, last_rate_ = 0;
  bool have_level_ = false;
  int samples_ = 0;
  LengthHistogram prompt_, output_;
};

// The standard normal quantile (q in (0, 1)).
double NormalQuantile(double q);

}  // namespace pdserve::planner

#endif  // PDSERVE_PLANNER_LOAD_PREDICTOR_H_
