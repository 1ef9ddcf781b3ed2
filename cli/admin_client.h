// Typed calls to the router's Admin service, and their human-readable
// rendering, for pdctl and the local cluster launcher.
//
// Stateless functions; thread-safe. Each call opens its own channel, which
// suits a CLI; long-lived callers should hold a stub instead. Every call
// presents `credential` (the Admin API is the control plane; auth off by
// default, which a router with --cluster_token_file refuses).
#ifndef PDSERVE_CLI_ADMIN_CLIENT_H_
#define PDSERVE_CLI_ADMIN_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/admin.pb.h"
#include "rpc/cluster_credential.h"

namespace pdserve::cli {

absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
    const std::string& router_address, v1::WorkerRole role,
    absl::Duration timeout,
    const rpc::ClusterCredential& credential = rpc::ClusterCredential());

absl::StatusOr<v1::ListPoolsResponse> ListPools(
    const std::string& router_address, absl::Duration timeout,
    const rpc::ClusterCredential& credential = rpc::ClusterCredential());

absl::StatusOr<v1::DrainWorkerResponse> DrainWorker(
    const std::string& router_address, const std::string& worker_id,
    absl::Duration deadline, absl::Duration timeout,
    const rpc::ClusterCredential& credential = rpc::ClusterCredential());

absl::StatusOr<v1::GetRoutingPolicyResponse> GetRoutingPolicy(
    const std::string& router_address, absl::Duration timeout,
    const rpc::ClusterCredential& credential = rpc::ClusterCredential());

absl::StatusOr<v1::SetRoutingPolicyResponse> SetRoutingPolicy(
    const std::string& router_address, const v1::RoutingConfig& config,
    absl::Duration timeout,
    const rpc::ClusterCredential& credential = rpc::ClusterCredential());

// The `pdctl status` report: one line per pool, then a table of workers
// from their last heartbeat: requests in flight, sequences running, waiting
// (sequences admitted but not running, plus the prompts a prefill worker
// queues or computes), free KV blocks of the total and the share in use.
std::string FormatStatus(const v1::ListPoolsResponse& pools,
                         const v1::ListWorkersResponse& workers);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_ADMIN_CLIENT_H_
