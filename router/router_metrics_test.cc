#include "router/router_metrics.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"

namespace pdserve::router {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<RouterMetrics> Make(metrics::Registry* registry) {
  RouterMetricsOptions options;
  options.model = "smollm";
  absl::StatusOr<std::unique_ptr<RouterMetrics>> m =
      RouterMetrics::Create(registry, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(RouterMetricsTest, RequestsAreCountedByEndpointAndStatus) {
  metrics::Registry registry;
  std::unique_ptr<RouterMetrics> m = Make(&registry);
  m->RecordRequest(Endpoint::kChatCompletions, absl::OkStatus());
  m->RecordRequest(Endpoint::kChatCompletions, absl::OkStatus());
  m->RecordRequest(Endpoint::kGenerate,
                   absl::ResourceExhaustedError("router full"));
  // A code outside absl's range counts as unknown instead of overrunning.
  m->RecordRequest(Endpoint::kCompletions,
                   absl::Status(static_cast<absl::StatusCode>(99), "odd"));
  const std::string text = metrics::RenderText(registry);
  EXPECT_THAT(text, HasSubstr(R"(pdserve_requests_total{model="smollm",)"
                              R"(endpoint="chat_completions",status="ok"} 2)"));
  EXPECT_THAT(
      text, HasSubstr(R"(pdserve_requests_total{model="smollm",)"
                      R"(endpoint="generate",status="resource_exhausted"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_requests_total{model="smollm",)"
                              R"(endpoint="completions",status="unknown"} 1)"));
  // Series exist before their first event.
  EXPECT_THAT(text, HasSubstr(R"(pdserve_requests_total{model="smollm",)"
                              R"(endpoint="generate",status="ok"} 0)"));
}

TEST(RouterMetricsTest, OutcomesRoutesAndTokens) {
  metrics::Registry registry;
  std::unique_ptr<RouterMetrics> m = Make(&registry);
  m->RecordSuccess(v1::FINISH_REASON_LENGTH);
  m->RecordOverload(Overload::kNoKvCapacity);
  m->RecordRoute(RoutingPath::kLocalPrefill, 100, 64);
  m->RecordRoute(RoutingPath::kDisaggregated, 50, 0);
  m->generation_tokens->Inc(9);
  m->requests_in_flight->Inc();
  const std::string text = metrics::RenderText(registry);
  EXPECT_THAT(text, HasSubstr(R"(pdserve_request_success_total{model="smollm",)"
                              R"(finished_reason="length"} 1)"));
  EXPECT_THAT(text,
              HasSubstr(R"(pdserve_overload_rejections_total{model="smollm",)"
                        R"(reason="no_kv_capacity"} 1)"));
  EXPECT_THAT(text,
              HasSubstr(R"(pdserve_routing_decisions_total{model="smollm",)"
                        R"(path="local_prefill"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_routed_prompt_tokens_total{)"
                              R"(model="smollm"} 150)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_routed_cached_prompt_tokens_total{)"
                              R"(model="smollm"} 64)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_generation_tokens_total{)"
                              R"(model="smollm"} 9)"));
  EXPECT_THAT(text,
              HasSubstr(R"(pdserve_requests_in_flight{model="smollm"} 1)"));
}

TEST(RouterMetricsTest, TokenLengthsAreHistogramsWithinFortyOnePercent) {
  const std::vector<double> bounds = TokenLengthBuckets();
  ASSERT_GE(bounds.size(), 4u);
  EXPECT_EQ(bounds[0], 1);
  EXPECT_EQ(bounds.back(), 131072);
  for (size_t i = 1; i < bounds.size(); ++i) {
    EXPECT_GT(bounds[i], bounds[i - 1]);
    EXPECT_LE(bounds[i], 2 * bounds[i - 1]);
  }
  metrics::Registry registry;
  std::unique_ptr<RouterMetrics> m = Make(&registry);
  m->request_prompt_tokens->Observe(100);
  m->request_prompt_tokens->Observe(3000);
  m->request_generation_tokens->Observe(7);
  const std::string text = metrics::RenderText(registry);
  EXPECT_THAT(text, HasSubstr(R"(pdserve_request_prompt_tokens_bucket{)"
                              R"(model="smollm",le="91"} 0)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_request_prompt_tokens_bucket{)"
                              R"(model="smollm",le="128"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_request_prompt_tokens_sum{)"
                              R"(model="smollm"} 3100)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_request_generation_tokens_count{)"
                              R"(model="smollm"} 1)"));
}

TEST(RouterMetricsTest, WorkerPoolsAreCountedAtScrapeTime) {
  metrics::Registry registry;
  std::unique_ptr<RouterMetrics> m = Make(&registry);
  int serving_decode = 2;
  ASSERT_TRUE(
      m->AddWorkerPools([&](v1::WorkerRole role, v1::WorkerState state) {
         if (role == v1::WORKER_ROLE_DECODE &&
             state == v1::WORKER_STATE_SERVING) {
           return serving_decode;
         }
         return role == v1::WORKER_ROLE_PREFILL &&
                        state == v1::WORKER_STATE_DRAINING
                    ? 1
                    : 0;
       }).ok());
  serving_decode = 3;
  const std::string text = metrics::RenderText(registry);
  EXPECT_THAT(text, HasSubstr(R"(pdserve_workers{model="smollm",pool="decode",)"
                              R"(state="serving"} 3)"));
  EXPECT_THAT(text,
              HasSubstr(R"(pdserve_workers{model="smollm",pool="prefill",)"
                        R"(state="draining"} 1)"));
  EXPECT_THAT(text,
              HasSubstr(R"(pdserve_workers{model="smollm",pool="colocated",)"
                        R"(state="serving"} 0)"));
}

}  // namespace
}  // namespace pdserve::router
