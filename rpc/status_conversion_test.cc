#include "rpc/status_conversion.h"

#include "gtest/gtest.h"

namespace pdserve::rpc {
namespace {

TEST(StatusConversionTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusConversionTest, KeepsCodeAndMessage) {
  const grpc::Status resource =
      ToGrpcStatus(absl::ResourceExhaustedError("no free KV blocks"));
  EXPECT_EQ(resource.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(resource.error_message(), "no free KV blocks");

  const absl::Status invalid = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt too long"));
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(invalid.message(), "prompt too long");
}

TEST(StatusConversionTest, EveryCanonicalCodeRoundTrips) {
  // Spelled out independently of the cast in the implementation: the gRPC
  // code each absl code must become.
  const std::pair<absl::StatusCode, grpc::StatusCode> pairs[] = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded,
       grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied,
       grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted,
       grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition,
       grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [absl_code, grpc_code] : pairs) {
    const absl::Status original(absl_code, "m");
    const grpc::Status converted = ToGrpcStatus(original);
    EXPECT_EQ(converted.error_code(), grpc_code);
    EXPECT_EQ(FromGrpcStatus(converted), original);
  }
}

}  // namespace
}  // namespace pdserve::rpc
