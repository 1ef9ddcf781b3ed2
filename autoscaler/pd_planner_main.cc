// pd-planner: the SLO planner as a process. Every --interval_s it reads
// the router (its /metrics and its list of workers), decides how many
// prefill and decode workers the targets need (planner/, docs/planner.md),
// logs the decision as one JSON line (stdout and --decision_log), exports
// it at --metrics_listen as pdserve_planner_* (desired replicas per pool
// for an HPA or KEDA), and with --scaler=local resizes a `pdctl up`
// cluster through pdctl scale's channel.
//
//   pd-planner --profile=p.json --router=127.0.0.1:50051
//       --router_http=127.0.0.1:8000 --scaler=local --work_dir=DIR
//       --ttft_target_ms=2000 --itl_target_ms=50
//
// --once: one advisory decision (a baseline scrape, --interval_s later
// the decision) printed in words and as JSON; nothing is changed. Exit
// codes: 0 after a termination signal (or --once's decision), 1 when the
// configuration is wrong or, with --once, the router cannot be read.
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "autoscaler/planner_process.h"
#include "common/termination_signal.h"
#include "rpc/cluster_credential_flags.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50051",
          "the router's control address (Admin API: the worker list)");
ABSL_FLAG(std::string, router_http, "127.0.0.1:8000",
          "the routers' HTTP addresses (GET /metrics): comma-separated, or "
          "dns:///NAME:PORT resolved every interval to every router (a "
          "headless Service); every router, since each counts only the "
          "requests it served");
ABSL_FLAG(std::string, scaler, "publish",
          "how decisions are carried out: local (a pdctl up cluster, "
          "--work_dir) or publish (only export "
          "pdserve_planner_desired_replicas, for an HPA or KEDA)");
ABSL_FLAG(std::string, work_dir, "",
          "--scaler=local: the pdctl up cluster's work folder");
ABSL_FLAG(int32_t, drain_deadline_ms, 60000,
          "--scaler=local: a removed worker's drain deadline (then its "
          "streams migrate to the others)");
ABSL_FLAG(int32_t, startup_timeout_s, 120,
          "--scaler=local: most time a new worker takes to serve");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "where to serve GET /metrics ('' for nowhere)");
ABSL_FLAG(std::string, port_file, "",
          "write the metrics port here once serving (tests)");
ABSL_FLAG(bool, once, false, "one advisory decision, printed; change nothing");

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "the SLO planner: sizes the prefill and decode pools from the "
      "router's metrics (docs/planner.md)");
  absl::ParseCommandLine(argc, argv);
  return pdserve::autoscaler::RunPlannerProcess(
      {.router_control = absl::GetFlag(FLAGS_router),
       .router_http = absl::GetFlag(FLAGS_router_http),
       .scaler = absl::GetFlag(FLAGS_scaler),
       .local = {.work_dir = absl::GetFlag(FLAGS_work_dir),
                 .drain_deadline =
                     absl::Milliseconds(absl::GetFlag(FLAGS_drain_deadline_ms)),
                 .startup_timeout =
                     absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s))},
       .metrics_listen = absl::GetFlag(FLAGS_metrics_listen),
       .port_file = absl::GetFlag(FLAGS_port_file),
       .once = absl::GetFlag(FLAGS_once),
       .cluster_token_file = pdserve::rpc::ClusterTokenFileFromFlags()});
}
