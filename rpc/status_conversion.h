// Conversion between absl::Status (used everywhere inside pdserve) and
// grpc::Status (used only at gRPC service and client boundaries).
//
// The canonical codes are numerically identical in both libraries, so the
// conversion keeps code and message unchanged. Stateless; thread-safe.
#ifndef PDSERVE_RPC_STATUS_CONVERSION_H_
#define PDSERVE_RPC_STATUS_CONVERSION_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace pdserve::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_STATUS_CONVERSION_H_
