// The state file of a `pdctl up` cluster (WORK_DIR/cluster.state): what its
// supervisor last recorded, for the other pdctl commands (status, top,
// down, scale) and the planner's local scaler (autoscaler/) to read.
//
//   pid 4242                               the supervisor (pdctl up)
//   grpc 127.0.0.1:50050                   the router's client gRPC
//   http http://127.0.0.1:8000/v1          its OpenAI HTTP base
//   control 127.0.0.1:50051                its control port (admin API)
//   token_file /abs/path                   --cluster_token_file, when set
//   router NAME GRPC HTTP CONTROL          one line per router, the first
//                                          (the one above) first
//   process NAME ADDRESS PID LOG STATE RESTARTS LAST-EXIT...
//
// one process line per supervised process, the routers first; STATE is
// SupervisedStateName's ("running", "backing-off", "crash-loop", "leaving",
// "left") and LAST-EXIT the rest of the line ("-" when none). The
// supervisor rewrites the whole file (a temporary file renamed into place)
// whenever a process changes and after every scale, so a reader never sees
// half of it.
//
// Thread-safety: plain values and functions.
#ifndef PDSERVE_CLI_CLUSTER_STATE_H_
#define PDSERVE_CLI_CLUSTER_STATE_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::cli {

struct ClusterStateProcess {
  std::string name;  // "router", "prefill-0", ...
  std::string address;
  pid_t pid = 0;
  std::string log_path;
  std::string state;  // SupervisedStateName
  int restarts = 0;
  std::string last_exit;  // "-" when none
};

// Where one router serves (pdctl up --routers=N starts N).
struct ClusterStateRouter {
  std::string name;  // "router", "router-1", ...
  std::string grpc;
  std::string http;  // "http://host:port/v1"
  std::string control;
};

struct ClusterState {
  pid_t supervisor_pid = 0;
  std::string grpc;     // host:port
  std::string http;     // "http://host:port/v1"
  std::string control;  // host:port
  // The cluster's --cluster_token_file (absolute); empty: auth off. Later
  // pdctl commands present its token to the router.
  std::string cluster_token_file;
  // Every router; grpc, http and control above are the first one's.
  std::vector<ClusterStateRouter> routers;
  std::vector<ClusterStateProcess> processes;

  // "host:port" of the HTTP base (where the router serves /metrics).
  std::string HttpAddress() const;
  // Every router's host:port of its HTTP port (its /metrics), the first
  // first; `http`'s alone in a state file from before routers were listed.
  std::vector<std::string> RouterHttpAddresses() const;
  // Members of each pool ("prefill", "decode", "colocated"; all three
  // present): its workers that have not left or begun leaving. A worker
  // backing off after a crash is still a member. This is the size the pool
  // was last asked for, once a scale has finished.
  std::map<std::string, int> PoolSizes() const;
};

std::string ClusterStatePath(const std::string& work_dir);

// The control address of the first router in `state` that `answers` (one
// may have died: any router serves the whole cluster); empty when none
// does.
std::string FirstLiveRouterControl(
    const ClusterState& state,
    const std::function<bool(const std::string& control)>& answers);

// INVALID_ARGUMENT naming the line that is malformed. Unknown keys are
// skipped (a newer supervisor may add lines).
absl::StatusOr<ClusterState> ParseClusterState(absl::string_view text);
// NOT_FOUND when there is no state file (no cluster up in that folder).
absl::StatusOr<ClusterState> ReadClusterState(const std::string& work_dir);
// The text ParseClusterState reads.
std::string FormatClusterState(const ClusterState& state);
// Writes the file whole (temporary file, then rename).
absl::Status WriteClusterState(const std::string& work_dir,
                               const ClusterState& state);

// The supervisor pid the state file in `work_dir` records, when that
// process still runs and is a pdctl (a stale file from a supervisor that
// was killed must not make anyone signal whatever process reused its pid).
std::optional<pid_t> LiveSupervisor(const std::string& work_dir);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_CLUSTER_STATE_H_
