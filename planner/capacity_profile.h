// The capacity profile the planner sizes pools from: what one prefill
// worker and one decode worker of a given model on given hardware can do.
//
// A profile is JSON (docs/planner.md has the format and an example;
// planner/profiles/ holds the committed ones):
//
//   {
//     "version": 1,
//     "model": "...", "hardware": "...", "source": "how it was measured",
//     "cost_unit": "cores",                 // what the planner's budget counts
//     "prefill": {
//       "cost": 1,                          // cost units per prefill worker
//       "load_time_s": 20,                  // start to ready (model loaded)
//       "points": [                         // increasing prompt_tokens
//         {"prompt_tokens": 128, "tokens_per_s": 400, "ttft_s": 0.33}, ...]
//     },
//     "decode": {
//       "cost": 1, "load_time_s": 20,
//       "max_batch": 64,                    // sequences one step may hold
//       "kv_capacity_tokens": 65536,        // context tokens the KV cache
//       holds "batch_sizes": [1, 8, 32, 64],      // increasing
//       "context_tokens": [16, 512, 1536],  // increasing
//       "itl_s": [[...], ...]               // itl_s[i][j]: one decode step
//     }                                     // at batch_sizes[i],
//     context_tokens[j]
//   }
//
// Prefill: `tokens_per_s` is one worker's prompt throughput while busy
// (prompts of that length back to back), `ttft_s` a lone prompt's time to
// first token on an idle worker. Decode: `itl_s` is one step's time, hence
// every stream's inter-token latency, with that many sequences of that
// context length in the batch; the worker's token rate is batch / itl.
//
// Lookups interpolate times (prefill seconds, step seconds) linearly
// between points. Past the last point they extrapolate along the last two
// (times keep growing with length and batch: clamping would promise
// capacity that is not there). Before the first point, a step or a lone
// TTFT takes the first point's time; a prompt's busy time, the first
// point's throughput.
//
// A CapacityProfile is immutable after Parse; safe to share across threads.
#ifndef PDSERVE_PLANNER_CAPACITY_PROFILE_H_
#define PDSERVE_PLANNER_CAPACITY_PROFILE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::planner {

struct PrefillPoint {
  double prompt_tokens = 0;
  double tokens_per_s = 0;
  double ttft_s = 0;
};

class CapacityProfile {
 public:
  // INVALID_ARGUMENT naming the field that is wrong (missing, not a
  // positive number, not increasing, a grid of the wrong shape, ...).
  static absl::StatusOr<CapacityProfile> Parse(const std::string& json_text);
  // NOT_FOUND when the file cannot be read; Parse's errors, with the path.
  static absl::StatusOr<CapacityProfile> Load(const std::string& path);

  // Seconds one prefill worker is busy with a prompt of `tokens` (its
  // uncached tokens): tokens / throughput at that length.
  double PrefillSeconds(double tokens) const;
  // One prompt alone on an idle worker: the profile's ttft_s.
  double LoneTtftSeconds(double tokens) const;
  // Prompt tokens/s of one busy worker at that prompt length.
  double PrefillTokensPerSecond(double tokens) const;

  // One decode step's seconds with `batch` sequences (>= 1, may be
  // fractional: a mean batch) of mean context `context_tokens`.
  double DecodeStepSeconds(double batch, double context_tokens) const;
  // Largest batch (real, in [1, max_batch]) whose step fits in `itl_s` at
  // that context and whose KV fits the cache; 0 when even one sequence's
  // step is slower than itl_s.
  double MaxBatchForItl(double itl_s, double context_tokens) const;

  const std::string& model() const { return model_; }
  const std::string& hardware() const { return hardware_; }
  const std::string& source() const { return source_; }
  const std::string& cost_unit() const { return cost_unit_; }
  double prefill_cost() const { return prefill_cost_; }
  double decode_cost() const { return decode_cost_; }
  double prefill_load_time_s() const { return prefill_load_time_s_; }
  double decode_load_time_s() const { return decode_load_time_s_; }
  int max_batch() const { return max_batch_; }
  double kv_capacity_tokens() const { return kv_capacity_tokens_; }
  const std::vector<PrefillPoint>& prefill_points() const {
    return prefill_points_;
  }

 private:
  CapacityProfile() = default;

  std::string model_, hardware_, source_, cost_unit_ = "workers";
  double prefill_cost_ = 1, decode_cost_ = 1;
  double prefill_load_time_s_ = 0, decode_load_time_s_ = 0;
  std::vector<PrefillPoint> prefill_points_;
  std::vector<double> prefill_tokens_, prefill_busy_s_, prefill_ttft_s_;
  int max_batch_ = 1;
  double kv_capacity_tokens_ = 0;
  std::vector<double> batch_sizes_, context_tokens_;
  std::vector<std::vector<double>> itl_s_;  // [batch][context]
};

// Linear interpolation of y over increasing xs at x. Below xs.front():
// ys.front(). Above xs.back(): the line through the last two points, never
// below ys.back(). One point: that value everywhere.
double Interpolate(const std::vector<double>& xs, const std::vector<double>& ys,
                   double x);

}  // namespace pdserve::planner

#endif  // PDSERVE_PLANNER_CAPACITY_PROFILE_H_
