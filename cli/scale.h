// pdctl scale POOL N: resizing a pool of a local cluster (pdctl up) while
// it serves, with no request dropped.
//
// The channel. The supervisor process that `pdctl up` left running owns the
// workers (they die with it), so only it can start or stop one; `pdctl
// scale` asks it to, through two files in the cluster's work folder, next
// to the state file (cluster.state) it already publishes there:
//
//   scale.request  "scale ID POOL N DRAIN_DEADLINE_MS", written whole by
//                  pdctl scale (a temporary file renamed into place);
//   scale.result   "result ID CODE" then the report, written whole by the
//                  supervisor once the scale is done (or refused).
//
// The supervisor looks for a request between two polls of its processes
// (every 200 ms), takes it (removes the file), carries it out, and writes
// the result. It keeps polling its other processes between two worker
// starts and while drained workers wind down (a crash meanwhile is
// restarted), though not during one worker's start-up; pdctl scale
// waits for the result bearing its ID and prints it. Files rather than a
// socket: nothing to bind, to find or to authenticate (whoever may write
// the work folder may already stop the cluster), no listener to keep alive,
// and a request or result is never half-read. A supervisor that dies
// mid-scale leaves pdctl scale to notice (its pid is gone) and fail; a
// request nobody took is removed by the next pdctl up.
//
// Serialized: each pdctl scale holds an exclusive flock on scale.lock from
// before it writes its request until it has read its result, so a second
// one waits its turn (and says so) and the two never see each other's
// result; the supervisor carries out one request at a time regardless.
//
// What a scale does (ScaleLocalCluster):
//   - up: starts workers of the pool (LocalCluster::AddWorker) and returns
//     once the router lists each as SERVING; the router routes only to
//     SERVING workers (GenerationCore::Candidates), so none gets work
//     before its model is loaded and it has registered;
//   - down: picks the workers to remove (ChooseVictims: one down or
//     DRAINING first, then the fewest requests in flight), drains them
//     through the router (Admin DrainWorker with the drain deadline; SIGTERM
//     if the router does not answer), and waits for them to exit. A worker
//     still holding requests at its drain deadline hands them back to the
//     router, which migrates running streams to the remaining workers and
//     retries queued prompts there (worker/worker_process.h): no stream is
//     dropped, no token lost or repeated. The report gives each removed
//     worker's exit status (0 when it drained cleanly);
//   - refused (FAILED_PRECONDITION, nothing changed): a pool size below 0,
//     or no worker left that decodes (decode + colocated = 0). A prefill
//     pool may go to 0: decode and colocated workers then prefill every
//     prompt themselves (the router's local-prefill path).
//
// Thread-safety: the functions are thread-compatible; ScaleLocalCluster
// runs on the supervisor's thread.
#ifndef PDSERVE_CLI_SCALE_H_
#define PDSERVE_CLI_SCALE_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/local_cluster.h"
#include "cli/supervisor.h"

namespace pdserve::cli {

struct ScaleRequest {
  std::string id;
  std::string pool;  // "prefill", "decode" or "colocated"
  int replicas = 0;
  absl::Duration drain_deadline = absl::Seconds(60);
};

// "scale ID POOL N MS" and back; INVALID_ARGUMENT names what is wrong.
std::string FormatScaleRequest(const ScaleRequest& request);
absl::StatusOr<ScaleRequest> ParseScaleRequest(const std::string& line);

// INVALID_ARGUMENT unless `pool` is prefill, decode or colocated.
absl::Status CheckPoolName(const std::string& pool);
// The pool of a worker named POOL-I ("" for the router or anything else).
std::string PoolOfWorker(const std::string& name);

// Whether a cluster of these pool sizes can serve; FAILED_PRECONDITION
// saying why not.
absl::Status CheckPoolSizes(const std::map<std::string, int>& sizes);

// A worker that could be removed, as the supervisor and the router see it.
struct ScaleCandidate {
  std::string name;
  // Not running (backing off after a crash, crash-looping): removing it
  // costs nothing.
  bool down = false;
  bool draining = false;  // The router lists it DRAINING.
  uint32_t inflight = 0;  // Requests in flight, from its heartbeat.
};
// The `count` workers to remove: those down first, then those draining,
// then the fewest requests in flight; among equals the newest (highest
// index) first, so the longest-lived, warmest workers stay.
std::vector<std::string> ChooseVictims(std::vector<ScaleCandidate> candidates,
                                       int count);

// Carries out `request` on the cluster the supervisor runs. `tick` is
// called while it waits (at least every 200 ms): the supervisor keeps
// polling its other processes then. Returns the report (which workers were
// started or removed and how they exited); an error says what failed or why
// the scale was refused, after whatever it had already done.
absl::StatusOr<std::string> ScaleLocalCluster(
    LocalCluster& cluster, Supervisor& supervisor, const ScaleRequest& request,
    absl::Duration startup_timeout, const std::function<void()>& tick);

// ---- The file channel -------------------------------------------------
// Paths in the cluster's work folder.
std::string ScaleRequestPath(const std::string& work_dir);
std::string ScaleResultPath(const std::string& work_dir);
std::string ScaleLockPath(const std::string& work_dir);

// Supervisor side: takes the pending request, if any (the file is removed
// whatever it held); a malformed one is an error to answer with its ID
// when it has one (*id).
std::optional<absl::StatusOr<ScaleRequest>> TakeScaleRequest(
    const std::string& work_dir, std::string* id);
// Supervisor side: the result of request `id`.
void WriteScaleResult(const std::string& work_dir, const std::string& id,
                      const absl::StatusOr<std::string>& result);

// pdctl scale: sends `request` to the supervisor and waits up to `timeout`
// for its result, giving up early when `supervisor_alive` turns false.
// Holds scale.lock throughout (printing to `waiting` if it must wait for
// another scale). Returns the report, or the supervisor's error.
absl::StatusOr<std::string> RequestScale(
    const std::string& work_dir, const ScaleRequest& request,
    absl::Duration timeout, const std::function<bool()>& supervisor_alive,
    std::ostream& waiting);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_SCALE_H_
