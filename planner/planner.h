// The SLO planner's decision core: from one interval's observations, the
// capacity profile, latency targets and limits, how many prefill and
// decode workers the cluster should run. No I/O: a live process
// (pd-planner, reading Prometheus and acting through a scaler) and the
// simulator (planner_sim) both drive it. docs/planner.md explains the rule.
//
// Not thread-safe: one loop calls Decide, once per interval.
#ifndef PDSERVE_PLANNER_PLANNER_H_
#define PDSERVE_PLANNER_PLANNER_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/capacity_profile.h"
#include "planner/load_predictor.h"

namespace pdserve::planner {

// The load a pool is sized for.
struct LoadEstimate {
  double request_rate = 0;  // requests/s
  LengthHistogram prompt, output;
  // Share of prompt tokens the prefix cache serves (not computed).
  double cached_prompt_fraction = 0;
};

// The queueing model behind every decision (and the simulator's oracle).
// `quantile` is the latency percentile the targets hold (0.99: p99).
struct Sizing {
  int replicas = 0;                // the fewest that meet the target
  double predicted_latency_s = 0;  // the model's latency quantile there
  bool feasible =
      true;         // false: no count meets it (sized to a utilisation cap)
  std::string why;  // one line: what bound the count
};
// TTFT: M/G/c (Erlang C, Allen-Cunneen for the service-time spread) on
// busy times from the profile; the quantile is the waiting time's plus the
// quantile prompt's lone TTFT.
double PredictTtft(const CapacityProfile& profile, const LoadEstimate& load,
                   int replicas, double quantile);
Sizing SizePrefill(const CapacityProfile& profile, const LoadEstimate& load,
                   double ttft_target_s, double quantile, int max_replicas);
// ITL: Little's law gives the streams per worker (each stays output ×
// step time), the step time from the profile at that batch and the mean
// context; the quantile batch is mean + z·√mean (Poisson streams).
double PredictItl(const CapacityProfile& profile, const LoadEstimate& load,
                  int replicas, double quantile);
// The mean inter-token gap: a token's step holds its own stream and a
// Poisson count of others (mean: Little's law's streams), so the mean gap
// is the step at one more stream than the mean batch.
double PredictMeanItl(const CapacityProfile& profile, const LoadEstimate& load,
                      int replicas);
Sizing SizeDecode(const CapacityProfile& profile, const LoadEstimate& load,
                  double itl_target_s, double quantile, int max_replicas);

struct PoolObservation {
  int configured = 0;      // replicas the scaler was last asked for
  int ready = 0;           // serving (registered, not draining)
  double queue_depth = 0;  // requests waiting on the pool's workers
  double kv_usage = 0;     // decode: mean KV cache usage ratio (0..1)
};

// One interval, as the router's and workers' metrics give it
// (docs/metrics.md): pdserve_requests_total / pdserve_prompt_tokens_total
// increases, length histograms, TTFT and ITL quantiles and the mean ITL
// over the interval, pdserve_worker_requests_waiting,
// pdserve_kv_cache_usage_ratio, pdserve_workers.
struct Observation {
  double time_s = 0;  // end of the interval (any clock, seconds)
  IntervalLoad load;
  double cached_prompt_fraction = 0;
  // Observed quantiles (at PlannerOptions::quantile) and how many samples
  // they come from; absent when the interval had none.
  std::optional<double> ttft_s, itl_s;
  double ttft_samples = 0, itl_samples = 0;
  // The mean inter-token gap (the ITL histogram's sum over its count);
  // absent when the interval had none.
  std::optional<double> itl_mean_s;
  // When a quantile was read from a histogram (a live cluster's metrics):
  // the bucket it fell in, [lower, upper] bound (upper +Inf for the last).
  // The quantile is only known to lie in it, so a prediction inside the
  // bucket agrees with the observation; the TTFT correction then compares
  // the prediction with the bucket's nearest edge, never with a value
  // interpolated inside a bucket twice as wide as it is low (the ITL
  // correction compares means).
  // Absent: the quantile is exact (the simulator).
  struct Bucket {
    double lower = 0, upper = 0;
  };
  std::optional<Bucket> ttft_bucket, itl_bucket;
  // Requests the router retried on other workers (before their first
  // token) and streams it migrated (after) in the interval: their latency
  // measures a failure or a scale-down's hand-back, not the profile, so
  // such an interval does not correct it.
  double retries = 0, migrations = 0;
  PoolObservation prefill, decode;
};

struct PlannerOptions {
  double ttft_target_s = 2.0;
  double itl_target_s = 0.05;
  double quantile = 0.99;
  double interval_s = 30;
  int min_prefill = 1, max_prefill = 1000;
  int min_decode = 1, max_decode = 1000;
  // Total cost (the profile's cost units: cores, GPUs) of both pools; 0:
  // no budget.
  double budget = 0;
  // Scale down only to a count that still meets the target with this much
  // more load (the dead band that stops flapping).
  double hysteresis = 0.15;
  // Scale down only to the largest count wanted over this window.
  double scale_down_window_s = 180;
  // At most this share of a pool removed per decision (at least one).
  double max_scale_down_fraction = 0.5;
  // After an operator changes a pool's replicas, hold their number this
  // long (then plan from it).
  double manual_hold_s = 600;
  // Headroom over the forecast rate for its noise: a rate measured from
  // one interval's Poisson count is uncertain by sqrt(rate / interval);
  // plan for forecast + z × that (10 % at 7 req/s, 4 % at 40 with z 1.5,
  // 30 s intervals).
  double forecast_headroom_z = 1.5;
  // Latency correction: observed / model-predicted quantile, smoothed,
  // clamped; only from steady intervals with this many samples. The floor
  // of 1 means a profile more pessimistic than the cluster is kept as
  // margin (for what the forecast cannot see: bursts); lower it to let the
  // planner run closer to the edge (docs/planner.md has the trade-off).
  double correction_alpha = 0.5;
  double min_correction = 1.0, max_correction = 3.0;
  double min_correction_samples = 50;
  // ... and, where it compares a quantile (TTFT), with at least this many
  // samples expected above it (samples x (1 - quantile)): a p99 of fewer
  // than 200 samples is little more than their largest one.
  double min_correction_tail_samples = 2;
  // Decode KV usage above this means more decode workers whatever the
  // model says: at least ready × usage / kv_usage_target.
  double kv_usage_high = 0.9, kv_usage_target = 0.75;
  LoadPredictorOptions predictor;
};

struct PoolDecision {
  std::string pool;  // "prefill" or "decode"
  int configured = 0, ready = 0;
  double correction = 1;  // observed / predicted latency ratio in use
  // The latency quantile observed, and the model's at the observed load
  // and the ready workers.
  std::optional<double> observed_latency_s;
  double model_latency_s = 0;
  // What the correction compares, the same way: prefill the TTFT
  // quantile, decode the mean inter-token gap (Planner::DecidePool says
  // why).
  std::optional<double> compared_observed_s;
  double compared_model_s = 0;
  int need = 0;                    // for the forecast (corrected target)
  int need_down = 0;               // with the hysteresis margin
  int stabilized = 0;              // largest need_down over the window
  int desired = 0;                 // what the scaler is asked for
  double predicted_latency_s = 0;  // the model's, at the forecast and desired
  bool feasible = true;
  bool manual_hold = false;
  std::vector<std::string> reasons;
};

struct Decision {
  double time_s = 0;
  // Inputs.
  double observed_rate = 0;
  double prompt_p50 = 0, prompt_p90 = 0, prompt_mean = 0;
  double output_p50 = 0, output_p90 = 0, output_mean = 0;
  std::optional<double> observed_ttft_s, observed_itl_s, observed_itl_mean_s;
  double prefill_queue_depth = 0, decode_kv_usage = 0;
  // Forecast.
  double forecast_rate = 0, forecast_level = 0, forecast_trend = 0;
  int forecast_samples = 0;
  bool warm = false;
  double cold_start_weight = 1;  // share of the way from current to need
  PoolDecision prefill, decode;
  double cost = 0;  // of the desired replicas, in the profile's unit
  bool budget_clamped = false;
  std::vector<std::string> reasons;  // decision-wide (budget, cold start)

  // One JSON object (one log line).
  std::string ToJson() const;
  // Gauges to export (name, labels, value): pdserve_planner_*.
  struct Gauge {
    std::string name;
    std::vector<std::pair<std::string, std::string>> labels;
    double value = 0;
  };
  std::vector<Gauge> Gauges() const;
};

class Planner {
 public:
  // INVALID_ARGUMENT for inconsistent options (targets <= 0, min > max,
  // minimums over the budget, ...).
  static absl::StatusOr<std::unique_ptr<Planner>> Create(
      const PlannerOptions& options, CapacityProfile profile);

  // Called once per interval, at observation.time_s (increasing).
  Decision Decide(const Observation& observation);

  const PlannerOptions& options() const { return options_; }
  const CapacityProfile& profile() const { return profile_; }

 private:
  struct PoolState {
    double correction = 1;
    int ready_before = -1;  // ready workers at the last decision
    // When the pool last scaled (its ready or configured count moved, or
    // this is the first decision): latency stays disturbed a while after
    // (streams a scale-down migrated resume with a long gap).
    double scaled_at = -1e300;
    std::optional<int> last_desired;
    double manual_until = -1;
    std::deque<std::pair<double, int>> need_down_history;  // (time, need)
  };
  Planner(const PlannerOptions& options, CapacityProfile profile);

  PoolDecision DecidePool(bool prefill, const Observation& o,
                          const LoadEstimate& observed,
                          const LoadEstimate& forecast, double weight,
                          PoolState& state);

  PlannerOptions options_;
  CapacityProfile profile_;
  LoadPredictor predictor_;
  PoolState prefill_state_, decode_state_;
};

}  // namespace pdserve::planner

#endif  // PDSERVE_PLANNER_PLANNER_H_
