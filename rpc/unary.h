// Finishing a callback-API unary call from an absl result.
#ifndef PDSERVE_RPC_UNARY_H_
#define PDSERVE_RPC_UNARY_H_

#include <utility>

#include "absl/status/statusor.h"
#include "grpcpp/support/server_callback.h"
#include "rpc/status_conversion.h"

namespace pdserve::rpc {

// Copies a successful result into *response and finishes the call with the
// result's status (converted once, here).
template <typename T>
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      absl::StatusOr<T> result, T* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = std::move(result).value();
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_UNARY_H_
