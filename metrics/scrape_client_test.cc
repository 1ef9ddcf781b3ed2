#include "metrics/scrape_client.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http_server_thread.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "metrics/metrics_server.h"
#include "metrics/registry.h"

namespace pdserve::metrics {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(5);

std::unique_ptr<MetricsServer> Serve(const Registry* registry) {
  MetricsServerOptions options;
  options.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(options, registry);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// A plain httplib server answering GET /metrics with `handler`.
class FakeEndpoint {
 public:
  explicit FakeEndpoint(httplib::Server::Handler handler) {
    server_.Get("/metrics", std::move(handler));
    HttpServerThreadOptions options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<HttpServerThread>> thread =
        HttpServerThread::Start(options, &server_);
    EXPECT_TRUE(thread.ok()) << thread.status();
    thread_ = *std::move(thread);
  }
  std::string address() const {
    return "127.0.0.1:" + std::to_string(thread_->port());
  }

 private:
  httplib::Server server_;
  std::unique_ptr<HttpServerThread> thread_;
};

TEST(ScrapeClientTest, ScrapesARealMetricsServer) {
  Registry registry;
  MetricOptions options;
  options.name = "pdserve_worker_requests_running";
  options.help = "Sequences running.";
  options.label_names = {"worker_id"};
  Gauge* running = *(*registry.AddGauge(options))->WithLabels({"decode-0"});
  std::unique_ptr<MetricsServer> server = Serve(&registry);
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(server->port());

  running->Set(3);
  absl::StatusOr<ParsedMetrics> first = ScrapeMetrics(address, kTimeout);
  ASSERT_TRUE(first.ok()) << first.status();
  const ParsedFamily* f = first->Find("pdserve_worker_requests_running");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->samples.size(), 1);
  EXPECT_EQ(f->samples[0].labels, (Labels{{"worker_id", "decode-0"}}));
  EXPECT_EQ(f->samples[0].value, 3);

  // Each scrape reads the values of its moment; the URL and 0.0.0.0 forms
  // reach the same server.
  running->Set(5);
  for (const std::string& form :
       {"http://" + address + "/metrics",
        "0.0.0.0:" + std::to_string(server->port())}) {
    absl::StatusOr<ParsedMetrics> again = ScrapeMetrics(form, kTimeout);
    ASSERT_TRUE(again.ok()) << form << ": " << again.status();
    EXPECT_EQ(again->Find("pdserve_worker_requests_running")->samples[0].value,
              5);
  }
}

TEST(ScrapeClientTest, NobodyListeningIsUnavailableNamingTheUrl) {
  Registry registry;
  std::unique_ptr<MetricsServer> server = Serve(&registry);
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  server->Shutdown();
  absl::StatusOr<ParsedMetrics> scraped = ScrapeMetrics(address, kTimeout);
  ASSERT_FALSE(scraped.ok());
  EXPECT_EQ(scraped.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(scraped.status().message()),
              HasSubstr("http://" + address + "/metrics"));
}

TEST(ScrapeClientTest, ASlowServerTimesOut) {
  FakeEndpoint slow([](const httplib::Request&, httplib::Response& res) {
    absl::SleepFor(absl::Seconds(3));
    res.set_content("x 1\n", "text/plain");
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> text =
      FetchMetricsText(slow.address(), absl::Milliseconds(300));
  EXPECT_EQ(text.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ScrapeClientTest, AnErrorStatusOrABadBodyIsAnError) {
  FakeEndpoint failing([](const httplib::Request&, httplib::Response& res) {
    res.status = 503;
  });
  absl::StatusOr<ParsedMetrics> scraped =
      ScrapeMetrics(failing.address(), kTimeout);
  EXPECT_EQ(scraped.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(scraped.status().message()), HasSubstr("HTTP 503"));

  FakeEndpoint garbage([](const httplib::Request&, httplib::Response& res) {
    res.set_content("<html>not metrics</html>\n", "text/html");
  });
  scraped = ScrapeMetrics(garbage.address(), kTimeout);
  EXPECT_EQ(scraped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(scraped.status().message()),
              HasSubstr("metrics from " + garbage.address() + ": line 1"));
}

TEST(ScrapeClientTest, MalformedAddresses) {
  for (const char* bad :
       {"", "localhost", "host:", ":80", "h:0", "h:70000", "h:x", "http://"}) {
    EXPECT_EQ(FetchMetricsText(bad, kTimeout).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace pdserve::metrics
