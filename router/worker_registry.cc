#include "router/worker_registry.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/prefix_cache_events.h"

namespace pdserve::router {

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(
    const WorkerRegistryOptions& options) {
  if (options.lease_duration <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease and heartbeat must be positive");
  }
  if (options.heartbeat_interval * 2 > options.lease_duration) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat interval ", absl::FormatDuration(options.heartbeat_interval),
        " must be at most half the lease ",
        absl::FormatDuration(options.lease_duration),
        ", or one late heartbeat drops a healthy worker"));
  }
  absl::BitGen random;
  const std::string router_id =
      absl::StrFormat("%016x", absl::Uniform<uint64_t>(random));
  return std::unique_ptr<WorkerRegistry>(
      new WorkerRegistry(options, router_id));
}

absl::StatusOr<Lease> WorkerRegistry::Register(
    const WorkerRegistration& registration, absl::Time now) {
  if (registration.worker_id.empty()) {
    return absl::InvalidArgumentError("register: worker_id is empty");
  }
  if (registration.address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register ", registration.worker_id, ": grpc_address is empty"));
  }
  if (registration.role == v1::WORKER_ROLE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("register ", registration.worker_id, ": role is unset"));
  }
  absl::MutexLock lock(&mutex_);
  // A restarted worker replaces its previous incarnation.
  if (auto old = workers_.find(registration.worker_id); old != workers_.end()) {
    leases_.erase(old->second.lease_id);
    workers_.erase(old);
  }
  WorkerRecord record;
  record.registration = registration;
  record.lease_id =
      absl::StrCat(router_id_, "/", registration.worker_id, "/", next_lease_++);
  record.registered_at = now;
  record.last_heartbeat = now;
  record.lease_expiry = now + options_.lease_duration;
  leases_[record.lease_id] = registration.worker_id;
  // A new process starts with an empty cache; its events rebuild the index.
  prefix_keys_[registration.worker_id].clear();
  Lease lease{record.lease_id, options_.lease_duration,
              options_.heartbeat_interval};
  workers_[registration.worker_id] = std::move(record);
  return lease;
}

absl::StatusOr<HeartbeatReply> WorkerRegistry::Heartbeat(
    const std::string& lease_id, const HeartbeatReport& report,
    absl::Time now) {
  absl::MutexLock lock(&mutex_);
  ExpireLeasesLocked(now);
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("lease ", lease_id, " is unknown or expired; register"));
  }
  WorkerRecord& record = workers_.at(lease->second);
  if (record.pending_drain.has_value() &&
      report.state == v1::WORKER_STATE_DRAINING) {
    record.pending_drain.reset();  // The worker has the command.
  }
  // Once asked to drain, a worker gets no new work whatever it reports.
  record.state = record.state == v1::WORKER_STATE_DRAINING
                     ? v1::WORKER_STATE_DRAINING
                     : report.state;
  record.load = report.load;
  record.inflight_requests = report.inflight_requests;
  absl::flat_hash_set<uint64_t>& keys = prefix_keys_[lease->second];
  if (report.events_reset) keys.clear();
  for (const v1::PrefixCacheEvent& event : report.events) {
    ApplyPrefixCacheEvent(event, &keys);
  }
  record.last_heartbeat = now;
  record.lease_expiry = now + options_.lease_duration;
  HeartbeatReply reply;
  reply.drain = record.pending_drain;
  return reply;
}

absl::Status WorkerRegistry::Deregister(const std::string& lease_id) {
  absl::MutexLock lock(&mutex_);
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown"));
  }
  prefix_keys_.erase(lease->second);
  workers_.erase(lease->second);
  leases_.erase(lease);
  return absl::OkStatus();
}

absl::Status WorkerRegistry::RequestDrain(const std::string& worker_id,
                                          absl::Duration deadline) {
  absl::MutexLock lock(&mutex_);
  auto worker = workers_.find(worker_id);
  if (worker == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker ", worker_id));
  }
  worker->second.pending_drain = deadline;
  worker->second.state = v1::WORKER_STATE_DRAINING;
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::ExpireLeases(absl::Time now) {
  absl::MutexLock lock(&mutex_);
  ExpireLeasesLocked(now);
  std::vector<std::string> expired;
  expired.swap(unreported_expired_);
  std::sort(expired.begin(), expired.end());
  return expired;
}

void WorkerRegistry::ExpireLeasesLocked(absl::Time now) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.lease_expiry <= now) {
      unreported_expired_.push_back(it->first);
      prefix_keys_.erase(it->first);
      leases_.erase(it->second.lease_id);
      workers_.erase(it++);
    } else {
      ++it;
    }
  }
}

int32_t WorkerRegistry::CachedPrefixBlocks(
    const std::string& worker_id, absl::Span<const uint64_t> chain_keys) {
  absl::MutexLock lock(&mutex_);
  auto it = prefix_keys_.find(worker_id);
  if (it == prefix_keys_.end()) return 0;
  int32_t n = 0;
  while (n < static_cast<int32_t>(chain_keys.size()) &&
         it->second.contains(chain_keys[n])) {
    ++n;
  }
  return n;
}

std::vector<WorkerRecord> WorkerRegistry::List(absl::Time now,
                                               v1::WorkerRole role,
                                               bool exact_role) {
  absl::MutexLock lock(&mutex_);
  ExpireLeasesLocked(now);
  std::vector<WorkerRecord> result;
  for (const auto& [id, record] : workers_) {
    const v1::WorkerRole r = record.registration.role;
    const bool matches = exact_role ? r == role
                                    : role == v1::WORKER_ROLE_UNSPECIFIED ||
                                          r == role ||
                                          (r == v1::WORKER_ROLE_BOTH &&
                                           (role == v1::WORKER_ROLE_PREFILL ||
                                            role == v1::WORKER_ROLE_DECODE));
    if (matches) result.push_back(record);
  }
  std::sort(result.begin(), result.end(),
            [](const WorkerRecord& a, const WorkerRecord& b) {
              return std::tie(a.registration.role, a.registration.worker_id) <
                     std::tie(b.registration.role, b.registration.worker_id);
            });
  return result;
}

int WorkerRegistry::Count(v1::WorkerRole role, v1::WorkerState state) {
  absl::MutexLock lock(&mutex_);
  int n = 0;
  for (const auto& [id, record] : workers_) {
    n += record.registration.role == role && record.state == state;
  }
  return n;
}

}  // namespace pdserve::router
