#include "rpc/health_client.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "rpc/status_conversion.h"

namespace pdserve::rpc {

const char* HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

absl::StatusOr<HealthStatus> CheckHealth(const std::string& address,
                                         const std::string& service,
                                         absl::Duration timeout) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    const absl::Status error = FromGrpcStatus(status);
    return absl::Status(error.code(), absl::StrCat("health check of ", address,
                                                   ": ", error.message()));
  }
  switch (response.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return HealthStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return HealthStatus::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return HealthStatus::kServiceUnknown;
    default:
      return HealthStatus::kUnknown;
  }
}

absl::Status WaitUntilServing(const std::string& address,
                              absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("no answer yet");
  while (true) {
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    absl::StatusOr<HealthStatus> health =
        CheckHealth(address, "", std::min(left, absl::Seconds(1)));
    if (health.ok() && *health == HealthStatus::kServing) {
      return absl::OkStatus();
    }
    last = health.ok() ? absl::UnavailableError(
                             absl::StrCat("status ", HealthStatusName(*health)))
                       : health.status();
    absl::SleepFor(std::min(absl::Milliseconds(50), give_up - absl::Now()));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(address, " did not become SERVING within ",
                   absl::FormatDuration(timeout), "; last: ", last.ToString()));
}

}  // namespace pdserve::rpc
