// GrpcServer: how every pdserve process serves gRPC.
//
// Wraps grpc::Server with what all three servers (router, prefill worker,
// decode worker) need and must do the same way:
//   - the standard grpc.health.v1 health service (health_service.h),
//     NOT_SERVING until the owner calls SetServing(true) (so probes and the
//     router only see a process once it can take work), and NOT_SERVING
//     again on drain; "pdserve.liveness" stays SERVING throughout;
//   - gRPC server reflection, so grpcurl-style tools can list and call
//     services without local .proto files;
//   - binding to port 0 picks a free port, reported by port().
//
// Ownership: services are not owned and must outlive the server.
// Thread-safety: all methods may be called from any thread.
#ifndef PDSERVE_RPC_SERVER_H_
#define PDSERVE_RPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "grpcpp/support/config.h"
#include "rpc/health_service.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace pdserve::rpc {

struct GrpcServerOptions {
  // host:port to listen on; port 0 lets the OS choose a free one.
  std::string listen_address = "127.0.0.1:0";
  // Services to register (sync, async or callback). Not owned.
  std::vector<grpc::Service*> services;
  // Largest message accepted or sent, in bytes (prompts can be long).
  int max_message_bytes = 64 << 20;
};

class GrpcServer {
 public:
  // Builds and starts the server. Fails (UNAVAILABLE) when the address cannot
  // be bound, e.g. the port is taken.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const GrpcServerOptions& options);

  ~GrpcServer();  // Shuts down immediately if Shutdown was not called.
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // The port actually bound.
  int port() const { return port_; }
  // host:port that clients on this host can dial.
  const std::string& address() const { return address_; }

  // Sets the readiness status ("") as health probes see it.
  void SetServing(bool serving);

  // Stops accepting calls and waits up to `grace` for in-flight calls, then
  // cancels what is left. Idempotent.
  void Shutdown(absl::Duration grace);

  // Blocks until the server has shut down.
  void Wait();

 private:
  GrpcServer(std::unique_ptr<HealthService> health,
             std::unique_ptr<grpc::Server> server, int port,
             std::string address);

  // Declared before server_: destroyed after it, since the server calls it.
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  const int port_;
  const std::string address_;
};

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_SERVER_H_
