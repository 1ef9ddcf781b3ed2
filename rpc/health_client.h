// Client side of grpc.health.v1, used by pdctl, the local launcher and tests
// to wait for a process to become ready.
//
// Stateless functions; thread-safe.
#ifndef PDSERVE_RPC_HEALTH_CLIENT_H_
#define PDSERVE_RPC_HEALTH_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::rpc {

enum class HealthStatus { kUnknown, kServing, kNotServing, kServiceUnknown };

// "SERVING", "NOT_SERVING", ... as in the protocol.
const char* HealthStatusName(HealthStatus status);

// One Check call to `address` (host:port) for `service` ("" = whole server).
// Errors: UNAVAILABLE when nothing answers, DEADLINE_EXCEEDED after `timeout`,
// NOT_FOUND for an unknown service name.
absl::StatusOr<HealthStatus> CheckHealth(const std::string& address,
                                         const std::string& service,
                                         absl::Duration timeout);

// Polls CheckHealth until it returns SERVING or `timeout` passes; the error
// then says what the last answer was.
absl::Status WaitUntilServing(const std::string& address,
                              absl::Duration timeout);

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_HEALTH_CLIENT_H_
