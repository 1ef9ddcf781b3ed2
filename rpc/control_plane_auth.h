// The control plane's door: servers refuse callers without the cluster's
// credential (rpc/cluster_credential.h), clients present it on every call.
//
// Protected: Membership and Admin on the router, DecodeWorker and
// PrefillWorker on the workers. Open: the client API (Generation, OpenAI
// HTTP), health and reflection. Every handler of a protected service calls
// RefuseUnlessClusterCaller (or RefusedUnary) first, before it reads the
// request, so a refused call changes nothing.
//
// Wire format: the token travels in the metadata entry
// `x-pdserve-cluster-token` (kClusterTokenMetadataKey). Without TLS it is
// readable on the network: the NetworkPolicy keeps the control ports to
// pdserve's pods (docs/security.md).
#ifndef PDSERVE_RPC_CONTROL_PLANE_AUTH_H_
#define PDSERVE_RPC_CONTROL_PLANE_AUTH_H_

#include <memory>
#include <string>

#include "grpcpp/channel.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/server_callback.h"
#include "rpc/cluster_credential.h"

namespace pdserve::rpc {

inline constexpr char kClusterTokenMetadataKey[] = "x-pdserve-cluster-token";

// OK when auth is off or the caller presented an accepted token; otherwise
// UNAUTHENTICATED, saying whether the token was missing or not accepted
// (never echoing what was presented).
grpc::Status RefuseUnlessClusterCaller(const grpc::ServerContextBase& context,
                                       const ClusterCredential& credential);

// For unary callback handlers, as their first line:
//   if (auto* refused = rpc::RefusedUnary(context, credential_)) return
//   refused;
// Returns the call's reactor finished with UNAUTHENTICATED, or nullptr when
// the caller may proceed.
grpc::ServerUnaryReactor* RefusedUnary(grpc::CallbackServerContext* context,
                                       const ClusterCredential& credential);

// An insecure channel to `target` whose every call presents the
// credential's token (a client interceptor adds the metadata entry). With
// auth off it is a plain insecure channel.
std::shared_ptr<grpc::Channel> NewControlPlaneChannel(
    const std::string& target, const ClusterCredential& credential,
    const grpc::ChannelArguments& args = grpc::ChannelArguments());

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_CONTROL_PLANE_AUTH_H_
