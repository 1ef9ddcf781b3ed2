// The flags of the planner's decision rule, shared by pd-planner and
// `pdctl plan`: the capacity profile, the latency targets, the interval,
// the pools' bounds and the budget, and the rule's damping (hysteresis,
// scale-down window, operator hold). docs/planner.md explains each.
//
//   --profile=FILE (required)   --ttft_target_ms   --itl_target_ms
//   --quantile   --interval_s   --min_prefill --max_prefill
//   --min_decode --max_decode   --budget   --hysteresis
//   --scale_down_window_s   --max_scale_down_fraction   --manual_hold_s
//   --min_requests_per_sample   --decision_log=FILE
#ifndef PDSERVE_AUTOSCALER_PLANNER_FLAGS_H_
#define PDSERVE_AUTOSCALER_PLANNER_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner/planner.h"

namespace pdserve::autoscaler {

// The planner the flags describe, its profile loaded. INVALID_ARGUMENT or
// NOT_FOUND naming the flag or file that is wrong.
absl::StatusOr<std::unique_ptr<planner::Planner>> PlannerFromFlags();

// --interval_s.
absl::Duration PlannerIntervalFromFlags();
// --decision_log.
std::string DecisionLogFromFlags();

}  // namespace pdserve::autoscaler

#endif  // PDSERVE_AUTOSCALER_PLANNER_FLAGS_H_
