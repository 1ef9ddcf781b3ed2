// ClientApi: what the router's front ends (gRPC Generation service, OpenAI
// HTTP) ask of the router core. Both front ends translate their wire format
// into these calls, so validation, routing, retries and streaming behave
// the same whichever protocol a client speaks.
//
// Thread-safety: implementations are thread-safe; every method may be called
// from any thread, concurrently.
#ifndef PDSERVE_ROUTER_CLIENT_API_H_
#define PDSERVE_ROUTER_CLIENT_API_H_

#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/client.pb.h"

namespace pdserve::router {

// Lets a front end stop a running Generate from another thread, when it
// learns that the client cancelled or disconnected outside a sink call (a
// gRPC cancel arrives while the request waits for its prefill). Callbacks
// registered by the core (e.g. cancelling an RPC in flight) run on Cancel.
// Thread-safe.
class CancelToken {
 public:
  // Idempotent; runs the registered callbacks once, on this thread.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `fn` on Cancel (at once when already cancelled). Returns an id for
  // Unregister. `fn` must not call back into the token.
  int Register(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // After it returns, the callback is not running and will not run.
  void Unregister(int id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// Receives the chunks of one generation, in order, from one thread at a
// time. Returning false means the client is gone: the core stops the
// request on every worker and Generate returns CANCELLED.
using ChunkSink = std::function<bool(const v1::GenerateResponse& chunk)>;

class ClientApi {
 public:
  virtual ~ClientApi() = default;

  // Runs one generation to its end, blocking the calling thread, and passes
  // every chunk to `sink` as soon as it exists. Returns OK after the last
  // chunk (the one with finish_reason), or the error that ended the request
  // (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED,
  // UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, INTERNAL; see
  // proto/client.proto), possibly after some chunks were sent. `deadline`
  // bounds the whole request; `cancel`, when given, stops it early (the
  // call then returns CANCELLED after stopping the work on every worker).
  virtual absl::Status Generate(v1::GenerateRequest request,
                                absl::Time deadline, const ChunkSink& sink,
                                CancelToken* cancel = nullptr) = 0;

  virtual absl::StatusOr<v1::TokenizeResponse> Tokenize(
      const v1::TokenizeRequest& request) = 0;

  virtual absl::StatusOr<v1::ListModelsResponse> ListModels() = 0;

  // Whether the cluster can serve a generation now (a decode-capable worker
  // is registered and serving), for /health.
  virtual absl::Status CheckReady() = 0;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_CLIENT_API_H_
