#include "router/control_services.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "rpc/control_plane_auth.h"
#include "rpc/status_conversion.h"

namespace pdserve::router {
namespace {

// Default drain deadline when the operator gives none.
constexpr absl::Duration kDefaultDrainDeadline = absl::Seconds(60);

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

uint32_t ClampToMs(absl::Duration d) {
  return static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, UINT32_MAX));
}

}  // namespace

grpc::ServerUnaryReactor* MembershipService::Register(
    grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
    v1::RegisterResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  WorkerRegistration registration;
  registration.worker_id = request->worker_id();
  registration.instance_id = request->instance_id();
  registration.role = request->role();
  registration.address = request->grpc_address();
  registration.model = request->model();
  for (int t : request->transports()) {
    registration.transports.push_back(static_cast<v1::TransportKind>(t));
  }
  registration.version = request->version();
  registration.metrics_address = request->metrics_address();
  absl::StatusOr<Lease> lease = registry_->Register(registration, absl::Now());
  if (!lease.ok()) return Finish(context, lease.status());
  PD_LOG(INFO) << "worker " << registration.worker_id << " ("
               << v1::WorkerRole_Name(registration.role) << ") registered at "
               << registration.address;
  response->set_lease_id(lease->lease_id);
  response->set_router_id(registry_->router_id());
  response->set_lease_duration_ms(ClampToMs(lease->duration));
  response->set_heartbeat_interval_ms(ClampToMs(lease->heartbeat_interval));
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MembershipService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  HeartbeatReport report;
  report.state = request->state();
  report.load = request->load();
  report.inflight_requests = request->inflight_requests();
  report.events.assign(request->events().begin(), request->events().end());
  report.events_reset = request->events_reset();
  absl::StatusOr<HeartbeatReply> reply =
      registry_->Heartbeat(request->lease_id(), report, absl::Now());
  if (!reply.ok()) return Finish(context, reply.status());
  if (reply->drain.has_value()) {
    v1::WorkerCommand* command = response->add_commands();
    command->set_kind(v1::WorkerCommand::KIND_DRAIN);
    command->set_drain_deadline_ms(ClampToMs(*reply->drain));
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MembershipService::Deregister(
    grpc::CallbackServerContext* context, const v1::DeregisterRequest* request,
    v1::DeregisterResponse* /*response*/) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  const absl::Status status = registry_->Deregister(request->lease_id());
  if (status.ok()) {
    PD_LOG(INFO) << "worker " << request->worker_id() << " deregistered ("
                 << request->reason() << ")";
  }
  return Finish(context, status);
}

grpc::ServerUnaryReactor* AdminService::ListWorkers(
    grpc::CallbackServerContext* context, const v1::ListWorkersRequest* request,
    v1::ListWorkersResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  const absl::Time now = absl::Now();
  for (const WorkerRecord& record : registry_->List(now, request->role())) {
    v1::WorkerInfo* info = response->add_workers();
    info->set_worker_id(record.registration.worker_id);
    info->set_role(record.registration.role);
    info->set_grpc_address(record.registration.address);
    info->set_state(record.state);
    *info->mutable_load() = record.load;
    info->set_lease_remaining_ms(ClampToMs(record.lease_expiry - now));
    info->set_last_heartbeat_age_ms(ClampToMs(now - record.last_heartbeat));
    *info->mutable_model() = record.registration.model;
    for (v1::TransportKind t : record.registration.transports) {
      info->add_transports(t);
    }
    info->set_inflight_requests(record.inflight_requests);
    info->set_registered_unix_ms(absl::ToUnixMillis(record.registered_at));
    info->set_version(record.registration.version);
    info->set_metrics_address(record.registration.metrics_address);
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::ListPools(
    grpc::CallbackServerContext* context,
    const v1::ListPoolsRequest* /*request*/, v1::ListPoolsResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  // Pool targets and SLOs come with the planner; today a pool is what has
  // registered (one entry per role with at least one worker).
  const std::array<v1::WorkerRole, 3> roles = {
      v1::WORKER_ROLE_PREFILL, v1::WORKER_ROLE_DECODE, v1::WORKER_ROLE_BOTH};
  const absl::Time now = absl::Now();
  for (v1::WorkerRole role : roles) {
    const std::vector<WorkerRecord> members =
        registry_->List(now, role, /*exact_role=*/true);
    if (members.empty()) continue;
    v1::PoolInfo* pool = response->add_pools();
    pool->set_role(role);
    for (const WorkerRecord& record : members) {
      switch (record.state) {
        case v1::WORKER_STATE_SERVING:
          pool->set_current_size(pool->current_size() + 1);
          break;
        case v1::WORKER_STATE_STARTING:
          pool->set_starting(pool->starting() + 1);
          break;
        case v1::WORKER_STATE_DRAINING:
          pool->set_draining(pool->draining() + 1);
          break;
        default:
          break;
      }
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::DrainWorker(
    grpc::CallbackServerContext* context, const v1::DrainWorkerRequest* request,
    v1::DrainWorkerResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  const absl::Duration deadline =
      request->deadline_ms() == 0 ? kDefaultDrainDeadline
                                  : absl::Milliseconds(request->deadline_ms());
  const absl::Status status =
      registry_->RequestDrain(request->worker_id(), deadline);
  if (!status.ok()) return Finish(context, status);
  for (const WorkerRecord& record :
       registry_->List(absl::Now(), v1::WORKER_ROLE_UNSPECIFIED)) {
    if (record.registration.worker_id == request->worker_id()) {
      response->set_inflight_requests(record.inflight_requests);
    }
  }
  PD_LOG(INFO) << "drain requested for " << request->worker_id() << " within "
               << absl::FormatDuration(deadline);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::SetRoutingPolicy(
    grpc::CallbackServerContext* context,
    const v1::SetRoutingPolicyRequest* request,
    v1::SetRoutingPolicyResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  absl::StatusOr<v1::RoutingConfig> previous =
      policy_->SetConfig(request->config());
  if (!previous.ok()) return Finish(context, previous.status());
  *response->mutable_previous() = *previous;
  *response->mutable_current() = policy_->config();
  PD_LOG(INFO) << "routing policy now "
               << v1::RoutingPolicy_Name(request->config().policy())
               << ", local prefill up to "
               << request->config().local_prefill_max_uncached_tokens()
               << " uncached tokens";
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetRoutingPolicy(
    grpc::CallbackServerContext* context,
    const v1::GetRoutingPolicyRequest* /*request*/,
    v1::GetRoutingPolicyResponse* response) {
  if (auto* refused = rpc::RefusedUnary(context, credential_)) return refused;
  *response->mutable_config() = policy_->config();
  return Finish(context, absl::OkStatus());
}

}  // namespace pdserve::router
