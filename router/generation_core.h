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
// sampler and text state). A client that
// goes away (the sink returns false) cancels the request on every worker.
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
#include "router/routing_policy.h"
#include "router/worker_registry.h"
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
  class Request;
  class WorkerCall;
  struct Outstanding {
    int64_t tokens = 0;
    int32_t sequences = 0;
  };
  // The prompt's token ids, and the text the template rendered (chat).
  absl::StatusOr<std::vector<int32_t>> Encode(const v1::GenerateRequest& r);
  absl::Status Validate(v1::GenerateRequest& request,
                        const std::vector<int32_t>& tokens);
  // Serving workers of `role` for this model, with the prompt's cached
  // prefix on each and this router's outstanding work.
  std::vector<WorkerView> Candidates(v1::WorkerRole role,
                                     absl::Span<const int32_t> tokens);
  // One try of the request (attempt >= 1), continuing after the tokens
  // the client already has. On a worker's failure (UNAVAILABLE) *culprits
  // gets the workers to avoid on the next try.
  absl::Status RunLocal(const v1::GenerateRequest& request,
                        const std::vector<int32_t>& tokens,
                        const WorkerView& worker, uint32_t attempt,
                        absl::Time deadline, Request& state,
                        std::vector<std::string>* culprits);
  absl::Status RunDisaggregated(const v1::GenerateRequest& request,
                                const std::vector<int32_t>& tokens,
                                const WorkerView& prefill,
                                const std::vector<const WorkerView*>& decode,
                                uint32_t attempt, absl::Time deadline,
                                Request& state,
                                std::vector<std::string>* culprits);
  // `workers` without those in `failed`, unless that leaves none.
  static std::vector<WorkerView> Prefer(
      std::vector<WorkerView> workers,
      const absl::flat_hash_set<std::string>& failed);
  // Reads a StartDecode stream into the client's stream.
  absl::Status StreamDecode(const WorkerView& worker,
                            const v1::StartDecodeRequest& start,
                            absl::Time deadline, Request& state);
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
  std::atomic<int32_t> inflight_{0};
  std::atomic<uint64_t> next_request_{1};

  absl::Mutex mu_;
  absl::flat_hash_set<std::string> active_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Outstanding> outstanding_
      ABSL_GUARDED_BY(mu_);
  // Blocking calls in flight, by worker id (see WorkerCall).
  absl::Mutex calls_mu_;
  absl::flat_hash_map<std::string, absl::flat_hash_set<WorkerCall*>> calls_
      ABSL_GUARDED_BY(calls_mu_);
  rpc::StubCache<v1::DecodeWorker> decode_stubs_;
  rpc::StubCache<v1::PrefillWorker> prefill_stubs_;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_GENERATION_CORE_H_
