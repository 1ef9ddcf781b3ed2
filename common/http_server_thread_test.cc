#include "common/http_server_thread.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "httplib.h"

namespace pdserve {
namespace {

TEST(ParseListenAddressTest, HostPortAndBracketedIpv6) {
  absl::StatusOr<HostPort> v4 = ParseListenAddress("127.0.0.1:8080");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 8080);
  absl::StatusOr<HostPort> v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  for (const char* bad :
       {"127.0.0.1", ":80", "127.0.0.1:x", "h:70000", "h:-1"}) {
    EXPECT_EQ(ParseListenAddress(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(HttpServerThreadTest, ServesUntilShutdown) {
  httplib::Server server;
  server.Get("/ping", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("pong", "text/plain");
  });
  bool bound = false;
  HttpServerThreadOptions options;
  options.listen_address = "127.0.0.1:0";
  options.after_bind = [&bound] { bound = true; };
  absl::StatusOr<std::unique_ptr<HttpServerThread>> thread =
      HttpServerThread::Start(options, &server);
  ASSERT_TRUE(thread.ok()) << thread.status();
  EXPECT_TRUE(bound);
  ASSERT_GT((*thread)->port(), 0);

  httplib::Client client("127.0.0.1", (*thread)->port());
  httplib::Result res = client.Get("/ping");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->body, "pong");

  (*thread)->Shutdown();
  (*thread)->Shutdown();  // idempotent
  EXPECT_FALSE(client.Get("/ping"));
}

TEST(HttpServerThreadTest, RefusesATakenPort) {
  httplib::Server first_server;
  HttpServerThreadOptions options;
  options.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<HttpServerThread>> first =
      HttpServerThread::Start(options, &first_server);
  ASSERT_TRUE(first.ok()) << first.status();
  httplib::Server second_server;
  options.listen_address = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_EQ(HttpServerThread::Start(options, &second_server).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve
