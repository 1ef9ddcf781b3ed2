#include "cli/top_scrape.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/metrics_server.h"
#include "metrics/registry.h"

namespace pdserve::cli {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(5);

std::unique_ptr<metrics::MetricsServer> Serve(
    const metrics::Registry* registry) {
  metrics::MetricsServerOptions options;
  options.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> server =
      metrics::MetricsServer::Start(options, registry);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::string Address(const metrics::MetricsServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

metrics::MetricOptions Options(std::string name,
                               std::vector<std::string> labels) {
  metrics::MetricOptions o;
  o.name = std::move(name);
  o.help = "Help.";
  o.label_names = std::move(labels);
  return o;
}

TEST(ScrapeClusterTest, ScrapesTheRouterAndEveryWorkerOverHttp) {
  metrics::Registry router_registry;
  metrics::Counter* requests =
      *(*router_registry.AddCounter(
            Options("pdserve_requests_total", {"model", "status"})))
           ->WithLabels({"m", "ok"});
  metrics::Registry worker_registry;
  metrics::Gauge* running =
      *(*worker_registry.AddGauge(
            Options("pdserve_worker_requests_running", {"worker_id"})))
           ->WithLabels({"decode-0"});
  metrics::Counter* generated =
      *(*worker_registry.AddCounter(
            Options("pdserve_worker_generated_tokens_total", {"worker_id"})))
           ->WithLabels({"decode-0"});
  std::unique_ptr<metrics::MetricsServer> router = Serve(&router_registry);
  std::unique_ptr<metrics::MetricsServer> worker = Serve(&worker_registry);
  // A worker whose metrics server has gone.
  std::unique_ptr<metrics::MetricsServer> dead = Serve(&worker_registry);
  ASSERT_TRUE(router && worker && dead);
  const std::string dead_address = Address(*dead);
  dead->Shutdown();

  v1::ListWorkersResponse listed;
  v1::WorkerInfo* w = listed.add_workers();
  w->set_worker_id("decode-0");
  w->set_role(v1::WORKER_ROLE_DECODE);
  w->set_state(v1::WORKER_STATE_SERVING);
  w->set_metrics_address(Address(*worker));
  w = listed.add_workers();
  w->set_worker_id("decode-1");
  w->set_role(v1::WORKER_ROLE_DECODE);
  w->set_state(v1::WORKER_STATE_SERVING);
  w->set_metrics_address(dead_address);
  absl::StatusOr<v1::ListWorkersResponse> answer = listed;
  const ListWorkersFn list = [&] { return answer; };

  ClusterScrapes scrapes(absl::Seconds(60));
  TopFrameInput input;
  input.router_control = "admin";
  input.router_http = Address(*router);
  input.window = absl::Seconds(60);
  ASSERT_TRUE(ScrapeCluster(list, input.router_http, kTimeout, scrapes).ok());
  requests->Inc(4);
  running->Set(2);
  generated->Inc(1000);
  absl::SleepFor(absl::Milliseconds(100));
  input.workers = ScrapeCluster(list, input.router_http, kTimeout, scrapes);
  ASSERT_TRUE(input.workers.ok());

  EXPECT_EQ(scrapes.router().size(), 2);
  EXPECT_GT(*scrapes.router().Rate("pdserve_requests_total"), 0);
  const ScrapeHistory* decode0 = scrapes.FindWorker("decode-0");
  ASSERT_NE(decode0, nullptr);
  EXPECT_EQ(decode0->size(), 2);
  const WorkerStats stats =
      ComputeWorkerStats(*decode0, v1::WORKER_ROLE_DECODE);
  EXPECT_EQ(stats.running, 2);
  EXPECT_GT(*stats.tokens_per_s, 0);
  const std::string frame = RenderTopFrame(input, scrapes);
  EXPECT_THAT(frame, HasSubstr("decode pool, 2 workers"));
  EXPECT_THAT(frame, HasSubstr("  decode-0             SERVING         2"));
  EXPECT_THAT(frame, HasSubstr("  decode-1             SERVING   unreachable: "
                               "GET http://" +
                               dead_address + "/metrics"));

  // A worker gone from the list is forgotten; a failed list scrapes the
  // router alone.
  listed.mutable_workers()->DeleteSubrange(1, 1);
  answer = listed;
  ASSERT_TRUE(ScrapeCluster(list, input.router_http, kTimeout, scrapes).ok());
  EXPECT_EQ(scrapes.FindWorker("decode-1"), nullptr);
  answer = absl::UnavailableError("router down");
  EXPECT_FALSE(ScrapeCluster(list, input.router_http, kTimeout, scrapes).ok());
  EXPECT_EQ(scrapes.router().size(), 4);
  EXPECT_EQ(scrapes.FindWorker("decode-0")->size(), 3);
}

}  // namespace
}  // namespace pdserve::cli
