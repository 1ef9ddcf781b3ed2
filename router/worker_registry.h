// WorkerRegistry: the router's view of which workers exist and how loaded
// they are.
//
// Workers register, then heartbeat within their lease; a worker whose lease
// runs out is dropped (it crashed, hung or lost the network), so routing never
// picks it. Re-registering under the same worker_id (a restarted process)
// replaces the old entry and invalidates its lease. Drain requests queue a
// command that the worker receives with its next heartbeat.
//
// Time is passed in by the caller (`now`) rather than read from a clock, so
// lease expiry is deterministic in tests and the registry has no thread.
//
// This is a core library: it uses the message types of proto/common.proto
// but no gRPC. Thread-safe: all methods may be called concurrently.
#ifndef PDSERVE_ROUTER_WORKER_REGISTRY_H_
#define PDSERVE_ROUTER_WORKER_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/common.pb.h"
#include "proto/membership.pb.h"

namespace pdserve::router {

// What a worker says about itself when it registers.
struct WorkerRegistration {
  std::string worker_id;    // Stable name, e.g. "decode-0".
  std::string instance_id;  // Unique per process start.
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  std::string address;  // host:port of its gRPC server.
  v1::ModelInfo model;
  std::vector<v1::TransportKind> transports;
  std::string version;
  // Where the worker serves GET /metrics ("host:port"); may be empty.
  std::string metrics_address;
};

// The registry's record of one live worker.
struct WorkerRecord {
  WorkerRegistration registration;
  std::string lease_id;
  v1::WorkerState state = v1::WORKER_STATE_STARTING;
  v1::WorkerLoad load;
  uint32_t inflight_requests = 0;
  absl::Time registered_at;
  absl::Time last_heartbeat;
  absl::Time lease_expiry;
  // Set by RequestDrain; sent with every heartbeat reply until the worker
  // reports DRAINING (a lost reply must not lose the command).
  std::optional<absl::Duration> pending_drain;
};

struct Lease {
  std::string lease_id;
  absl::Duration duration;
  absl::Duration heartbeat_interval;
};

// What a heartbeat carries in and what the worker must do afterwards.
struct HeartbeatReport {
  v1::WorkerState state = v1::WORKER_STATE_SERVING;
  v1::WorkerLoad load;
  uint32_t inflight_requests = 0;
  // Prefix-cache changes since the previous heartbeat, in order.
  std::vector<v1::PrefixCacheEvent> events;
  // The worker's index here is replaced: events start with a snapshot of
  // its whole cache (sent after each registration with this router, and
  // when its queue for this router overflowed; worker/prefix_cache_feed.h).
  bool events_reset = false;
};
struct HeartbeatReply {
  // When set, the worker must stop taking new work and finish in-flight work
  // within this time.
  std::optional<absl::Duration> drain;
};

struct WorkerRegistryOptions {
  // A worker silent for this long is removed.
  absl::Duration lease_duration = absl::Seconds(3);
  // How often workers are told to heartbeat; must be well below the lease.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
};

class WorkerRegistry {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(
      const WorkerRegistryOptions& options);

  // INVALID_ARGUMENT for a missing worker_id, address or role.
  absl::StatusOr<Lease> Register(const WorkerRegistration& registration,
                                 absl::Time now);

  // NOT_FOUND when the lease is unknown or expired: the worker must
  // register again. A worker asked to drain stays DRAINING whatever it
  // reports until it deregisters.
  absl::StatusOr<HeartbeatReply> Heartbeat(const std::string& lease_id,
                                           const HeartbeatReport& report,
                                           absl::Time now);

  // NOT_FOUND when the lease is unknown (already gone is not an error to
  // the caller, but it is reported).
  absl::Status Deregister(const std::string& lease_id);

  // Asks a worker to drain: it is DRAINING (no new work) from now on, and
  // its heartbeat replies carry the command. NOT_FOUND for an unknown id.
  absl::Status RequestDrain(const std::string& worker_id,
                            absl::Duration deadline);

  // Removes workers whose lease ran out by `now`; returns the ids of every
  // worker removed that way since the last call (also those a List or
  // Heartbeat expired), so a caller can stop the calls still in flight to
  // them.
  std::vector<std::string> ExpireLeases(absl::Time now);

  // Live workers (after expiring leases at `now`), ordered by role then
  // worker id. WORKER_ROLE_UNSPECIFIED selects every role; PREFILL and
  // DECODE also select colocated (BOTH) workers, which do both.
  // `exact_role` selects only workers of exactly `role`.
  std::vector<WorkerRecord> List(absl::Time now, v1::WorkerRole role,
                                 bool exact_role = false);

  // Live workers of exactly `role` in `state` (as of the last expiry; for
  // metrics, which must not change the registry).
  int Count(v1::WorkerRole role, v1::WorkerState state);

  // How many leading entries of `chain_keys` (a prompt's block chain keys,
  // engine/block_hash.h) the worker reported holding in its prefix
  // cache; 0 for an unknown worker. The KV-aware routing score.
  int32_t CachedPrefixBlocks(const std::string& worker_id,
                             absl::Span<const uint64_t> chain_keys);

  // Random per-router-process id; part of every lease id, so a lease from
  // an earlier router process is never mistaken for a current one.
  const std::string& router_id() const { return router_id_; }

 private:
  WorkerRegistry(const WorkerRegistryOptions& options, std::string router_id)
      : options_(options), router_id_(std::move(router_id)) {}

  // Removes workers whose lease ran out, adding them to
  // unreported_expired_ (which ExpireLeases hands out).
  void ExpireLeasesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const WorkerRegistryOptions options_;
  const std::string router_id_;
  absl::Mutex mutex_;
  // Keyed by worker_id.
  absl::flat_hash_map<std::string, WorkerRecord> workers_
      ABSL_GUARDED_BY(mutex_);
  // worker_id -> chain keys of the blocks in its prefix cache (the index
  // built from heartbeat events; kept apart from WorkerRecord, which List
  // copies).
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> prefix_keys_
      ABSL_GUARDED_BY(mutex_);
  // lease_id -> worker_id.
  absl::flat_hash_map<std::string, std::string> leases_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mutex_) = 1;
  // Expired since the last ExpireLeases.
  std::vector<std::string> unreported_expired_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_WORKER_REGISTRY_H_
