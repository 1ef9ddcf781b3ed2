#include "planner/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace pdserve::planner {
namespace {

// Round numbers: prefill 1000 tokens/s with 50 ms of TTFT overhead at
// every length; decode steps of 10 ms + 5 ms per extra stream, context-free.
CapacityProfile Profile(double load_time_s = 60) {
  const std::string text = R"({"version": 1, "cost_unit": "gpus",
    "prefill": {"cost": 2, "load_time_s": )" +
                           std::to_string(load_time_s) + R"(, "points": [
      {"prompt_tokens": 100, "tokens_per_s": 1000, "ttft_s": 0.15},
      {"prompt_tokens": 1000, "tokens_per_s": 1000, "ttft_s": 1.05}]},
    "decode": {"cost": 1, "load_time_s": )" +
                           std::to_string(load_time_s) + R"(,
      "max_batch": 64, "kv_capacity_tokens": 1000000,
      "batch_sizes": [1, 65], "context_tokens": [100, 10000],
      "itl_s": [[0.010, 0.010], [0.330, 0.330]]}})";
  auto p = CapacityProfile::Parse(text);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

TEST(SimulatorTest, OneRequestTakesTheProfilesTimes) {
  SimOptions o;
  o.ttft_target_s = 1;
  o.itl_target_s = 0.02;
  const SimResult r = Simulate(Profile(), {{1.0, 500, 11}}, o, FixedPolicy());
  EXPECT_EQ(r.requests, 1);
  // Busy 0.5 s, lone TTFT 0.55 s.
  EXPECT_NEAR(r.ttft_p99_s, 0.55, 1e-9);
  // Ten decode steps of one stream: 10 ms each.
  EXPECT_NEAR(r.tpot_p99_s, 0.010, 1e-9);
  EXPECT_EQ(r.attainment, 1);
}

TEST(SimulatorTest, PrefillQueuesFcfsAndDecodeBatches) {
  SimOptions o;
  o.ttft_target_s = 1.0;
  o.itl_target_s = 0.012;
  // Two prompts at once on one prefill worker: the second waits 0.5 s.
  const SimResult r =
      Simulate(Profile(), {{0, 500, 101}, {0, 500, 101}}, o, FixedPolicy());
  EXPECT_NEAR(r.ttft_p99_s, 1.05, 1e-9);
  EXPECT_EQ(r.ttft_attainment, 0.5);
  // The first decodes alone for 0.5 s (10 ms steps), then both share
  // 15 ms steps for 50 tokens, then the second alone: each TPOT is about
  // 12.5 ms, over the 12 ms target.
  EXPECT_EQ(r.itl_attainment, 0);
  EXPECT_NEAR(r.tpot_p99_s, 0.0125, 0.0004);
  EXPECT_GE(r.itl_p50_s, 0.0099);
  EXPECT_LE(r.itl_p50_s, 0.0152);
}

std::vector<SimRequest> Poisson(double rate, double seconds, int prompt,
                                int output, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<SimRequest> out;
  for (double t = gap(rng); t < seconds; t += gap(rng)) {
    out.push_back({t, prompt, output});
  }
  return out;
}

TEST(SimulatorTest, WorkerHoursOfAFixedCluster) {
  SimOptions o;
  o.initial_prefill = 2;
  o.initial_decode = 3;
  const auto trace = Poisson(1, 600, 100, 10);
  const SimResult r = Simulate(Profile(), trace, o, FixedPolicy());
  EXPECT_NEAR(r.span_s, 600, 1e-9);
  EXPECT_NEAR(r.prefill_worker_hours, 2 * 600 / 3600.0, 1e-9);
  EXPECT_NEAR(r.decode_worker_hours, 3 * 600 / 3600.0, 1e-9);
  // Prefill workers cost 2 GPUs each.
  EXPECT_NEAR(r.cost_hours, (2 * 2 + 3) * 600 / 3600.0, 1e-9);
  EXPECT_GE(r.timeline.size(), 19u);
  EXPECT_NEAR(r.timeline[5].arrival_rate, 1, 0.5);
}

TEST(SimulatorTest, NewWorkersServeOnlyAfterLoading) {
  SimOptions o;
  o.initial_prefill = 1;
  o.initial_decode = 1;
  const auto trace = Poisson(2, 300, 100, 10);
  // At the first boundary (30 s) ask for 4 prefill workers.
  const SimResult r =
      Simulate(Profile(/*load_time_s=*/60), trace, o,
               [](const Observation& obs) { return std::make_pair(4, 1); });
  ASSERT_GE(r.timeline.size(), 5u);
  // Each interval's record is taken at its end, before that boundary's
  // decision: asked for at 30 s, ready at 90 s.
  EXPECT_EQ(r.timeline[1].prefill_configured, 4);
  EXPECT_EQ(r.timeline[1].prefill_ready, 1);
  EXPECT_EQ(r.timeline[1].prefill_alive, 4);
  EXPECT_EQ(r.timeline[2].prefill_ready, 4);
  // Three workers for 270 s of the 300 (loading counts) plus one for 300.
  EXPECT_NEAR(r.prefill_worker_hours, (3 * 270 + 300) / 3600.0, 1e-9);
}

TEST(SimulatorTest, ScaleDownDrainsWithoutLosingRequests) {
  SimOptions o;
  o.initial_prefill = 4;
  o.initial_decode = 4;
  const auto trace = Poisson(20, 300, 200, 200);
  const SimResult r = Simulate(Profile(), trace, o, [](const Observation&) {
    return std::make_pair(1, 1);
  });
  EXPECT_EQ(r.requests, int64_t(trace.size()));  // every one finished
  // One worker each is too few for 20/s: the drain happened.
  EXPECT_LT(r.attainment, 0.5);
  EXPECT_LT(r.prefill_worker_hours, 4 * 300 / 3600.0 * 0.5);
}

TEST(SimulatorTest, OracleAndPlannerMeetWhatAnUndersizedClusterMisses) {
  // A step from 2 to 12 req/s halfway through.
  auto trace = Poisson(2, 600, 300, 50, 3);
  for (SimRequest r : Poisson(12, 600, 300, 50, 4)) {
    r.arrival_s += 600;
    trace.push_back(r);
  }
  const CapacityProfile p = Profile(30);
  SimOptions o;
  o.ttft_target_s = 1.0;
  o.itl_target_s = 0.05;
  const OracleSchedule oracle = MakeOracleSchedule(p, trace, o, 1000);
  o.initial_prefill = oracle.initial.first;
  o.initial_decode = oracle.initial.second;
  const SimResult fixed = Simulate(p, trace, o, FixedPolicy());
  const SimResult best = Simulate(p, trace, o, OraclePolicy(p, oracle, o));
  EXPECT_LT(fixed.attainment, 0.7);
  EXPECT_GT(best.attainment, 0.97);
  PlannerOptions po;
  po.ttft_target_s = o.ttft_target_s;
  po.itl_target_s = o.itl_target_s;
  auto planner = Planner::Create(po, p);
  ASSERT_TRUE(planner.ok()) << planner.status();
  const SimResult planned = Simulate(p, trace, o, [&](const Observation& obs) {
    const Decision d = (*planner)->Decide(obs);
    return std::make_pair(d.prefill.desired, d.decode.desired);
  });
  // The planner reacts after the step (one interval plus loading): it
  // misses a little more than the oracle, far less than the fixed size.
  EXPECT_GT(planned.attainment, 0.85);
  EXPECT_GT(planned.peak_prefill, oracle.initial.first);
  EXPECT_LT(planned.cost_hours, 1.6 * best.cost_hours);
}

}  // namespace
}  // namespace pdserve::planner
