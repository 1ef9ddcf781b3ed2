#include "router/worker_registry.h"

#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

WorkerRegistration Worker(const std::string& id, v1::WorkerRole role) {
  WorkerRegistration r;
  r.worker_id = id;
  r.instance_id = id + "-instance";
  r.role = role;
  r.address = "127.0.0.1:5000";
  return r;
}

std::unique_ptr<WorkerRegistry> MakeRegistry() {
  WorkerRegistryOptions options;
  options.lease_duration = absl::Seconds(3);
  options.heartbeat_interval = absl::Milliseconds(500);
  return *WorkerRegistry::Create(options);
}

std::vector<std::string> Ids(const std::vector<WorkerRecord>& records) {
  std::vector<std::string> ids;
  for (const auto& r : records) ids.push_back(r.registration.worker_id);
  return ids;
}

TEST(WorkerRegistryTest, RejectsHeartbeatTooCloseToLease) {
  WorkerRegistryOptions options;
  options.lease_duration = absl::Seconds(1);
  options.heartbeat_interval = absl::Milliseconds(600);
  EXPECT_EQ(WorkerRegistry::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerRegistryTest, RegisterValidatesAndListsByRole) {
  auto registry = MakeRegistry();
  EXPECT_EQ(registry->Register(Worker("", v1::WORKER_ROLE_DECODE), kStart)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry->Register(Worker("x", v1::WORKER_ROLE_UNSPECIFIED), kStart)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  auto lease =
      registry->Register(Worker("prefill-0", v1::WORKER_ROLE_PREFILL), kStart);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->duration, absl::Seconds(3));
  EXPECT_EQ(lease->heartbeat_interval, absl::Milliseconds(500));
  ASSERT_TRUE(
      registry->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart)
          .ok());

  EXPECT_EQ(Ids(registry->List(kStart, v1::WORKER_ROLE_UNSPECIFIED)),
            (std::vector<std::string>{"prefill-0", "decode-0"}));
  EXPECT_EQ(Ids(registry->List(kStart, v1::WORKER_ROLE_DECODE)),
            (std::vector<std::string>{"decode-0"}));
  const auto records = registry->List(kStart, v1::WORKER_ROLE_PREFILL);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].state, v1::WORKER_STATE_STARTING);
}

TEST(WorkerRegistryTest, HeartbeatsKeepTheLeaseAndSilenceExpiresIt) {
  auto registry = MakeRegistry();
  auto lease =
      *registry->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart);
  HeartbeatReport report;
  report.state = v1::WORKER_STATE_SERVING;
  report.load.set_free_kv_blocks(100);
  report.load.set_total_kv_blocks(128);
  // Ten heartbeats 2 s apart: each within the 3 s lease.
  absl::Time now = kStart;
  for (int i = 0; i < 10; ++i) {
    now += absl::Seconds(2);
    ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, now).ok()) << i;
  }
  auto records = registry->List(now, v1::WORKER_ROLE_UNSPECIFIED);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].state, v1::WORKER_STATE_SERVING);
  EXPECT_EQ(records[0].load.free_kv_blocks(), 100u);

  // Just before the lease ends the worker is still there; at the end it goes.
  EXPECT_EQ(
      registry
          ->List(now + absl::Milliseconds(2999), v1::WORKER_ROLE_UNSPECIFIED)
          .size(),
      1u);
  EXPECT_EQ(registry->ExpireLeases(now + absl::Seconds(3)),
            (std::vector<std::string>{"decode-0"}));
  EXPECT_TRUE(
      registry->List(now + absl::Seconds(3), v1::WORKER_ROLE_UNSPECIFIED)
          .empty());
  // A heartbeat on the expired lease tells the worker to register again.
  EXPECT_EQ(registry->Heartbeat(lease.lease_id, report, now + absl::Seconds(4))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryTest, ExpireLeasesReportsWorkersAListExpiredFirst) {
  // The sweep cuts the calls still in flight to lost workers; a worker that
  // a List dropped first must not escape it.
  auto registry = MakeRegistry();
  ASSERT_TRUE(
      registry->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart)
          .ok());
  auto lease =
      *registry->Register(Worker("prefill-0", v1::WORKER_ROLE_PREFILL), kStart);
  // prefill-0 keeps its lease; decode-0 falls silent.
  ASSERT_TRUE(
      registry->Heartbeat(lease.lease_id, {}, kStart + absl::Seconds(2)).ok());
  const absl::Time later = kStart + absl::Seconds(4);
  EXPECT_EQ(Ids(registry->List(later, v1::WORKER_ROLE_UNSPECIFIED)),
            (std::vector<std::string>{"prefill-0"}));
  EXPECT_EQ(registry->ExpireLeases(later),
            (std::vector<std::string>{"decode-0"}));
  // Reported exactly once.
  EXPECT_TRUE(registry->ExpireLeases(later).empty());
  EXPECT_TRUE(registry->ExpireLeases(later + absl::Milliseconds(100)).empty());
}

TEST(WorkerRegistryTest, ExpireLeasesReportsWorkersAHeartbeatExpiredFirst) {
  auto registry = MakeRegistry();
  ASSERT_TRUE(
      registry->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart)
          .ok());
  auto lease = *registry->Register(Worker("prefill-0", v1::WORKER_ROLE_PREFILL),
                                   kStart + absl::Seconds(2));
  // prefill-0's heartbeat finds decode-0's lease run out and drops it.
  const absl::Time later = kStart + absl::Seconds(4);
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, {}, later).ok());
  EXPECT_EQ(Ids(registry->List(later, v1::WORKER_ROLE_UNSPECIFIED)),
            (std::vector<std::string>{"prefill-0"}));
  EXPECT_EQ(registry->ExpireLeases(later),
            (std::vector<std::string>{"decode-0"}));
  EXPECT_TRUE(registry->ExpireLeases(later).empty());
}

TEST(WorkerRegistryTest, ReRegisteringReplacesTheOldInstance) {
  auto registry = MakeRegistry();
  auto old_lease =
      *registry->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart);
  WorkerRegistration restarted = Worker("decode-0", v1::WORKER_ROLE_DECODE);
  restarted.instance_id = "decode-0-restarted";
  restarted.address = "127.0.0.1:6000";
  auto new_lease = *registry->Register(restarted, kStart + absl::Seconds(1));
  EXPECT_NE(old_lease.lease_id, new_lease.lease_id);
  EXPECT_EQ(
      registry->Heartbeat(old_lease.lease_id, {}, kStart + absl::Seconds(1))
          .status()
          .code(),
      absl::StatusCode::kNotFound);
  const auto records =
      registry->List(kStart + absl::Seconds(1), v1::WORKER_ROLE_UNSPECIFIED);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].registration.address, "127.0.0.1:6000");
  EXPECT_EQ(records[0].registration.instance_id, "decode-0-restarted");
}

TEST(WorkerRegistryTest, DrainIsRepeatedUntilTheWorkerReportsDraining) {
  auto registry = MakeRegistry();
  auto lease =
      *registry->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart);
  EXPECT_EQ(registry->RequestDrain("nobody", absl::Seconds(30)).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry->RequestDrain("decode-0", absl::Seconds(30)).ok());
  // No new work from the moment of the request.
  EXPECT_EQ(registry->List(kStart, v1::WORKER_ROLE_DECODE)[0].state,
            v1::WORKER_STATE_DRAINING);

  HeartbeatReport serving;
  serving.state = v1::WORKER_STATE_SERVING;
  // The worker has not seen the command yet (say a reply was lost): every
  // reply repeats it, and the worker stays DRAINING in the router's view.
  for (int i = 0; i < 2; ++i) {
    auto reply = registry->Heartbeat(lease.lease_id, serving, kStart);
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->drain, absl::Seconds(30)) << i;
    EXPECT_EQ(registry->List(kStart, v1::WORKER_ROLE_DECODE)[0].state,
              v1::WORKER_STATE_DRAINING);
  }
  HeartbeatReport draining;
  draining.state = v1::WORKER_STATE_DRAINING;
  auto reply = registry->Heartbeat(lease.lease_id, draining, kStart);
  ASSERT_TRUE(reply.ok());
  EXPECT_FALSE(reply->drain.has_value());
  reply = registry->Heartbeat(lease.lease_id, serving, kStart);
  ASSERT_TRUE(reply.ok());
  EXPECT_FALSE(reply->drain.has_value());
  EXPECT_EQ(registry->List(kStart, v1::WORKER_ROLE_DECODE)[0].state,
            v1::WORKER_STATE_DRAINING);
}

TEST(WorkerRegistryTest, ColocatedWorkersMatchBothRoleFiltersAndSortByRole) {
  auto registry = MakeRegistry();
  ASSERT_TRUE(
      registry->Register(Worker("a-decode", v1::WORKER_ROLE_DECODE), kStart)
          .ok());
  ASSERT_TRUE(
      registry->Register(Worker("b-both", v1::WORKER_ROLE_BOTH), kStart).ok());
  ASSERT_TRUE(
      registry->Register(Worker("c-prefill", v1::WORKER_ROLE_PREFILL), kStart)
          .ok());
  EXPECT_EQ(Ids(registry->List(kStart, v1::WORKER_ROLE_UNSPECIFIED)),
            (std::vector<std::string>{"c-prefill", "a-decode", "b-both"}));
  EXPECT_EQ(Ids(registry->List(kStart, v1::WORKER_ROLE_PREFILL)),
            (std::vector<std::string>{"c-prefill", "b-both"}));
  EXPECT_EQ(Ids(registry->List(kStart, v1::WORKER_ROLE_DECODE)),
            (std::vector<std::string>{"a-decode", "b-both"}));
  EXPECT_EQ(Ids(registry->List(kStart, v1::WORKER_ROLE_DECODE,
                               /*exact_role=*/true)),
            (std::vector<std::string>{"a-decode"}));
}

TEST(WorkerRegistryTest, LeasesOfAnotherRouterProcessAreUnknown) {
  auto first = MakeRegistry();
  auto second = MakeRegistry();  // A restarted router.
  EXPECT_NE(first->router_id(), second->router_id());
  auto old_lease =
      *first->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart);
  auto new_lease =
      *second->Register(Worker("decode-0", v1::WORKER_ROLE_DECODE), kStart);
  EXPECT_NE(old_lease.lease_id, new_lease.lease_id);
  EXPECT_EQ(second->Heartbeat(old_lease.lease_id, {}, kStart).status().code(),
            absl::StatusCode::kNotFound);
}
TEST(WorkerRegistryTest, DeregisterRemovesAtOnce) {
  auto registry = MakeRegistry();
  auto lease =
      *registry->Register(Worker("prefill-0", v1::WORKER_ROLE_PREFILL), kStart);
  ASSERT_TRUE(registry->Deregister(lease.lease_id).ok());
  EXPECT_TRUE(registry->List(kStart, v1::WORKER_ROLE_UNSPECIFIED).empty());
  EXPECT_EQ(registry->Deregister(lease.lease_id).code(),
            absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryTest, PrefixIndexFollowsHeartbeatEvents) {
  auto registry = MakeRegistry();
  auto lease =
      *registry->Register(Worker("prefill-0", v1::WORKER_ROLE_PREFILL), kStart);
  auto event = [](v1::PrefixCacheEvent::Kind kind, std::vector<uint64_t> keys) {
    v1::PrefixCacheEvent e;
    e.set_kind(kind);
    for (uint64_t k : keys) e.add_block_hashes(k);
    return e;
  };
  HeartbeatReport report;
  report.events = {event(v1::PrefixCacheEvent::KIND_STORED, {11}),
                   event(v1::PrefixCacheEvent::KIND_STORED, {12, 13})};
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, kStart).ok());
  const std::vector<uint64_t> prompt = {11, 12, 13, 14};
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", prompt), 3);
  // Only the leading run counts: without 12 the later blocks are useless.
  report.events = {event(v1::PrefixCacheEvent::KIND_REMOVED, {12})};
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, kStart).ok());
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", prompt), 1);
  report.events = {event(v1::PrefixCacheEvent::KIND_CLEARED, {})};
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, kStart).ok());
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", prompt), 0);
  EXPECT_EQ(registry->CachedPrefixBlocks("nobody", prompt), 0);
  // A restarted worker starts with an empty cache.
  report.events = {event(v1::PrefixCacheEvent::KIND_STORED, {11})};
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, kStart).ok());
  ASSERT_TRUE(
      registry->Register(Worker("prefill-0", v1::WORKER_ROLE_PREFILL), kStart)
          .ok());
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", prompt), 0);
}

TEST(WorkerRegistryTest, EventsResetReplacesTheWorkersIndex) {
  auto registry = MakeRegistry();
  auto lease =
      *registry->Register(Worker("prefill-0", v1::WORKER_ROLE_PREFILL), kStart);
  auto stored = [](std::vector<uint64_t> keys) {
    v1::PrefixCacheEvent e;
    e.set_kind(v1::PrefixCacheEvent::KIND_STORED);
    for (uint64_t k : keys) e.add_block_hashes(k);
    return e;
  };
  HeartbeatReport report;
  report.events = {stored({11, 12, 13})};
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, kStart).ok());
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", {11, 12, 13}), 3);
  // A snapshot (the worker's queue for this router overflowed): what it
  // does not list is gone, though no REMOVED event said so.
  report.events = {stored({21, 22})};
  report.events_reset = true;
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, kStart).ok());
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", {11, 12, 13}), 0);
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", {21, 22}), 2);
  // Without the flag, events add to the index.
  report.events = {stored({11})};
  report.events_reset = false;
  ASSERT_TRUE(registry->Heartbeat(lease.lease_id, report, kStart).ok());
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", {21, 22}), 2);
  EXPECT_EQ(registry->CachedPrefixBlocks("prefill-0", {11}), 1);
}

}  // namespace
}  // namespace pdserve::router
