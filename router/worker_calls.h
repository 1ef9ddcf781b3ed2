// Blocking calls from the router to prefill and decode workers, made on a
// client's behalf. A call must end when the request's deadline passes, when
// the client goes away (CancelScope) and when the worker loses its lease
// (WorkerCalls: a hung worker keeps its connection open and would otherwise
// hold the request until its deadline). A worker may also be asked to drop
// what it holds for one attempt (CancelAttempt), and its errors are turned
// into the request's (WorkerError). Kept apart from GenerationCore so the
// request's life there reads without the call plumbing.
//
// Thread-safety: the free functions and WorkerCalls are thread-safe; a
// CancelScope or a WorkerCalls::Call belongs to the thread making the call.
#ifndef PDSERVE_ROUTER_WORKER_CALLS_H_
#define PDSERVE_ROUTER_WORKER_CALLS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "proto/worker.pb.h"
#include "router/client_api.h"

namespace pdserve::router {

// Sets `deadline` on `context` unless it is infinite (gRPC's default).
void SetDeadline(grpc::ClientContext* context, absl::Time deadline);

// A worker's error as the client should see it. The request's own problems
// keep their code: bad input, no room, cancelled, and a deadline that has
// passed. Anything else is the worker failing and becomes UNAVAILABLE, which
// the router retries elsewhere; so does a DEADLINE_EXCEEDED before the
// request's `deadline` (a KV transfer that stalled past its reservation).
absl::Status WorkerError(absl::string_view what, const absl::Status& status,
                         absl::Time deadline);

// Best-effort Cancel of one attempt of a request on a worker (DecodeWorker
// or PrefillWorker stub), bounded by a short deadline.
// Returns whether the worker had (or may have had: no answer) something for
// the attempt. `writes_quiesced`: no writer was ever given its KV target.
template <typename Stub>
bool CancelAttempt(Stub* stub, const std::string& request_id, uint32_t attempt,
                   bool writes_quiesced = false) {
  v1::CancelRequest cancel;
  cancel.set_request_id(request_id);
  cancel.set_attempt(attempt);
  cancel.set_reason(v1::CANCEL_REASON_ROUTER);
  cancel.set_writes_quiesced(writes_quiesced);
  grpc::ClientContext context;
  SetDeadline(&context, absl::Now() + absl::Seconds(2));
  v1::CancelResponse response;
  return !stub->Cancel(&context, cancel, &response).ok() || response.found();
}

// Cancels `context` if `token` fires while the scope lives (a blocking RPC
// made on behalf of a client that may cancel meanwhile). `token` may be null.
class CancelScope {
 public:
  CancelScope(CancelToken* token, grpc::ClientContext* context);
  ~CancelScope();

  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  CancelToken* const token_;
  int id_ = 0;
};

// The blocking calls in flight, by worker id, so that those to a worker
// that lost its lease can be cut (TryCancel).
class WorkerCalls {
 public:
  // One blocking call to one worker, listed for its scope's life.
  class Call {
   public:
    Call(WorkerCalls* calls, const std::string& worker_id,
         grpc::ClientContext* context);
    ~Call();

    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    // `status`, or UNAVAILABLE naming the worker when the call was cut (a
    // call that succeeded before the cut stands).
    absl::Status Check(absl::Status status) const;

   private:
    friend class WorkerCalls;
    // Called with the owner's mu_ held.
    void Cut();

    WorkerCalls* const calls_;
    const std::string worker_id_;
    grpc::ClientContext* const context_;
    std::atomic<bool> lost_{false};
  };

  // Cuts every call in flight to `worker_id`; each ends as UNAVAILABLE.
  void Cut(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::flat_hash_set<Call*>> calls_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_WORKER_CALLS_H_
