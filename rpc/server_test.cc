#include "rpc/server.h"

#include "gtest/gtest.h"
#include "rpc/health_client.h"

namespace pdserve::rpc {
namespace {

TEST(GrpcServerTest, HealthStartsNotServingAndFollowsSetServing) {
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(GrpcServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string address = (*server)->address();

  absl::StatusOr<HealthStatus> health =
      CheckHealth(address, "", absl::Seconds(5));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kNotServing);

  (*server)->SetServing(true);
  health = CheckHealth(address, "", absl::Seconds(5));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kServing);
  EXPECT_TRUE(WaitUntilServing(address, absl::Seconds(5)).ok());

  (*server)->SetServing(false);  // Draining.
  health = CheckHealth(address, "", absl::Seconds(5));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kNotServing);
}

TEST(GrpcServerTest, UnknownServiceNameIsNotFound) {
  auto server = GrpcServer::Start(GrpcServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<HealthStatus> health =
      CheckHealth((*server)->address(), "no.such.Service", absl::Seconds(5));
  EXPECT_EQ(health.status().code(), absl::StatusCode::kNotFound);
}

TEST(GrpcServerTest, TakenPortIsAClearError) {
  auto first = GrpcServer::Start(GrpcServerOptions{});
  ASSERT_TRUE(first.ok()) << first.status();
  GrpcServerOptions options;
  options.listen_address = (*first)->address();
  auto second = GrpcServer::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find((*first)->address()),
            std::string::npos)
      << second.status();
}

TEST(GrpcServerTest, HealthCheckOfNothingIsUnavailableWithinTheTimeout) {
  std::string address;
  {
    auto server = GrpcServer::Start(GrpcServerOptions{});
    ASSERT_TRUE(server.ok());
    address = (*server)->address();
  }  // Shut down: the port is now closed.
  const absl::Time start = absl::Now();
  absl::StatusOr<HealthStatus> health =
      CheckHealth(address, "", absl::Milliseconds(500));
  EXPECT_FALSE(health.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(WaitUntilServing(address, absl::Milliseconds(300)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace pdserve::rpc
