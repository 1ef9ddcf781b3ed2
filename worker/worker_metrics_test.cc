#include "worker/worker_metrics.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"

namespace pdserve::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

WorkerMetricsOptions Options() {
  WorkerMetricsOptions options;
  options.model = "smollm";
  options.role = "decode";
  options.worker_id = "decode-0";
  return options;
}

TEST(WorkerMetricsTest, RecordedEventsAreExportedWithTheWorkersLabels) {
  metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m =
      WorkerMetrics::Create(&registry, Options());
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->generated_tokens->Inc(7);
  (*m)->transfer_bytes->Inc(4096);
  (*m)->transfer_failures(TransferFailure::kChecksum)->Inc();
  (*m)->inter_token_latency->Observe(0.004);
  const std::string text = metrics::RenderText(registry);
  const std::string labels =
      R"(model="smollm",role="decode",worker_id="decode-0")";
  EXPECT_THAT(text, HasSubstr("pdserve_worker_generated_tokens_total{" +
                              labels + "} 7\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_kv_transfer_bytes_total{" + labels +
                              R"(,direction="received"} 4096)"));
  EXPECT_THAT(text, HasSubstr("pdserve_kv_transfer_failures_total{" + labels +
                              R"(,reason="checksum"} 1)"));
  // Every reason is exported from the start, so rate() works at once.
  EXPECT_THAT(text, HasSubstr("pdserve_kv_transfer_failures_total{" + labels +
                              R"(,reason="peer_lost"} 0)"));
  // 4 ms falls in the (0.002, 0.004] bucket of the default ITL layout.
  EXPECT_THAT(text,
              HasSubstr("pdserve_worker_inter_token_latency_seconds_bucket{" +
                        labels + R"(,le="0.002"} 0)"));
  EXPECT_THAT(text,
              HasSubstr("pdserve_worker_inter_token_latency_seconds_bucket{" +
                        labels + R"(,le="0.004"} 1)"));
}

TEST(WorkerMetricsTest, PrefillWorkersSendTheirBytes) {
  metrics::Registry registry;
  WorkerMetricsOptions options = Options();
  options.role = "prefill";
  ASSERT_TRUE(WorkerMetrics::Create(&registry, options).ok());
  EXPECT_THAT(metrics::RenderText(registry), HasSubstr(R"(direction="sent")"));
}

TEST(WorkerMetricsTest, GaugesAreReadFromTheRoleAtScrapeTime) {
  metrics::Registry registry;
  std::unique_ptr<WorkerMetrics> m =
      WorkerMetrics::Create(&registry, Options()).value();
  WorkerGauges::KvBlocks kv{.capacity = 100,
                            .used = 30,
                            .free = 60,
                            .reserved = 10,
                            .quarantined = 2};
  bool draining = false;
  WorkerGauges gauges;
  gauges.requests = [] { return WorkerGauges::Requests{3, 5}; };
  gauges.kv_blocks = [&kv] { return kv; };
  gauges.prefix_cache = [] { return WorkerGauges::PrefixCache{64, 48}; };
  gauges.draining = [&draining] { return draining; };
  ASSERT_TRUE(m->AddGauges(gauges).ok());
  EXPECT_FALSE(m->AddGauges(gauges).ok());

  kv.free = 25;
  draining = true;
  const std::string text = metrics::RenderText(registry);
  const std::string labels =
      R"(model="smollm",role="decode",worker_id="decode-0")";
  EXPECT_THAT(text,
              HasSubstr("pdserve_worker_requests_running{" + labels + "} 3\n"));
  EXPECT_THAT(text,
              HasSubstr("pdserve_worker_requests_waiting{" + labels + "} 5\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_kv_cache_blocks{" + labels +
                              R"(,state="free"} 25)"));
  EXPECT_THAT(text, HasSubstr("pdserve_kv_cache_blocks{" + labels +
                              R"(,state="quarantined"} 2)"));
  EXPECT_THAT(text,
              HasSubstr("pdserve_kv_cache_usage_ratio{" + labels + "} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_prefix_cache_hit_tokens_total{" +
                              labels + "} 48\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_worker_draining{" + labels + "} 1\n"));
}

TEST(WorkerMetricsTest, UnsetGaugesExportNothing) {
  metrics::Registry registry;
  std::unique_ptr<WorkerMetrics> m =
      WorkerMetrics::Create(&registry, Options()).value();
  ASSERT_TRUE(m->AddGauges(WorkerGauges()).ok());
  EXPECT_THAT(metrics::RenderText(registry),
              Not(HasSubstr("pdserve_kv_cache_usage_ratio")));
}

TEST(WorkerMetricsTest, TransferFailureReasonsFromStatusCodes) {
  EXPECT_EQ(TransferFailureOf(absl::DataLossError("x")),
            TransferFailure::kChecksum);
  EXPECT_EQ(TransferFailureOf(absl::DeadlineExceededError("x")),
            TransferFailure::kDeadline);
  EXPECT_EQ(TransferFailureOf(absl::UnavailableError("x")),
            TransferFailure::kPeerLost);
  EXPECT_EQ(TransferFailureOf(absl::CancelledError("x")),
            TransferFailure::kCancelled);
  EXPECT_EQ(TransferFailureOf(absl::InternalError("x")),
            TransferFailure::kOther);
}

TEST(WorkerMetricsTest, UnregisteredMetricsAreUsable) {
  WorkerMetrics* m = WorkerMetrics::Unregistered();
  ASSERT_NE(m, nullptr);
  m->step_duration->Observe(0.01);
  EXPECT_EQ(m, WorkerMetrics::Unregistered());
}

}  // namespace
}  // namespace pdserve::worker
