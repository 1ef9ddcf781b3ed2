// The Generation gRPC service (proto/client.proto): a thin translation to
// ClientApi. Each Generate runs on its own thread (ClientApi::Generate
// blocks for the request's life) and streams through rpc/stream_writer.h;
// a client that cancels makes the sink report it, which cancels the request
// on every worker. RESOURCE_EXHAUSTED carries the trailing metadata entry
// "retry-after-ms". A request without a request_id takes the client's
// x-request-id metadata entry, else a fresh id; the initial metadata
// carries it back in x-request-id.
//
// Ownership: borrows the ClientApi. Thread-safety: as gRPC calls it. The
// destructor waits for running requests' threads (call it after the server
// has shut down, which cancels their streams).
#ifndef PDSERVE_ROUTER_GENERATION_SERVICE_H_
#define PDSERVE_ROUTER_GENERATION_SERVICE_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/client.grpc.pb.h"
#include "router/client_api.h"
#include "router/router_metrics.h"

namespace pdserve::router {

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // `metrics` (null: series nobody exports) records each Generate's end.
  GenerationService(ClientApi* api, absl::Duration default_timeout,
                    absl::Duration retry_after,
                    RouterMetrics* metrics = nullptr)
      : api_(api),
        default_timeout_(default_timeout),
        retry_after_(retry_after),
        metrics_(metrics != nullptr ? metrics : RouterMetrics::Unregistered()) {
  }
  ~GenerationService() override;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(
      grpc::CallbackServerContext* context,
      const v1::ListModelsRequest* request,
      v1::ListModelsResponse* response) override;

 private:
  ClientApi* const api_;
  const absl::Duration default_timeout_;
  const absl::Duration retry_after_;
  RouterMetrics* const metrics_;
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_GENERATION_SERVICE_H_
