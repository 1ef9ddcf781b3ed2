// How the live planner acts on its decisions: a Scaler sets the replicas
// of the prefill and decode pools, and says what they were last set to by
// anyone (the planner or an operator), so the planner notices a change it
// did not make and holds it (planner.h, manual_hold_s) instead of fighting
// it.
//
//   - LocalClusterScaler: a cluster started with `pdctl up`, through the
//     same channel as `pdctl scale` (cli/scale.h: a request file its
//     supervisor carries out, serialized with any operator's pdctl scale by
//     scale.lock). Scale-up returns once the new workers serve; scale-down
//     drains the removed workers and migrates what outlives the drain
//     deadline, so no stream is dropped. The configured size of a pool is
//     its members in the supervisor's state file (cli/cluster_state.h),
//     which a finished scale, the planner's or an operator's, sets.
//   - PublishOnlyScaler: changes nothing. The planner's decision is
//     published as pdserve_planner_desired_replicas{pool} on its /metrics
//     for something else to act on (a Kubernetes HPA or a KEDA
//     ScaledObject per pool, deploy/); it cannot read what that controller
//     set, so the planner treats its own last decision as the configured
//     size (operators then change bounds on the HPA, not replicas).
//
// Thread-safety: Scale blocks (seconds to minutes: workers start, drain);
// the planner calls it from its own actuator thread (planner_loop.h). A
// scaler's methods may be called from two threads at once.
#ifndef PDSERVE_AUTOSCALER_SCALER_H_
#define PDSERVE_AUTOSCALER_SCALER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::autoscaler {

// Replicas by pool name ("prefill", "decode").
using PoolSizes = std::map<std::string, int>;

class Scaler {
 public:
  virtual ~Scaler() = default;

  // One line for logs: what this scaler acts on.
  virtual std::string Describe() const = 0;

  // The replicas each pool was last set to, or nullopt when this scaler
  // cannot know (publish-only). An error when it should know and cannot
  // (the cluster's state cannot be read).
  virtual absl::StatusOr<std::optional<PoolSizes>> Configured() = 0;

  // Sets `pool` to `replicas` and returns once done (its report), or why
  // it failed or was refused.
  virtual absl::StatusOr<std::string> Scale(const std::string& pool,
                                            int replicas) = 0;
};

struct LocalClusterScalerOptions {
  std::string work_dir;  // the pdctl up cluster's work folder
  // Each removed worker's drain deadline (then its streams migrate).
  absl::Duration drain_deadline = absl::Seconds(60);
  // Most time one worker takes to start and register.
  absl::Duration startup_timeout = absl::Seconds(120);
};
std::unique_ptr<Scaler> MakeLocalClusterScaler(
    LocalClusterScalerOptions options);

std::unique_ptr<Scaler> MakePublishOnlyScaler();

}  // namespace pdserve::autoscaler

#endif  // PDSERVE_AUTOSCALER_SCALER_H_
