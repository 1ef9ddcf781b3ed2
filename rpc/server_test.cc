#include "rpc/server.h"

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
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

TEST(GrpcServerTest, LivenessStaysServingWhileReadinessDoesNot) {
  auto server = GrpcServer::Start(GrpcServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  for (bool ready : {false, true, false}) {
    (*server)->SetServing(ready);
    absl::StatusOr<HealthStatus> liveness =
        CheckHealth(address, kLivenessService, absl::Seconds(5));
    ASSERT_TRUE(liveness.ok()) << liveness.status();
    EXPECT_EQ(*liveness, HealthStatus::kServing);
    absl::StatusOr<HealthStatus> readiness =
        CheckHealth(address, "", absl::Seconds(5));
    ASSERT_TRUE(readiness.ok()) << readiness.status();
    EXPECT_EQ(*readiness,
              ready ? HealthStatus::kServing : HealthStatus::kNotServing);
  }
}

TEST(GrpcServerTest, WatchStreamsEveryChangeAndEndsOnShutdown) {
  auto server = GrpcServer::Start(GrpcServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      (*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  grpc::health::v1::HealthCheckRequest request;
  auto reader = stub->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  (*server)->SetServing(true);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  (*server)->SetServing(false);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  // Shutdown ends the stream promptly rather than waiting out the grace.
  const absl::Time start = absl::Now();
  (*server)->Shutdown(absl::Seconds(10));
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(GrpcServerTest, HealthCheckOfNothingIsUnavailableWithinTheTimeout) {
  // Port 1 is privileged and nothing listens there.
  const std::string address = "127.0.0.1:1";
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
