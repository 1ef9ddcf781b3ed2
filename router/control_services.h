// The router's control-plane gRPC services, thin layers over WorkerRegistry:
//   - Membership: workers register, heartbeat and deregister;
//   - Admin: what pdctl uses to list workers and pools and drain a worker.
// (Routing policy, scaling and cluster statistics arrive with the serving,
// metrics and planner work; until then those Admin calls answer
// UNIMPLEMENTED.)
//
// Both are the control plane: every call must present the cluster's
// credential (rpc/control_plane_auth.h), checked before anything else, so a
// refused call changes nothing.
//
// Both translate proto <-> registry types and absl::Status -> grpc::Status
// once, and never block inside a reaction.
//
// Ownership: the registry is not owned and must outlive the services.
// Thread-safety: gRPC calls the methods concurrently; all state lives in the
// thread-safe registry.
#ifndef PDSERVE_ROUTER_CONTROL_SERVICES_H_
#define PDSERVE_ROUTER_CONTROL_SERVICES_H_

#include <utility>

#include "proto/admin.grpc.pb.h"
#include "proto/membership.grpc.pb.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"
#include "rpc/cluster_credential.h"

namespace pdserve::router {

class MembershipService final : public v1::Membership::CallbackService {
 public:
  // `credential` off by default (tests, local development).
  explicit MembershipService(
      WorkerRegistry* registry,
      rpc::ClusterCredential credential = rpc::ClusterCredential())
      : registry_(registry), credential_(std::move(credential)) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(
      grpc::CallbackServerContext* context,
      const v1::DeregisterRequest* request,
      v1::DeregisterResponse* response) override;

 private:
  WorkerRegistry* const registry_;
  const rpc::ClusterCredential credential_;
};

class AdminService final : public v1::Admin::CallbackService {
 public:
  AdminService(WorkerRegistry* registry, RoutingPolicy* policy,
               rpc::ClusterCredential credential = rpc::ClusterCredential())
      : registry_(registry),
        policy_(policy),
        credential_(std::move(credential)) {}

  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const v1::ListWorkersRequest* request,
      v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* ListPools(grpc::CallbackServerContext* context,
                                      const v1::ListPoolsRequest* request,
                                      v1::ListPoolsResponse* response) override;
  grpc::ServerUnaryReactor* DrainWorker(
      grpc::CallbackServerContext* context,
      const v1::DrainWorkerRequest* request,
      v1::DrainWorkerResponse* response) override;
  grpc::ServerUnaryReactor* SetRoutingPolicy(
      grpc::CallbackServerContext* context,
      const v1::SetRoutingPolicyRequest* request,
      v1::SetRoutingPolicyResponse* response) override;
  grpc::ServerUnaryReactor* GetRoutingPolicy(
      grpc::CallbackServerContext* context,
      const v1::GetRoutingPolicyRequest* request,
      v1::GetRoutingPolicyResponse* response) override;

 private:
  WorkerRegistry* const registry_;
  RoutingPolicy* const policy_;
  const rpc::ClusterCredential credential_;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_CONTROL_SERVICES_H_
