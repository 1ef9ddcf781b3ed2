#include "metrics/metrics_server.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"

namespace pdserve::metrics {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<MetricsServer> StartOnLoopback(const Registry* registry) {
  MetricsServerOptions options;
  options.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(options, registry);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(MetricsServerTest, ServesTheRegistryAtGetMetrics) {
  Registry registry;
  MetricOptions options;
  options.name = "pdserve_scrapes_total";
  options.help = "Counts.";
  Counter* counter = *(*registry.AddCounter(options))->WithLabels({});
  std::unique_ptr<MetricsServer> server = StartOnLoopback(&registry);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->port(), 0);

  httplib::Client client("127.0.0.1", server->port());
  counter->Inc(5);
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), kTextContentType);
  EXPECT_EQ(res->body, RenderText(registry));
  EXPECT_THAT(res->body, HasSubstr("pdserve_scrapes_total 5\n"));

  // Values are read at each scrape.
  counter->Inc();
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("pdserve_scrapes_total 6\n"));

  res = client.Get("/other");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  server->Shutdown();
  server->Shutdown();  // idempotent
}

TEST(MetricsServerTest, RefusesATakenPortAndBadOptions) {
  Registry registry;
  std::unique_ptr<MetricsServer> first = StartOnLoopback(&registry);
  ASSERT_NE(first, nullptr);
  MetricsServerOptions options;
  options.listen_address = "127.0.0.1:" + std::to_string(first->port());
  EXPECT_EQ(MetricsServer::Start(options, &registry).status().code(),
            absl::StatusCode::kUnavailable);
  options.listen_address = "127.0.0.1";
  EXPECT_EQ(MetricsServer::Start(options, &registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.listen_address = "127.0.0.1:0";
  options.threads = 0;
  EXPECT_EQ(MetricsServer::Start(options, &registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.threads = 1;
  EXPECT_FALSE(MetricsServer::Start(options, nullptr).ok());
}

}  // namespace
}  // namespace pdserve::metrics
