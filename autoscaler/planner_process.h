// The planner process's life, shared by pd-planner and `pdctl plan`: the
// planner from its flags (planner_flags.h), the scaler, the loop, its
// /metrics, and either one advisory decision or decisions until a
// termination signal.
#ifndef PDSERVE_AUTOSCALER_PLANNER_PROCESS_H_
#define PDSERVE_AUTOSCALER_PLANNER_PROCESS_H_

#include <string>

#include "autoscaler/scaler.h"

namespace pdserve::autoscaler {

struct PlannerProcessOptions {
  std::string router_control;  // the router's Admin API
  std::string router_http;     // its GET /metrics
  // "local" (a pdctl up cluster: `local`) or "publish".
  std::string scaler = "publish";
  LocalClusterScalerOptions local;
  // Where to serve the planner's /metrics ("" for nowhere), and a file to
  // write its port to ("" for none).
  std::string metrics_listen;
  std::string port_file;
  // One advisory decision, printed in words; nothing changed.
  bool once = false;
  // The cluster's token file (--cluster_token_file), presented to the
  // router's Admin API; empty: auth off.
  std::string cluster_token_file;
};

// The process's exit code: 0 after a termination signal or --once's
// decision; 1 (with the reason on stderr) for a wrong configuration or,
// once, a router that cannot be read.
int RunPlannerProcess(const PlannerProcessOptions& options);

}  // namespace pdserve::autoscaler

#endif  // PDSERVE_AUTOSCALER_PLANNER_PROCESS_H_
