// GenerationCore: the router's serving path, behind both front ends
// (ClientApi). For each request it validates, applies the chat template and
// tokenizes, picks workers (RoutingPolicy over the WorkerRegistry), and runs
// the request's life:
//
//   disaggregated:  DecodeWorker.Admit (blocks reserved first; the next
//                   decode candidate is tried when one has no room)
//                -> PrefillWorker.Prefill (KV pushed layer by layer into
//                   those blocks; returns the first token, streamed to the
//                   client at once)
//                -> DecodeWorker.StartDecode (streams the rest)
//   local prefill:  DecodeWorker.StartDecode with the prompt (conditional
//                   disaggregation, colocated workers)
//
// Every path ends with the admission used, released, or cancelled, so no
// worker keeps blocks for a request the router gave up on. A worker that
// fails (UNAVAILABLE: unreachable, died, transfer failed) is avoided for the
// rest of the request, which is retried elsewhere before its first token,
// or migrated after it: the prompt plus the tokens the client already has
// are prefilled again on another pair and the stream continues with the
// next token, none lost or repeated (engine::TokenStream replays the
// sampler and text state). A client that goes away (the sink returns false)
// cancels the request on every worker.
//
// generation_core.cc holds the request's life (encoding, validation, the
// choice of workers, retries and migrations); generation_attempt.cc one try
// of it on the workers, step by step.
//
// Each Generate runs on its caller's thread, using blocking gRPC client
// calls (the front ends give each request its own thread); at most
// max_inflight requests run at once, the rest are refused with
// RESOURCE_EXHAUSTED.
//
// Thread-safety: thread-safe.
#ifndef PDSERVE_ROUTER_GENERATION_CORE_H_
#define PDSERVE_ROUTER_GENERATION_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "model/model_text.h"
#include "proto/worker.grpc.pb.h"
#include "router/client_api.h"
#include "router/request_stream.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_calls.h"
#include "router/worker_registry.h"
#include "rpc/cluster_credential.h"
#include "rpc/stub_cache.h"

namespace pdserve::router {

struct GenerationCoreOptions {
  // The model id clients name and workers register (ModelInfo.id).
  std::string model_id;
  // Requests running at once; more are refused (RESOURCE_EXHAUSTED).
  int32_t max_inflight = 256;
  // Suggested client wait after a RESOURCE_EXHAUSTED.
  absl::Duration retry_after = absl::Seconds(1);
  // Longest admission a decode worker is asked to hold for a prefill.
  absl::Duration reservation_timeout = absl::Seconds(120);
  // A worker's failure before the first token is retried on another worker
  // this many times; after tokens were sent, the stream migrates (prompt +
  // sent tokens re-prefilled elsewhere) at most max_migrations times. Then
  // the request fails with INTERNAL.
  int32_t max_prefill_retries = 2;
  int32_t max_migrations = 2;
  // Wait before a retry, doubled each time (at most 2 s).
  absl::Duration retry_backoff = absl::Milliseconds(50);
  // When no worker has room for a request (no decode worker with free KV
  // blocks for it, or a full prefill queue: RESOURCE_EXHAUSTED from the
  // workers), the request waits (as a scheduler's waiting queue holds it)
  // this long at most, trying again every 50 ms to 500 ms, before
  // RESOURCE_EXHAUSTED. The queue is bounded by max_inflight. Zero: refused
  // at once.
  absl::Duration capacity_wait = absl::Seconds(30);
  // Where requests are recorded; null records to series nobody exports
  // (RouterMetrics::Unregistered). Not owned.
  RouterMetrics* metrics = nullptr;
  // Presented on every call to a worker (rpc/cluster_credential.h); auth off
  // by default.
  rpc::ClusterCredential credential;
};

class GenerationCore : public ClientApi {
 public:
  // `model` supplies the tokenizer and chat template (the same file the
  // workers serve; its name must match theirs). Borrows all three.
  GenerationCore(const model::ModelText* model, WorkerRegistry* registry,
                 RoutingPolicy* policy, const GenerationCoreOptions& options);
  ~GenerationCore() override;

  absl::Status Generate(v1::GenerateRequest request, absl::Time deadline,
                        const ChunkSink& sink,
                        CancelToken* cancel = nullptr) override;
  absl::StatusOr<v1::TokenizeResponse> Tokenize(
      const v1::TokenizeRequest& request) override;
  absl::StatusOr<v1::ListModelsResponse> ListModels() override;
  absl::Status CheckReady() override;

  // Cuts the calls in flight to these workers (their lease ran out: dead,
  // hung or cut off); each ends as UNAVAILABLE, so its request is retried
  // or migrated instead of waiting for a worker that may never answer.
  void WorkersLost(const std::vector<std::string>& worker_ids);

 private:
  struct Outstanding {
    int64_t tokens = 0;
    int32_t sequences = 0;
  };
  // One try of a request (number >= 1) on the workers its route chose.
  struct Attempt {
    const v1::GenerateRequest& request;
    const std::vector<int32_t>& tokens;  // The prompt.
    uint32_t number;
    absl::Time deadline;
    RequestStream& state;
    // The tokens the client already had when the try began (a migration):
    // the workers compute prompt + these and continue after them.
    std::vector<uint32_t> replayed;
    // On a worker's failure (UNAVAILABLE): the workers to avoid on the
    // next try.
    std::vector<std::string>* culprits;
  };
  // The decode worker holding blocks for a disaggregated try, and where the
  // prefill worker writes the KV.
  struct Admission {
    const WorkerView* decoder = nullptr;
    v1::KvTransferTarget target;
  };

  // The request's tries, until one succeeds or the request's own error,
  // the client going away or too many failures end it.
  absl::Status Serve(const v1::GenerateRequest& request,
                     const std::vector<int32_t>& tokens, absl::Time deadline,
                     RequestStream& state, CancelToken* cancel);
  // The prompt's token ids (chat: rendered with the chat template).
  absl::StatusOr<std::vector<int32_t>> Encode(const v1::GenerateRequest& r);
  absl::Status Validate(v1::GenerateRequest& request,
                        const std::vector<int32_t>& tokens);
  // Counts the request against max_inflight and claims its id; the
  // RESOURCE_EXHAUSTED or ALREADY_EXISTS when it cannot run.
  absl::Status TakeInflightSlot(const std::string& id);
  void ReleaseInflightSlot(const std::string& id);
  // After a try failed with `status` (UNAVAILABLE): OK to try again, after
  // the backoff, or the error that ends the request (too many tries, the
  // deadline, the client gone). `retries` counts the tries so far.
  absl::Status PrepareRetry(const Attempt& failed_try,
                            const absl::Status& status, int& retries,
                            CancelToken* cancel);
  // After a try found no worker with room (`status`, RESOURCE_EXHAUSTED):
  // OK after a pause, to try again, or the error that
  // ends the request: RESOURCE_EXHAUSTED once capacity_wait (from the first
  // such try, recorded in `waiting_since`) is spent, CANCELLED when the
  // client goes away. (A prompt no pool could hold is not retried: decode
  // workers refuse it with INVALID_ARGUMENT.)
  absl::Status WaitForCapacity(const Attempt& failed_try,
                               const absl::Status& status,
                               absl::Time& waiting_since, int& waits,
                               CancelToken* cancel);
  // Serving workers of `role` for this model, with the prompt's cached
  // prefix on each and this router's outstanding work.
  std::vector<WorkerView> Candidates(v1::WorkerRole role,
                                     absl::Span<const int32_t> tokens);
  // `workers` without those in `failed`, unless that leaves none.
  static std::vector<WorkerView> Prefer(
      std::vector<WorkerView> workers,
      const absl::flat_hash_set<std::string>& failed);

  // The paths of one try (generation_attempt.cc).
  absl::Status RunLocal(const Attempt& a, const WorkerView& worker);
  absl::Status RunDisaggregated(const Attempt& a, const WorkerView& prefill,
                                const std::vector<const WorkerView*>& decode);
  // Disaggregated, step 1: blocks on the first decode worker in `decode`
  // with room for them.
  absl::StatusOr<Admission> Admit(const Attempt& a, const WorkerView& prefill,
                                  const std::vector<const WorkerView*>& decode);
  v1::AdmitRequest AdmitRequestFor(const Attempt& a,
                                   const WorkerView& prefill) const;
  // Gives an admission's blocks back; unless `writes_quiesced` (a write may
  // still land) the decode worker quarantines them first.
  void Release(const Admission& admission, const std::string& request_id,
               bool writes_quiesced, const std::string& why);
  // Step 2: the prefill, its KV pushed into the admitted blocks. Returns the
  // first token.
  absl::StatusOr<v1::PrefillResponse> Prefill(const Attempt& a,
                                              const WorkerView& prefill,
                                              const Admission& admission);
  // Cleans up after a failed prefill and says why the try failed.
  absl::Status PrefillFailed(const Attempt& a, const WorkerView& prefill,
                             const Admission& admission,
                             const absl::Status& prefilled);
  // Step 3: the first token to the client, then the decode worker streams
  // the rest.
  absl::Status DecodeAfterPrefill(const Attempt& a, const Admission& admission,
                                  const v1::PrefillResponse& first);
  // Reads a StartDecode stream into the client's stream.
  absl::Status StreamDecode(const WorkerView& worker,
                            const v1::StartDecodeRequest& start,
                            absl::Time deadline, RequestStream& state);
  v1::DecodeWorker::Stub* DecodeStub(const std::string& address) {
    return decode_stubs_.Get(address);
  }
  v1::PrefillWorker::Stub* PrefillStub(const std::string& address) {
    return prefill_stubs_.Get(address);
  }
  void AddOutstanding(const std::string& worker_id, int64_t tokens,
                      int32_t sequences);

  const model::ModelText* const model_;
  WorkerRegistry* const registry_;
  RoutingPolicy* const policy_;
  const GenerationCoreOptions options_;
  RouterMetrics* const metrics_;
  std::atomic<int32_t> inflight_{0};

  absl::Mutex mu_;
  absl::flat_hash_set<std::string> active_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Outstanding> outstanding_
      ABSL_GUARDED_BY(mu_);
  // Blocking calls in flight, cut when their worker is lost.
  WorkerCalls calls_;
  rpc::StubCache<v1::DecodeWorker> decode_stubs_;
  rpc::StubCache<v1::PrefillWorker> prefill_stubs_;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_GENERATION_CORE_H_
