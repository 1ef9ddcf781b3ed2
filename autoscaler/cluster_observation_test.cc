#include "autoscaler/cluster_observation.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"
#include "router/router_metrics.h"

namespace pdserve::autoscaler {
namespace {

metrics::ParsedMetrics Scrape(const metrics::Registry& registry) {
  absl::StatusOr<metrics::ParsedMetrics> parsed =
      metrics::ParseText(metrics::RenderText(registry));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *parsed : metrics::ParsedMetrics();
}

v1::WorkerInfo Worker(v1::WorkerRole role, v1::WorkerState state,
                      uint32_t queued, uint32_t waiting, uint32_t free_blocks,
                      uint32_t total_blocks) {
  v1::WorkerInfo w;
  w.set_role(role);
  w.set_state(state);
  w.mutable_load()->set_queued_prefill_requests(queued);
  w.mutable_load()->set_waiting_sequences(waiting);
  w.mutable_load()->set_free_kv_blocks(free_blocks);
  w.mutable_load()->set_total_kv_blocks(total_blocks);
  return w;
}

// The router's own families (router_metrics.h), recorded as its request
// path does, read back through the text format: a rename on either side
// fails here.
TEST(ClusterObservationTest, TheIntervalsLoadLatencyAndPoolsFromTheRouter) {
  metrics::Registry registry;
  router::RouterMetricsOptions options;
  options.model = "m";
  std::unique_ptr<router::RouterMetrics> m =
      *router::RouterMetrics::Create(&registry, options);
  // Before the interval: 50 long prompts, slow first tokens and gaps.
  for (int i = 0; i < 50; ++i) {
    m->request_prompt_tokens->Observe(4000);
    m->time_to_first_token->Observe(9.0);
    m->inter_token_latency->Observe(1.0);
  }
  const metrics::ParsedMetrics before = Scrape(registry);
  // In it: 40 arrivals of 100 tokens, 30 finished with 60 tokens each,
  // 40 first tokens at 0.2 s, 1000 gaps of 20 ms, a quarter of the routed
  // prompt tokens cached.
  for (int i = 0; i < 40; ++i) {
    m->request_prompt_tokens->Observe(100);
    m->time_to_first_token->Observe(0.2);
    m->RecordRoute(router::RoutingPath::kDisaggregated, 100, 25);
  }
  for (int i = 0; i < 30; ++i) m->request_generation_tokens->Observe(60);
  for (int i = 0; i < 1000; ++i) m->inter_token_latency->Observe(0.02);
  m->migrations->Inc(2);
  m->retries->Inc();
  const metrics::ParsedMetrics now = Scrape(registry);

  v1::ListWorkersResponse workers;
  using v1::WORKER_ROLE_DECODE, v1::WORKER_ROLE_PREFILL,
      v1::WORKER_STATE_SERVING, v1::WORKER_STATE_DRAINING;
  *workers.add_workers() =
      Worker(WORKER_ROLE_PREFILL, WORKER_STATE_SERVING, 3, 0, 0, 0);
  *workers.add_workers() =
      Worker(WORKER_ROLE_PREFILL, WORKER_STATE_SERVING, 1, 0, 0, 0);
  // Draining workers are not ready and their queues are leaving.
  *workers.add_workers() =
      Worker(WORKER_ROLE_PREFILL, WORKER_STATE_DRAINING, 9, 0, 0, 0);
  *workers.add_workers() =
      Worker(WORKER_ROLE_DECODE, WORKER_STATE_SERVING, 0, 2, 25, 100);
  *workers.add_workers() =
      Worker(WORKER_ROLE_DECODE, WORKER_STATE_SERVING, 0, 1, 75, 100);

  ObservationInput in;
  in.time_s = 60;
  in.duration_s = 20;
  in.routers = {{.before = &before, .now = &now}};
  in.workers = &workers;
  in.prefill_configured = 3;
  in.decode_configured = 2;
  in.quantile = 0.5;
  const planner::Observation o = BuildObservation(in);
  EXPECT_EQ(o.time_s, 60);
  EXPECT_EQ(o.load.duration_s, 20);
  EXPECT_EQ(o.load.requests, 40);
  EXPECT_EQ(o.load.prompt.count(), 40);
  EXPECT_DOUBLE_EQ(o.load.prompt.Mean(), 100);
  EXPECT_EQ(o.load.output.count(), 30);
  EXPECT_DOUBLE_EQ(o.load.output.Mean(), 60);
  EXPECT_DOUBLE_EQ(o.cached_prompt_fraction, 0.25);
  EXPECT_EQ(o.migrations, 2);
  EXPECT_EQ(o.retries, 1);
  ASSERT_TRUE(o.ttft_s.has_value());
  // The interval's first tokens only (0.2 s), not the 9 s ones before.
  EXPECT_LT(*o.ttft_s, 0.5);
  EXPECT_EQ(o.ttft_samples, 40);
  ASSERT_TRUE(o.itl_s.has_value());
  EXPECT_LT(*o.itl_s, 0.05);
  EXPECT_EQ(o.itl_samples, 1000);
  // The interval's mean gap, from the histogram's sum and count (not the
  // 1 s gaps before it).
  ASSERT_TRUE(o.itl_mean_s.has_value());
  EXPECT_NEAR(*o.itl_mean_s, 0.02, 1e-9);
  // The buckets the quantiles fell in: the router's own bounds around them.
  ASSERT_TRUE(o.ttft_bucket.has_value());
  EXPECT_LT(o.ttft_bucket->lower, 0.2);
  EXPECT_GE(o.ttft_bucket->upper, 0.2);
  EXPECT_LE(o.ttft_bucket->lower, *o.ttft_s);
  EXPECT_GE(o.ttft_bucket->upper, *o.ttft_s);
  ASSERT_TRUE(o.itl_bucket.has_value());
  EXPECT_LT(o.itl_bucket->lower, 0.02);
  EXPECT_GE(o.itl_bucket->upper, 0.02);
  EXPECT_EQ(o.prefill.configured, 3);
  EXPECT_EQ(o.prefill.ready, 2);
  EXPECT_EQ(o.prefill.queue_depth, 4);
  EXPECT_EQ(o.decode.configured, 2);
  EXPECT_EQ(o.decode.ready, 2);
  EXPECT_EQ(o.decode.queue_depth, 3);
  EXPECT_DOUBLE_EQ(o.decode.kv_usage, 0.5);
}

TEST(ClusterObservationTest, AQuietIntervalHasNoLatencyAndNoLoad) {
  metrics::Registry registry;
  std::unique_ptr<router::RouterMetrics> m =
      *router::RouterMetrics::Create(&registry, {});
  m->request_prompt_tokens->Observe(10);
  m->time_to_first_token->Observe(0.1);
  const metrics::ParsedMetrics scrape = Scrape(registry);
  ObservationInput in;
  in.duration_s = 30;
  in.routers = {{.before = &scrape, .now = &scrape}};
  const planner::Observation o = BuildObservation(in);
  EXPECT_EQ(o.load.requests, 0);
  EXPECT_FALSE(o.ttft_s.has_value());
  EXPECT_FALSE(o.itl_s.has_value());
  EXPECT_FALSE(o.itl_mean_s.has_value());
  EXPECT_EQ(o.prefill.ready, 0);
  EXPECT_EQ(o.decode.kv_usage, 0);
}

// Each router counts only what it served: the interval's load and latency
// are all routers' together, each router's increase taken against its own
// earlier scrape (one restarted in between counts from zero) and the
// histograms merged per bound before a quantile is read, even where the
// routers' bucket layouts differ.
TEST(ClusterObservationTest, TheLoadOfEveryRouterTogether) {
  metrics::Registry a_registry, restarted_registry, b_registry;
  router::RouterMetricsOptions b_options;
  b_options.buckets.ttft = {0.1, 0.5, 1, 5};
  std::unique_ptr<router::RouterMetrics> a =
      *router::RouterMetrics::Create(&a_registry, {});
  std::unique_ptr<router::RouterMetrics> b =
      *router::RouterMetrics::Create(&b_registry, b_options);
  // Router A, before it restarted: 100 requests.
  for (int i = 0; i < 100; ++i) a->request_prompt_tokens->Observe(1000);
  const metrics::ParsedMetrics a_before = Scrape(a_registry);
  const metrics::ParsedMetrics b_before = Scrape(b_registry);
  // In the interval: A (restarted) takes 10 requests with 0.2 s first
  // tokens, B 30 with 3 s ones.
  std::unique_ptr<router::RouterMetrics> a_again =
      *router::RouterMetrics::Create(&restarted_registry, {});
  for (int i = 0; i < 10; ++i) {
    a_again->request_prompt_tokens->Observe(100);
    a_again->time_to_first_token->Observe(0.2);
  }
  a_again->migrations->Inc();
  for (int i = 0; i < 30; ++i) {
    b->request_prompt_tokens->Observe(100);
    b->time_to_first_token->Observe(3);
  }
  b->migrations->Inc(2);
  const metrics::ParsedMetrics a_now = Scrape(restarted_registry);
  const metrics::ParsedMetrics b_now = Scrape(b_registry);

  ObservationInput in;
  in.duration_s = 10;
  in.routers = {{.before = &a_before, .now = &a_now},
                {.before = &b_before, .now = &b_now}};
  in.quantile = 0.5;
  const planner::Observation o = BuildObservation(in);
  EXPECT_EQ(o.load.requests, 40);
  EXPECT_DOUBLE_EQ(o.load.prompt.Mean(), 100);
  EXPECT_EQ(o.migrations, 3);
  EXPECT_EQ(o.ttft_samples, 40);
  // The median is one of B's 3 s first tokens, in B's (1, 5] bucket as
  // the merged histogram knows it; A's alone would put it near 0.2 s.
  ASSERT_TRUE(o.ttft_s.has_value());
  EXPECT_GT(*o.ttft_s, 1);
  EXPECT_LE(*o.ttft_s, 5);
  ASSERT_TRUE(o.ttft_bucket.has_value());
  EXPECT_GE(o.ttft_bucket->lower, 1);
  EXPECT_LE(o.ttft_bucket->upper, 5);
  // The merged histogram stays cumulative: p10 is one of A's.
  in.quantile = 0.1;
  EXPECT_LT(*BuildObservation(in).ttft_s, 0.5);
}
}  // namespace
}  // namespace pdserve::autoscaler
