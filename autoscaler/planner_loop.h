// The live planner (pd-planner, and `pdctl plan --once`): every interval
// it reads the cluster (the router's /metrics and its list of workers,
// cluster_observation.h), asks the planner core for the replicas each pool
// needs (planner/planner.h), logs the decision with its inputs (one JSON
// line, its time_s in Unix seconds), exports it as metrics (pdserve_planner_*,
// docs/planner.md), and hands the pools whose size should change to a Scaler
// (scaler.h).
//
// Deciding never waits for acting: scales run on the loop's actuator
// thread, one at a time, latest target first (a scale-down drains workers
// for up to the drain deadline; the next decisions still come on time).
// While a pool's scale is pending or running, the planner is told that
// pool's configured size is the target it asked for (it is not someone
// else's change); otherwise the scaler says what the pool was last set to,
// by the planner or by an operator.
//
// The load is every router's (cluster_observation.h). A router not read at
// both ends of an interval is left out of it (a warning names it) and
// measured again from its next scrape; when no router can be read, or the
// worker list cannot, the interval is skipped: no decision, nothing
// changed, the failure logged and counted (pdserve_planner_errors_total),
// the next interval measured from the last good scrapes.
//
// Thread-safety: Baseline, Tick and Run from one thread; the actuator is
// internal. Destruction waits for a scale in progress to finish.
#ifndef PDSERVE_AUTOSCALER_PLANNER_LOOP_H_
#define PDSERVE_AUTOSCALER_PLANNER_LOOP_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "autoscaler/scaler.h"
#include "metrics/counter.h"
#include "metrics/gauge.h"
#include "metrics/registry.h"
#include "metrics/text_parse.h"
#include "planner/planner.h"
#include "rpc/cluster_credential.h"

namespace pdserve::autoscaler {

struct PlannerLoopOptions {
  std::string router_control;  // host:port of the Admin API (ListWorkers)
  rpc::ClusterCredential credential;  // presented to it
  // host:port serving a router's /metrics; with several routers, all of
  // them, comma-separated, or dns:///NAME:PORT resolving to every one
  // (a headless Service): each counts only the requests it served.
  std::string router_http;
  absl::Duration interval = absl::Seconds(30);
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Decisions are appended here, one JSON object per line; "" for none.
  std::string decision_log;
  // False: advisory; decide, log and export, change nothing.
  bool act = true;
};

class PlannerLoop {
 public:
  // `registry` (outliving the loop) gets the pdserve_planner_* families.
  static absl::StatusOr<std::unique_ptr<PlannerLoop>> Create(
      PlannerLoopOptions options, std::unique_ptr<planner::Planner> planner,
      std::unique_ptr<Scaler> scaler, metrics::Registry* registry);
  ~PlannerLoop();
  PlannerLoop(const PlannerLoop&) = delete;
  PlannerLoop& operator=(const PlannerLoop&) = delete;

  // The first scrape, which the first interval is measured from.
  // UNAVAILABLE naming what could not be read.
  absl::Status Baseline();

  // One interval's decision (see the file comment). Without a baseline,
  // takes one and returns FAILED_PRECONDITION (nothing to measure yet).
  absl::StatusOr<planner::Decision> Tick();

  // Ticks every interval (from the baseline) until `stop_requested`
  // returns true; it is given the time to wait and returns early, true,
  // when the loop should end (a termination signal).
  void Run(const std::function<bool(absl::Duration)>& stop_requested);

  // Waits until the actuator has no scale pending or running, up to
  // `timeout`; false if it is still busy.
  bool AwaitIdle(absl::Duration timeout);

  const PlannerLoopOptions& options() const { return options_; }
  const planner::Planner& planner() const { return *planner_; }

 private:
  struct Exported {
    std::map<std::string, metrics::Gauge*> pool_gauges;  // "name/pool"
    std::map<std::string, metrics::Gauge*> gauges;
    metrics::Counter* decisions = nullptr;
    metrics::Counter* errors = nullptr;
    std::map<std::string, metrics::Counter*> scales;  // "pool/ok|failed"
  };

  PlannerLoop(PlannerLoopOptions options,
              std::unique_ptr<planner::Planner> planner,
              std::unique_ptr<Scaler> scaler);
  absl::Status RegisterMetrics(metrics::Registry* registry);
  void Export(const planner::Decision& decision);
  void Log(const std::string& line);
  // Replicas asked for per pool, as the planner must see them.
  void Configured(int ready_prefill, int ready_decode, int* prefill,
                  int* decode);
  void RequestScale(const std::string& pool, int replicas);
  void ActuatorMain();

  const PlannerLoopOptions options_;
  std::unique_ptr<planner::Planner> planner_;
  std::unique_ptr<Scaler> scaler_;
  Exported exported_;

  // Each router's scrape at the last good tick (or the baseline), by
  // address; empty until the first.
  std::map<std::string, metrics::ParsedMetrics> baseline_;
  absl::Time baseline_time_;
  // The planner's last decision per pool (publish-only: the configured
  // size).
  std::map<std::string, int> last_desired_;

  absl::Mutex mu_;
  // Targets not yet handed to the scaler, and the one it is working on.
  std::map<std::string, int> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<std::pair<std::string, int>> running_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread actuator_;
};

// A decision in words, for a terminal (pdctl plan --once): the load, the
// forecast, the lengths, the latencies against their targets, and per pool
// the replicas with the reasons.
std::string FormatDecision(const planner::Decision& decision,
                           const planner::PlannerOptions& options);

}  // namespace pdserve::autoscaler

#endif  // PDSERVE_AUTOSCALER_PLANNER_LOOP_H_
