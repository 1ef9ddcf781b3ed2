// MembershipClient: a worker's side of router membership.
//
// One session with one router (router_membership.h runs one per router).
// Runs one background thread that registers the worker with the router
// (retrying with backoff while the router is unreachable), heartbeats at the
// interval the router asks for with the worker's current state and load,
// registers again when the router has forgotten the lease (router restart,
// missed lease), and passes router commands (drain) to the worker.
//
// Ownership: owns its thread; the callbacks must stay valid until Stop()
// returns or the client is destroyed.
// Thread-safety: Stop() and registered() may be called from any thread; the
// callbacks run on the client's thread and must not block for long.
#ifndef PDSERVE_WORKER_MEMBERSHIP_CLIENT_H_
#define PDSERVE_WORKER_MEMBERSHIP_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "proto/membership.grpc.pb.h"
#include "rpc/cluster_credential.h"
#include "worker/prefix_cache_feed.h"

namespace pdserve::worker {

// What the worker reports with each heartbeat.
struct WorkerStatusReport {
  v1::WorkerState state = v1::WORKER_STATE_SERVING;
  v1::WorkerLoad load;
  uint32_t inflight_requests = 0;
};

struct MembershipClientOptions {
  std::string router_address;        // host:port of the router.
  v1::RegisterRequest registration;  // Sent on every (re-)registration.
  // Called before each heartbeat.
  std::function<WorkerStatusReport()> report_status;
  // Called when the router asks the worker to drain within `deadline`.
  std::function<void(absl::Duration deadline)> on_drain;
  // Deadline of each call to the router.
  absl::Duration rpc_timeout = absl::Seconds(2);
  // Presented on every call (membership is the control plane).
  rpc::ClusterCredential credential;
  // Where the heartbeats' prefix-cache events come from; the client
  // subscribes under router_address, asks for a snapshot on every
  // (re-)registration and acknowledges what a heartbeat delivered. Null:
  // no events. Not owned; must outlive the client.
  PrefixCacheFeed* prefix_cache_feed = nullptr;
};

class MembershipClient {
 public:
  static absl::StatusOr<std::unique_ptr<MembershipClient>> Start(
      MembershipClientOptions options);
  ~MembershipClient();  // Stop(), if not yet called.
  MembershipClient(const MembershipClient&) = delete;
  MembershipClient& operator=(const MembershipClient&) = delete;

  // Stops heartbeating and deregisters (best effort, bounded by rpc_timeout).
  void Stop(const std::string& reason);

  // True while the worker holds a lease the router accepted.
  bool registered();

 private:
  explicit MembershipClient(MembershipClientOptions options);
  void Loop();
  bool TryRegister();
  void SendHeartbeat();

  const MembershipClientOptions options_;
  std::unique_ptr<v1::Membership::Stub> stub_;
  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::string lease_id_ ABSL_GUARDED_BY(mutex_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mutex_) =
      absl::Milliseconds(500);
  std::thread thread_;
};

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_MEMBERSHIP_CLIENT_H_
