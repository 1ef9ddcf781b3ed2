// RouterMembership: a worker's membership with every router.
//
// --router names the routers (router_targets.h): a list, or a DNS name
// resolved to every router pod. One MembershipClient session runs per
// router, each on its own thread with its own lease, so a router that is
// down or slow stalls nobody but its own session; the others keep the
// worker registered and heartbeating. A drain command from any router
// reaches the worker (on_drain); the other routers then see DRAINING in
// its heartbeats. Prefix-cache events reach every router through one
// PrefixCacheFeed (prefix_cache_feed.h): each session has its own queue,
// and a router that (re)registers gets a snapshot.
//
// The DNS form is resolved again every resolve_interval: a new address
// gets a session (and a snapshot), a vanished one is dropped (its session
// deregisters, best effort). A failed resolution keeps the current
// sessions.
//
// A router that dies loses only its own in-flight requests; the worker
// keeps serving through the others. KV blocks the dead router had admitted
// on a decode worker are freed when their reservation ends
// (--admission_ttl_ms on the decode worker), and a prefill whose caller
// went away is cancelled.
//
// Ownership: owns the sessions and the resolver thread; the callbacks in
// the session template and the feed must outlive it.
// Thread-safety: Stop() and the accessors may be called from any thread.
#ifndef PDSERVE_WORKER_ROUTER_MEMBERSHIP_H_
#define PDSERVE_WORKER_ROUTER_MEMBERSHIP_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/membership_client.h"
#include "worker/prefix_cache_feed.h"
#include "worker/router_targets.h"

namespace pdserve::worker {

struct RouterMembershipOptions {
  RouterTargets targets;
  // Every session's options; router_address and prefix_cache_feed are
  // filled in per router.
  MembershipClientOptions session;
  // Not owned; may be null (no prefix-cache events).
  PrefixCacheFeed* prefix_cache_feed = nullptr;
  // How often a DNS name is resolved again.
  absl::Duration resolve_interval = absl::Seconds(5);
  HostResolver resolve = ResolveHost;
};

class RouterMembership {
 public:
  // INVALID_ARGUMENT when there is no router (an empty list) or a callback
  // is missing. A DNS name that does not resolve yet is not an error: it is
  // tried again every resolve_interval.
  static absl::StatusOr<std::unique_ptr<RouterMembership>> Start(
      RouterMembershipOptions options);
  ~RouterMembership();  // Stop("shutdown"), if not yet called.
  RouterMembership(const RouterMembership&) = delete;
  RouterMembership& operator=(const RouterMembership&) = delete;

  // Stops re-resolving, then stops every session at once (each deregisters,
  // bounded by the rpc timeout).
  void Stop(const std::string& reason);

  // The routers with a session now, sorted.
  std::vector<std::string> routers();
  // How many of them hold a lease.
  int registered_count();

 private:
  explicit RouterMembership(RouterMembershipOptions options)
      : options_(std::move(options)) {}
  // Starts sessions for new addresses and stops those of vanished ones.
  void Update(const std::vector<std::string>& addresses);
  void ResolveLoop();

  const RouterMembershipOptions options_;
  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::map<std::string, std::unique_ptr<MembershipClient>> sessions_
      ABSL_GUARDED_BY(mutex_);
  std::thread resolver_;
};

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_ROUTER_MEMBERSHIP_H_
