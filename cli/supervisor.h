// Supervisor: keeps a local cluster (pdctl up) serving when one of its
// processes dies. The crashed process is started again after a backoff while
// the rest keep running; the router's own failure handling (a retry before
// the first token, a migration after it) covers the requests it held.
//
// What each exit means:
//   - a worker that exits 0 was drained (pdctl drain, SIGTERM): it has left
//     the cluster and is not started again;
//   - a worker being scaled down (Retire) has left whatever its exit: it is
//     not started again, and how it ended is kept for the scale's report;
//   - any other worker exit, and any router exit, is a crash: the process is
//     started again with its original flags (the router on its old
//     addresses, see LocalCluster::Restart) once its backoff has passed;
//   - backoff: RestartPolicy::initial_backoff, doubled with each consecutive
//     crash up to max_backoff. A process that ran stable_uptime before it
//     crashed is healthy again: its next backoff is the initial one;
//   - crash loop: crash_loop_limit consecutive crashes, each before
//     stable_uptime, (a start that fails counts as one) and the process is
//     left down and reported as crash-looping, not retried forever
//     (systemd's StartLimitBurst, rather than Kubernetes' endless
//     CrashLoopBackOff: a local cluster has nobody watching its retries).
//
// Time is passed in (Poll(now)), so the policy is testable without clocks;
// the restart itself (LocalCluster::Restart) waits on real processes.
//
// Ownership: borrows the cluster, which must outlive the supervisor.
// Thread-safety: not thread-safe; one thread polls (pdctl's supervisor
// process, which also started the cluster: see common/subprocess.h on
// PR_SET_PDEATHSIG).
#ifndef PDSERVE_CLI_SUPERVISOR_H_
#define PDSERVE_CLI_SUPERVISOR_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cli/local_cluster.h"

namespace pdserve::cli {

struct RestartPolicy {
  absl::Duration initial_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Seconds(30);
  absl::Duration stable_uptime = absl::Seconds(60);
  int crash_loop_limit = 5;

  // The wait before restart number `consecutive_crashes` (>= 1).
  absl::Duration Backoff(int consecutive_crashes) const;
};

enum class SupervisedState {
  kRunning,
  // Crashed; starts again at restart_at.
  kBackingOff,
  // Crashed crash_loop_limit times in a row; left down.
  kCrashLoop,
  // Exited 0 after a drain, or scaled down; left the cluster.
  kLeft,
  // Being scaled down (draining); becomes kLeft when it exits.
  kLeaving,
};

// "running", "backing-off", "crash-loop", "left", "leaving".
const char* SupervisedStateName(SupervisedState state);

// What the supervisor knows of one process (pdctl status shows it).
struct SupervisedProcess {
  std::string name;
  SupervisedState state = SupervisedState::kRunning;
  // Times it was started again after a crash.
  int restarts = 0;
  // How the last process under this name ended ("killed by signal 9
  // (Killed)", or why its restart failed); empty while none has.
  std::string last_exit;
  // When the current process started, or the last one did.
  absl::Time started;
  // Crashes since it last ran stable_uptime (0 while healthy).
  int consecutive_crashes = 0;
  // kBackingOff: when it starts again.
  absl::Time restart_at;
};

class Supervisor {
 public:
  // Supervises every process of `cluster` as started at `now`.
  Supervisor(LocalCluster& cluster, RestartPolicy policy, absl::Time now);

  // Notices processes that ended and starts again those whose backoff has
  // passed (each restart waits up to `restart_timeout` for the process to
  // serve). Returns true when any record changed (a state file to rewrite).
  // Logs each event to stdout/stderr.
  bool Poll(absl::Time now, absl::Duration restart_timeout);

  // In the cluster's process order, the router first.
  const std::vector<SupervisedProcess>& processes() const { return records_; }

  // Supervises the cluster's processes that have no record yet (workers a
  // scale-up added), as started at `now`.
  void AdoptNew(absl::Time now);
  // `name` is being scaled down: it is never started again; one not
  // running (backing off, crash-looping) has left at once. False if there
  // is no such process.
  bool Retire(const std::string& name);
  // Drops the record of a process that has left (its cluster entry goes
  // too, see LocalCluster::Remove).
  void Forget(const std::string& name);
  // The record named `name`, or nullptr.
  const SupervisedProcess* Find(const std::string& name) const;

 private:
  // A process under `record.name` ended with `how`; decides what next.
  void OnCrash(SupervisedProcess& record, const std::string& how,
               absl::Time now);

  LocalCluster& cluster_;
  const RestartPolicy policy_;
  std::vector<SupervisedProcess> records_;
};

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_SUPERVISOR_H_
