#include "router/routing_policy.h"

#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

WorkerView Worker(std::string id, v1::WorkerRole role, int32_t cached = 0,
                  int64_t outstanding_tokens = 0, int32_t running = 0,
                  uint32_t free_blocks = 100) {
  WorkerView w;
  w.worker_id = id;
  w.role = role;
  w.cached_blocks = cached;
  w.outstanding_tokens = outstanding_tokens;
  w.load.set_running_sequences(running);
  w.load.set_free_kv_blocks(free_blocks);
  w.block_size = 16;
  return w;
}

v1::RoutingConfig Config(v1::RoutingPolicy policy, uint32_t local = 0) {
  v1::RoutingConfig c;
  c.set_policy(policy);
  c.set_local_prefill_max_uncached_tokens(local);
  return c;
}

TEST(RoutingPolicyTest, KvAwarePrefersTheWorkerHoldingThePrefix) {
  RoutingPolicy policy(Config(v1::ROUTING_POLICY_KV_AWARE));
  const std::vector<WorkerView> decode = {Worker("d0", v1::WORKER_ROLE_DECODE)};
  // 320 tokens: p1 holds 15 of its 20 blocks, so only 80 tokens are left.
  std::vector<WorkerView> prefill = {Worker("p0", v1::WORKER_ROLE_PREFILL),
                                     Worker("p1", v1::WORKER_ROLE_PREFILL, 15)};
  EXPECT_EQ(policy.Choose(prefill, decode, 320, 16).prefill, 1u);
  // ...unless its queue costs more than the cache saves.
  prefill[1].outstanding_tokens = 1000;
  EXPECT_EQ(policy.Choose(prefill, decode, 320, 16).prefill, 0u);
}

TEST(RoutingPolicyTest, LeastLoadedAndRoundRobin) {
  const std::vector<WorkerView> prefill = {
      Worker("p0", v1::WORKER_ROLE_PREFILL, 0, 500),
      Worker("p1", v1::WORKER_ROLE_PREFILL, 0, 100)};
  const std::vector<WorkerView> decode = {
      Worker("d0", v1::WORKER_ROLE_DECODE, 0, 0, 9),
      Worker("d1", v1::WORKER_ROLE_DECODE, 0, 0, 2),
      Worker("d2", v1::WORKER_ROLE_DECODE, 0, 0, 2, 500)};
  RoutingPolicy least(Config(v1::ROUTING_POLICY_LEAST_LOADED));
  const Route r = least.Choose(prefill, decode, 100, 16);
  EXPECT_EQ(r.prefill, 1u);
  // Fewest running first, then most free blocks; all are candidates.
  EXPECT_EQ(r.decode_order, (std::vector<size_t>{2, 1, 0}));

  RoutingPolicy rr(Config(v1::ROUTING_POLICY_ROUND_ROBIN));
  std::vector<size_t> prefills, decodes;
  for (int i = 0; i < 4; ++i) {
    const Route route = rr.Choose(prefill, decode, 100, 16);
    prefills.push_back(*route.prefill);
    decodes.push_back(route.decode_order.front());
  }
  EXPECT_EQ(prefills, (std::vector<size_t>{0, 1, 0, 1}));
  EXPECT_EQ(decodes, (std::vector<size_t>{0, 1, 2, 0}));
}

TEST(RoutingPolicyTest, ConditionalDisaggregationAndColocatedWorkers) {
  const std::vector<WorkerView> prefill = {
      Worker("p0", v1::WORKER_ROLE_PREFILL)};
  std::vector<WorkerView> decode = {Worker("d0", v1::WORKER_ROLE_DECODE)};
  RoutingPolicy policy(Config(v1::ROUTING_POLICY_KV_AWARE, 64));
  // Short prompt: prefilled on the decode worker.
  EXPECT_FALSE(policy.Choose(prefill, decode, 40, 16).prefill.has_value());
  // Long prompt: disaggregated...
  EXPECT_TRUE(policy.Choose(prefill, decode, 400, 16).prefill.has_value());
  // ...unless the decode worker has most of it cached already.
  decode[0].cached_blocks = 22;  // 352 of 400 tokens
  EXPECT_FALSE(policy.Choose(prefill, decode, 400, 16).prefill.has_value());
  // Colocated workers and clusters without prefill workers prefill locally.
  const std::vector<WorkerView> both = {Worker("b0", v1::WORKER_ROLE_BOTH)};
  EXPECT_FALSE(policy.Choose(prefill, both, 400, 16).prefill.has_value());
  EXPECT_FALSE(policy.Choose({}, decode, 4000, 16).prefill.has_value());
}

TEST(RoutingPolicyTest, ConfigIsValidatedAndSwappedAtRunTime) {
  RoutingPolicy policy(Config(v1::ROUTING_POLICY_KV_AWARE));
  EXPECT_EQ(
      policy.SetConfig(Config(v1::ROUTING_POLICY_UNSPECIFIED)).status().code(),
      absl::StatusCode::kInvalidArgument);
  v1::RoutingConfig negative = Config(v1::ROUTING_POLICY_KV_AWARE);
  negative.set_kv_overlap_weight(-1);
  EXPECT_FALSE(policy.SetConfig(negative).ok());
  absl::StatusOr<v1::RoutingConfig> previous =
      policy.SetConfig(Config(v1::ROUTING_POLICY_ROUND_ROBIN));
  ASSERT_TRUE(previous.ok());
  EXPECT_EQ(previous->policy(), v1::ROUTING_POLICY_KV_AWARE);
  EXPECT_EQ(policy.config().policy(), v1::ROUTING_POLICY_ROUND_ROBIN);
}

}  // namespace
}  // namespace pdserve::router
