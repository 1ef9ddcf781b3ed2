// HealthService: pdserve's implementation of grpc.health.v1.
//
// gRPC's built-in health service reports SERVING from the moment the server
// starts, before a worker is ready; ours starts NOT_SERVING and follows
// SetServing, so readiness probes and the router never see a process before
// it can take work. It answers for two names:
//   ""                  readiness: SERVING only while the process takes new
//                       work (NOT_SERVING before start-up ends and while
//                       draining);
//   "pdserve.liveness"  liveness: SERVING as long as the process runs, so a
//                       Kubernetes liveness probe does not kill a pod that is
//                       draining.
// Any other name is NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch).
//
// Thread-safety: all methods are thread-safe. Shutdown() ends open Watch
// streams so server shutdown does not wait for them.
#ifndef PDSERVE_RPC_HEALTH_SERVICE_H_
#define PDSERVE_RPC_HEALTH_SERVICE_H_

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace pdserve::rpc {

inline constexpr char kLivenessService[] = "pdserve.liveness";

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  HealthService() = default;
  ~HealthService() override;

  void SetServing(bool serving);
  void Shutdown();

  grpc::ServerUnaryReactor* Check(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request,
      grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  friend class Watcher;

  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status StatusOf(const std::string& service)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  absl::Mutex mutex_;
  bool serving_ ABSL_GUARDED_BY(mutex_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mutex_) = false;
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_HEALTH_SERVICE_H_
