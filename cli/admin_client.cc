#include "cli/admin_client.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "proto/admin.grpc.pb.h"
#include "proto/enum_names.h"
#include "rpc/control_plane_auth.h"
#include "rpc/status_conversion.h"

namespace pdserve::cli {
namespace {

// Runs one unary Admin call with a deadline; errors name the router.
template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> Call(const std::string& router_address,
                              absl::Duration timeout,
                              const rpc::ClusterCredential& credential,
                              const Request& request, Method method) {
  auto stub = v1::Admin::NewStub(
      rpc::NewControlPlaneChannel(router_address, credential));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(timeout));
  Response response;
  const grpc::Status status = ((*stub).*method)(&context, request, &response);
  if (!status.ok()) {
    const absl::Status error = rpc::FromGrpcStatus(status);
    return absl::Status(error.code(), absl::StrCat("router ", router_address,
                                                   ": ", error.message()));
  }
  return response;
}

}  // namespace

absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
    const std::string& router_address, v1::WorkerRole role,
    absl::Duration timeout, const rpc::ClusterCredential& credential) {
  v1::ListWorkersRequest request;
  request.set_role(role);
  return Call<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      router_address, timeout, credential, request,
      &v1::Admin::Stub::ListWorkers);
}

absl::StatusOr<v1::ListPoolsResponse> ListPools(
    const std::string& router_address, absl::Duration timeout,
    const rpc::ClusterCredential& credential) {
  return Call<v1::ListPoolsRequest, v1::ListPoolsResponse>(
      router_address, timeout, credential, v1::ListPoolsRequest(),
      &v1::Admin::Stub::ListPools);
}

absl::StatusOr<v1::DrainWorkerResponse> DrainWorker(
    const std::string& router_address, const std::string& worker_id,
    absl::Duration deadline, absl::Duration timeout,
    const rpc::ClusterCredential& credential) {
  v1::DrainWorkerRequest request;
  request.set_worker_id(worker_id);
  request.set_deadline_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(deadline)));
  return Call<v1::DrainWorkerRequest, v1::DrainWorkerResponse>(
      router_address, timeout, credential, request,
      &v1::Admin::Stub::DrainWorker);
}

absl::StatusOr<v1::GetRoutingPolicyResponse> GetRoutingPolicy(
    const std::string& router_address, absl::Duration timeout,
    const rpc::ClusterCredential& credential) {
  return Call<v1::GetRoutingPolicyRequest, v1::GetRoutingPolicyResponse>(
      router_address, timeout, credential, v1::GetRoutingPolicyRequest(),
      &v1::Admin::Stub::GetRoutingPolicy);
}

absl::StatusOr<v1::SetRoutingPolicyResponse> SetRoutingPolicy(
    const std::string& router_address, const v1::RoutingConfig& config,
    absl::Duration timeout, const rpc::ClusterCredential& credential) {
  v1::SetRoutingPolicyRequest request;
  *request.mutable_config() = config;
  return Call<v1::SetRoutingPolicyRequest, v1::SetRoutingPolicyResponse>(
      router_address, timeout, credential, request,
      &v1::Admin::Stub::SetRoutingPolicy);
}

std::string FormatStatus(const v1::ListPoolsResponse& pools,
                         const v1::ListWorkersResponse& workers) {
  std::string out;
  for (const v1::PoolInfo& pool : pools.pools()) {
    absl::StrAppendFormat(&out,
                          "pool %-9s %u serving, %u starting, %u draining\n",
                          ShortRoleName(pool.role()), pool.current_size(),
                          pool.starting(), pool.draining());
  }
  absl::StrAppendFormat(&out,
                        "\n%-22s %-9s %-9s %-21s %9s %7s %7s %11s %7s %8s\n",
                        "WORKER", "ROLE", "STATE", "ADDRESS", "IN-FLIGHT",
                        "RUNNING", "WAITING", "KV FREE", "KV USED", "LAST HB");
  for (const v1::WorkerInfo& w : workers.workers()) {
    const v1::WorkerLoad& load = w.load();
    const bool has_kv = load.total_kv_blocks() != 0;
    const std::string kv_free =
        has_kv
            ? absl::StrCat(load.free_kv_blocks(), "/", load.total_kv_blocks())
            : std::string("-");
    const std::string kv_used =
        has_kv ? absl::StrFormat(
                     "%.1f%%",
                     100.0 * (1.0 - static_cast<double>(load.free_kv_blocks()) /
                                        load.total_kv_blocks()))
               : std::string("-");
    // Waiting: sequences admitted but not running, plus the prompts a
    // prefill worker holds (queued or in prefill).
    const uint64_t waiting = static_cast<uint64_t>(load.waiting_sequences()) +
                             load.queued_prefill_requests();
    absl::StrAppendFormat(
        &out, "%-22s %-9s %-9s %-21s %9u %7u %7u %11s %7s %6ums\n",
        w.worker_id(), ShortRoleName(w.role()), ShortStateName(w.state()),
        w.grpc_address(), w.inflight_requests(), load.running_sequences(),
        waiting, kv_free, kv_used, w.last_heartbeat_age_ms());
  }
  if (workers.workers().empty()) out += "(no workers registered)\n";
  return out;
}

}  // namespace pdserve::cli
