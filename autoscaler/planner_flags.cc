#include "autoscaler/planner_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "planner/capacity_profile.h"

ABSL_FLAG(std::string, profile, "",
          "capacity profile JSON (pdctl profile writes one; "
          "planner/profiles/ has examples)");
ABSL_FLAG(double, ttft_target_ms, 2000, "time-to-first-token target");
ABSL_FLAG(double, itl_target_ms, 50, "inter-token latency target");
ABSL_FLAG(double, quantile, 0.99,
          "the latency quantile the targets hold for (0.99: p99)");
ABSL_FLAG(double, interval_s, 30, "seconds between two decisions");
ABSL_FLAG(int32_t, min_prefill, 1, "fewest prefill workers");
ABSL_FLAG(int32_t, max_prefill, 1000, "most prefill workers");
ABSL_FLAG(int32_t, min_decode, 1, "fewest decode workers");
ABSL_FLAG(int32_t, max_decode, 1000, "most decode workers");
ABSL_FLAG(double, budget, 0,
          "most total cost of both pools, in the profile's cost unit "
          "(cores, GPUs); 0: no budget");
ABSL_FLAG(double, hysteresis, 0.15,
          "scale down only to a size that still meets the targets with "
          "this much more load");
ABSL_FLAG(double, scale_down_window_s, 180,
          "scale down only to the largest size wanted over this window");
ABSL_FLAG(double, max_scale_down_fraction, 0.5,
          "most of a pool removed in one decision (at least one worker)");
ABSL_FLAG(double, manual_hold_s, 600,
          "after someone else changes a pool's size, keep it this long");
ABSL_FLAG(double, min_requests_per_sample, 10,
          "an interval with fewer requests is not a sample of the load's "
          "trend (cold start)");
ABSL_FLAG(std::string, decision_log, "",
          "append every decision here, one JSON object per line");

namespace pdserve::autoscaler {

absl::StatusOr<std::unique_ptr<planner::Planner>> PlannerFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_profile);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "--profile is required: a capacity profile JSON (pdctl profile "
        "measures one)");
  }
  absl::StatusOr<planner::CapacityProfile> profile =
      planner::CapacityProfile::Load(path);
  if (!profile.ok()) return profile.status();
  planner::PlannerOptions o;
  o.ttft_target_s = absl::GetFlag(FLAGS_ttft_target_ms) / 1000;
  o.itl_target_s = absl::GetFlag(FLAGS_itl_target_ms) / 1000;
  o.quantile = absl::GetFlag(FLAGS_quantile);
  o.interval_s = absl::GetFlag(FLAGS_interval_s);
  o.min_prefill = absl::GetFlag(FLAGS_min_prefill);
  o.max_prefill = absl::GetFlag(FLAGS_max_prefill);
  o.min_decode = absl::GetFlag(FLAGS_min_decode);
  o.max_decode = absl::GetFlag(FLAGS_max_decode);
  o.budget = absl::GetFlag(FLAGS_budget);
  o.hysteresis = absl::GetFlag(FLAGS_hysteresis);
  o.scale_down_window_s = absl::GetFlag(FLAGS_scale_down_window_s);
  o.max_scale_down_fraction = absl::GetFlag(FLAGS_max_scale_down_fraction);
  o.manual_hold_s = absl::GetFlag(FLAGS_manual_hold_s);
  o.predictor.min_requests_per_sample =
      absl::GetFlag(FLAGS_min_requests_per_sample);
  if (!(o.quantile > 0 && o.quantile < 1)) {
    return absl::InvalidArgumentError("--quantile must be in (0, 1)");
  }
  if (!(o.interval_s > 0)) {
    return absl::InvalidArgumentError("--interval_s must be positive");
  }
  return planner::Planner::Create(o, *std::move(profile));
}

absl::Duration PlannerIntervalFromFlags() {
  return absl::Seconds(absl::GetFlag(FLAGS_interval_s));
}

std::string DecisionLogFromFlags() { return absl::GetFlag(FLAGS_decision_log); }

}  // namespace pdserve::autoscaler
