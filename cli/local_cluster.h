// LocalCluster: one or more routers plus prefill and decode workers as real
// processes on this host, for `pdctl up`, the quick start and multi-process
// tests.
//
// Start() launches the routers, waits until they are SERVING, launches the
// workers pointed at all of them (--router=A,B,...), and returns once every
// process is SERVING and every router lists every worker: a started cluster
// is a usable cluster. A process
// that dies during start-up fails Start() with the end of its log.
//
// Ownership: owns the processes; destroying the cluster kills any still
// running (they never outlive it, see common/subprocess.h).
// Thread-safety: not thread-safe; use from one thread.
#ifndef PDSERVE_CLI_LOCAL_CLUSTER_H_
#define PDSERVE_CLI_LOCAL_CLUSTER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "rpc/cluster_credential.h"

namespace pdserve::cli {

struct LocalClusterOptions {
  // Routers; each serves every worker. The first listens where
  // router_listen, http_listen and control_listen say, the others on ports
  // of their own (picked free).
  int num_routers = 1;
  // Folder holding router/pd-router, prefill_worker/pd-prefill-worker and
  // decode_worker/pd-decode-worker (Bazel's bazel-bin layout), or the three
  // binaries side by side (installed layout).
  std::string bin_dir;
  int num_prefill = 1;
  int num_decode = 1;
  // Colocated workers (pd-decode-worker --colocated): both phases in one.
  int num_colocated = 0;
  // The GGUF file every process serves; empty: the default model.
  std::string model_path;
  // The first router's listen addresses (client gRPC, OpenAI HTTP,
  // control); port 0 picks a free port.
  std::string router_listen = "127.0.0.1:0";
  std::string http_listen = "127.0.0.1:0";
  std::string control_listen = "127.0.0.1:0";
  // Extra flags for the router and for every worker (e.g. --threads=1,
  // --kv_cache_mb=64, --routing_policy=round_robin).
  std::vector<std::string> router_args;
  std::vector<std::string> worker_args;
  // Extra flags for every worker of one pool, by pool name ("prefill",
  // "decode", "colocated"), after worker_args (pdctl profile: a testing
  // delay on one pool only). Workers AddWorker starts get them too.
  std::map<std::string, std::vector<std::string>> pool_args;
  // Extra flags for one process, by name ("prefill-0"), after the above
  // (tests: faults injected into one worker only).
  std::map<std::string, std::vector<std::string>> process_args;
  // CPUs a process is pinned to, by name ("router", "prefill-0"); absent:
  // any CPU.
  std::map<std::string, std::vector<int>> process_cpus;
  // Per-process logs (NAME.log) and port files go here; must exist.
  std::string work_dir;
  absl::Duration lease = absl::Seconds(3);
  absl::Duration heartbeat = absl::Milliseconds(500);
  absl::Duration startup_timeout = absl::Seconds(30);
  // The cluster's token file (rpc/cluster_credential.h), passed to every
  // process as --cluster_token_file and presented by the cluster's own
  // admin calls; empty: auth off.
  std::string cluster_token_file;
};

// Where one router serves.
struct LocalRouter {
  std::string name;     // "router" (the first), "router-1", ...
  std::string address;  // client gRPC host:port
  std::string control_address;
  std::string http_url;  // "http://127.0.0.1:PORT"; empty if none
};

struct LocalProcess {
  // "router", "router-1", ..., "prefill-0", "decode-0", ...
  std::string name;
  std::string address;  // host:port it serves gRPC on.
  // host:port of its GET /metrics (the router's HTTP port); empty if none.
  std::string metrics_address;
  std::string log_path;
  std::unique_ptr<Subprocess> process;
  // How it was started (for Restart).
  std::string binary;
  std::vector<std::string> args;
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      const LocalClusterOptions& options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // The first router's client gRPC address.
  const std::string& router_address() const { return processes_[0].address; }
  // Its control address (membership, admin API: pdctl, ListWorkers).
  const std::string& control_address() const {
    return routers_[0].control_address;
  }
  // What the cluster's control plane demands (from cluster_token_file).
  const rpc::ClusterCredential& credential() const { return credential_; }
  const std::string& cluster_token_file() const {
    return options_.cluster_token_file;
  }
  // Its OpenAI HTTP base, "http://127.0.0.1:PORT".
  const std::string& http_url() const { return routers_[0].http_url; }
  // Every router, the first first.
  const std::vector<LocalRouter>& routers() const { return routers_; }
  bool IsRouter(const std::string& name) const;
  // The control address of the first router whose process runs (the first
  // one's when none does).
  std::string live_control_address();

  // All processes, the routers first. Null process pointers never occur.
  std::vector<LocalProcess>& processes() { return processes_; }

  // The process named `name`, or nullptr.
  LocalProcess* Find(const std::string& name);

  // Starts process `name` again with its original flags, once its previous
  // process has exited (killed or drained), and waits until every running
  // router lists it as SERVING. A router comes back on the same addresses,
  // and the wait is for every running worker to register with it again.
  // FAILED_PRECONDITION when the old one still runs a second after the
  // call (a process just killed gets that second to be reaped).
  absl::Status Restart(const std::string& name, absl::Duration timeout);

  // Starts one more worker of `pool` ("prefill", "decode" or "colocated")
  // with the flags Start gives that pool, named POOL-I with I one past the
  // highest index that pool has used (names are never reused, so a new
  // worker is never taken for an old one's lingering registration), and
  // waits until the router lists it as SERVING. Returns its name. Appending
  // invalidates pointers into processes(); look processes up by name.
  absl::StatusOr<std::string> AddWorker(const std::string& pool,
                                        absl::Duration timeout);

  // Forgets a worker that has exited (scaled down). FAILED_PRECONDITION
  // while it runs; routers cannot be removed.
  absl::Status Remove(const std::string& name);

  // SIGTERM to workers (they drain and deregister), then the routers; each
  // gets `grace` before SIGKILL. Errors list every process that did not
  // exit cleanly (code 0) or had already died.
  absl::Status Stop(absl::Duration grace);

 private:
  LocalCluster() = default;

  // Starts a process and waits until it serves; its port file's numbers
  // go to *ports (the first is the gRPC port health is checked on).
  absl::StatusOr<LocalProcess> Launch(const std::string& name,
                                      const std::string& binary,
                                      std::vector<std::string> args,
                                      absl::Time give_up,
                                      std::vector<int>* ports = nullptr);
  // A worker's flags, as Start and AddWorker give them.
  std::vector<std::string> WorkerArgs(const std::string& name,
                                      const std::string& pool) const;
  // Waits until each router in `routers` (every running one when empty)
  // lists every worker in `names` as SERVING.
  absl::Status AwaitServing(const std::vector<std::string>& names,
                            absl::Time give_up,
                            std::vector<std::string> routers = {});

  LocalClusterOptions options_;
  rpc::ClusterCredential credential_;
  // The routers first (routers_.size() of them), then the workers.
  std::vector<LocalProcess> processes_;
  std::vector<LocalRouter> routers_;
  std::string prefill_bin_;
  std::string decode_bin_;
  // By pool: the highest worker index used so far.
  std::map<std::string, int> last_index_;
};

// Finds `relative` ("router/pd-router") under bin_dir, falling back to its
// base name directly in bin_dir. NOT_FOUND names both paths tried.
absl::StatusOr<std::string> FindBinary(const std::string& bin_dir,
                                       const std::string& relative);

// The last `max_bytes` of a file, for error messages.
std::string TailOfFile(const std::string& path, size_t max_bytes = 2000);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_LOCAL_CLUSTER_H_
