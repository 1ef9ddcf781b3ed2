#include "rpc/server.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"

namespace pdserve::rpc {
namespace {

// The host part of "host:port" ("[::1]:0" -> "[::1]").
std::string HostOf(const std::string& listen_address) {
  const size_t colon = listen_address.rfind(':');
  std::string host = colon == std::string::npos
                         ? listen_address
                         : listen_address.substr(0, colon);
  // A wildcard bind is reachable locally through loopback.
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "[::]") return "[::1]";
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options) {
  // A process-wide switch read when a ServerBuilder is created; calling it
  // again is harmless. gRPC's own health service stays off: ours
  // (health_service.h) starts NOT_SERVING instead of SERVING.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto health = std::make_unique<HealthService>();

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address,
                           grpc::InsecureServerCredentials(), &port);
  // gRPC enables SO_REUSEPORT by default, which lets a second process bind
  // the same port and silently take half the traffic. A taken port must be
  // an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(health.get());
  for (grpc::Service* service : options.services) {
    builder.RegisterService(service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ",
                                               options.listen_address,
                                               " (address in use or invalid)"));
  }
  std::string address = absl::StrCat(HostOf(options.listen_address), ":", port);
  return std::unique_ptr<GrpcServer>(new GrpcServer(
      std::move(health), std::move(server), port, std::move(address)));
}

GrpcServer::GrpcServer(std::unique_ptr<HealthService> health,
                       std::unique_ptr<grpc::Server> server, int port,
                       std::string address)
    : health_(std::move(health)),
      server_(std::move(server)),
      port_(port),
      address_(std::move(address)) {}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(bool serving) { health_->SetServing(serving); }

void GrpcServer::Shutdown(absl::Duration grace) {
  // Open health Watch streams would otherwise hold shutdown for `grace`.
  health_->Shutdown();
  // grpc::Server::Shutdown is itself idempotent and thread-safe.
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(grace));
}

void GrpcServer::Wait() { server_->Wait(); }

}  // namespace pdserve::rpc
