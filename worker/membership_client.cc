#include "worker/membership_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "rpc/control_plane_auth.h"
#include "rpc/status_conversion.h"

namespace pdserve::worker {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(timeout));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MembershipClient>> MembershipClient::Start(
    MembershipClientOptions options) {
  if (options.router_address.empty()) {
    return absl::InvalidArgumentError("membership: router address is empty");
  }
  if (!options.report_status || !options.on_drain) {
    return absl::InvalidArgumentError("membership: callbacks are required");
  }
  auto client = std::unique_ptr<MembershipClient>(
      new MembershipClient(std::move(options)));
  client->thread_ = std::thread([c = client.get()] { c->Loop(); });
  return client;
}

MembershipClient::MembershipClient(MembershipClientOptions options)
    : options_(std::move(options)),
      stub_(v1::Membership::NewStub(rpc::NewControlPlaneChannel(
          options_.router_address, options_.credential))) {
  if (options_.prefix_cache_feed != nullptr) {
    options_.prefix_cache_feed->Subscribe(options_.router_address);
  }
}

MembershipClient::~MembershipClient() {
  Stop("shutdown");
  if (options_.prefix_cache_feed != nullptr) {
    options_.prefix_cache_feed->Unsubscribe(options_.router_address);
  }
}

bool MembershipClient::registered() {
  absl::MutexLock lock(&mutex_);
  return !lease_id_.empty();
}

void MembershipClient::Stop(const std::string& reason) {
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // Read after the join: a registration that finished meanwhile is included.
  std::string lease_id;
  {
    absl::MutexLock lock(&mutex_);
    lease_id = lease_id_;
  }
  if (lease_id.empty()) return;
  grpc::ClientContext context;
  SetDeadline(&context, options_.rpc_timeout);
  v1::DeregisterRequest request;
  request.set_lease_id(lease_id);
  request.set_worker_id(options_.registration.worker_id());
  request.set_reason(reason);
  v1::DeregisterResponse response;
  const grpc::Status status = stub_->Deregister(&context, request, &response);
  if (!status.ok()) {
    PD_LOG(WARNING) << "deregister from router " << options_.router_address
                    << " failed (the lease will expire instead): "
                    << rpc::FromGrpcStatus(status);
  }
}

void MembershipClient::Loop() {
  absl::Duration backoff = absl::Milliseconds(100);
  bool reported_unreachable = false;
  while (true) {
    absl::Duration wait;
    bool have_lease;
    {
      absl::MutexLock lock(&mutex_);
      if (stopping_) return;
      have_lease = !lease_id_.empty();
    }
    if (!have_lease) {
      if (TryRegister()) {
        backoff = absl::Milliseconds(100);
        reported_unreachable = false;
        continue;  // Heartbeat right away: report state promptly.
      }
      if (!reported_unreachable) {
        PD_LOG(WARNING) << "router " << options_.router_address
                        << " not reachable; retrying";
        reported_unreachable = true;
      }
      wait = backoff;
      backoff = std::min(backoff * 2, absl::Seconds(2));
    } else {
      SendHeartbeat();
      absl::MutexLock lock(&mutex_);
      wait = heartbeat_interval_;
    }
    // Sleep, but wake at once on Stop().
    absl::MutexLock lock(&mutex_);
    mutex_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
  }
}

bool MembershipClient::TryRegister() {
  grpc::ClientContext context;
  SetDeadline(&context, options_.rpc_timeout);
  v1::RegisterResponse response;
  const grpc::Status status =
      stub_->Register(&context, options_.registration, &response);
  if (!status.ok()) {
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      PD_LOG(ERROR) << "router " << options_.router_address
                    << " refused registration: " << rpc::FromGrpcStatus(status);
    }
    return false;
  }
  PD_LOG(INFO) << "registered with router " << options_.router_address
               << " (lease " << response.lease_id() << ", "
               << response.lease_duration_ms() << " ms)";
  // The router's index of this worker starts empty: the next heartbeat
  // carries a snapshot of the whole cache.
  if (options_.prefix_cache_feed != nullptr) {
    options_.prefix_cache_feed->RequestReset(options_.router_address);
  }
  absl::MutexLock lock(&mutex_);
  lease_id_ = response.lease_id();
  heartbeat_interval_ = absl::Milliseconds(
      std::max<uint32_t>(response.heartbeat_interval_ms(), 10));
  return true;
}

void MembershipClient::SendHeartbeat() {
  const WorkerStatusReport report = options_.report_status();
  v1::HeartbeatRequest request;
  {
    absl::MutexLock lock(&mutex_);
    request.set_lease_id(lease_id_);
  }
  request.set_worker_id(options_.registration.worker_id());
  request.set_state(report.state);
  *request.mutable_load() = report.load;
  request.set_inflight_requests(report.inflight_requests);
  // Kept by the feed until this heartbeat succeeds, so a lost heartbeat
  // loses nothing; a router unreachable for long gets a snapshot instead
  // of an ever-growing backlog.
  PrefixCacheBatch events;
  if (options_.prefix_cache_feed != nullptr) {
    events = options_.prefix_cache_feed->Take(options_.router_address);
  }
  request.set_events_reset(events.events_reset);
  for (const v1::PrefixCacheEvent& e : events.events) {
    *request.add_events() = e;
  }
  grpc::ClientContext context;
  SetDeadline(&context, options_.rpc_timeout);
  v1::HeartbeatResponse response;
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    PD_LOG(WARNING) << "router " << options_.router_address
                    << " forgot our lease; registering again";
    absl::MutexLock lock(&mutex_);
    lease_id_.clear();
    return;
  }
  if (!status.ok()) {
    PD_LOG(WARNING) << "heartbeat to router " << options_.router_address
                    << " failed: " << rpc::FromGrpcStatus(status);
    return;
  }
  if (options_.prefix_cache_feed != nullptr) {
    options_.prefix_cache_feed->Delivered(options_.router_address, events);
  }
  for (const v1::WorkerCommand& command : response.commands()) {
    if (command.kind() == v1::WorkerCommand::KIND_DRAIN) {
      options_.on_drain(absl::Milliseconds(command.drain_deadline_ms()));
    }
  }
}

}  // namespace pdserve::worker
