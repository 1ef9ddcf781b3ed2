// LlmEngine: requests in, tokens out — the continuous-batching scheduler
// that drives a ModelRunner. It is the decode worker's engine in every mode
// (decoding KV a prefill worker computed, reserved with ReserveTransfer;
// colocated, prefilling too) and pd-generate's offline one.
//
// Each Step() builds one forward pass under a token budget
// (max_batch_tokens), in this order:
//   1. every running sequence that is generating gets its one decode token;
//   2. running sequences still in prefill get their next chunk;
//   3. waiting requests are admitted (prefix-cache lookup first) and given a
//      first chunk, while budget, the running-sequence limit and KV blocks
//      allow.
// When a running sequence needs a KV block and none is free, the most
// recently admitted running sequence is preempted: its blocks are released
// and it goes back to the front of the queue, to be recomputed from its
// prompt plus the tokens it had generated (the prefix cache usually makes
// that cheap). Its sampler keeps its state, so the output stream continues
// exactly where it stopped.
//
// After the pass, every sequence whose uncomputed tokens are all done has
// next-token logits: the engine samples, detokenizes incrementally, applies
// stop strings / stop tokens / max_tokens / the context length, and reports
// the result through the request's callback.
//
// Ownership: borrows the Model; owns the runner. Thread-safety: AddRequest,
// Cancel, ReserveTransfer, ReleaseTransfer and WaitForWork may be called from
// any thread; Step (and RunUntilIdle) from one thread at a time; callbacks
// run on the thread calling Step and must not call back into the engine's
// transfer methods.
#ifndef PDSERVE_ENGINE_LLM_ENGINE_H_
#define PDSERVE_ENGINE_LLM_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/chunk_budget.h"
#include "engine/drafter.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "engine/token_stream.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace pdserve::engine {

using RequestId = int64_t;

// Speculative decoding (engine/drafter.h): a drafter proposes up to
// num_tokens tokens after a decoding sequence's last one, the target
// verifies them in the same forward pass as everything else, and the
// sequence keeps the accepted ones plus one token of the target's own.
// Greedy and seeded output is that of plain decoding for deterministic
// drafts (n-gram; a draft model for greedy requests); a draft model's
// sampled drafts keep the target's distribution (Sampler::SampleVerifying).
struct SpeculativeOptions {
  enum class Method { kNone, kNgram, kDraftModel };
  Method method = Method::kNone;
  // Most tokens drafted per sequence and step (k).
  int32_t num_tokens = 6;
  // Draft length follows the acceptance rate (DraftLength); false drafts
  // num_tokens every step.
  bool adaptive = true;
  // No drafting in a step whose running batch has at least this many
  // sequences (0: no limit). A large batch already fills the hardware: the
  // draft tokens would cost nearly their full compute. vLLM's
  // speculative_disable_by_batch_size.
  int32_t disable_by_batch_size = 0;
  NgramDrafterOptions ngram;
  // kDraftModel: the draft model (borrowed, must outlive the engine; its
  // vocabulary must be the target's) and its KV cache.
  const model::Model* draft_model = nullptr;
  int64_t draft_kv_cache_bytes = int64_t{64} << 20;
};

struct EngineOptions {
  ModelRunnerOptions runner;
  // Most sequences in the running batch at once.
  int32_t max_running = 64;
  SpeculativeOptions speculative;
};

// Why a request's output ended (kNone on every output but the last).
enum class RequestFinish { kNone, kStop, kLength, kCancelled, kError };

struct RequestOutput {
  RequestId id = 0;
  // Tokens generated since the previous output (one, normally; none on a
  // final output after cancellation).
  std::vector<int32_t> token_ids;
  // Log-probabilities of those tokens, when the request asked for them.
  std::vector<SampleResult> logprobs;
  // Text released since the previous output: whole UTF-8 characters only,
  // with anything that could still become a stop string held back.
  std::string text;
  RequestFinish finish = RequestFinish::kNone;
  // On kError, why.
  absl::Status error;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens found in the prefix cache
  int32_t completion_tokens = 0;
  // Set on the first output only: when the request was added, and when the
  // first token was ready (TTFT = first_token_time - arrival_time).
  absl::Time arrival_time;
  absl::Time first_token_time;
  // On a kStop output: the stop_token_ids entry or stop string that matched
  // (both unset for EOS).
  std::optional<uint32_t> stop_token_id;
  std::optional<std::string> stop_string;
  // Generation index of token_ids[0] (tokens generated before it,
  // replayed ones included).
  int32_t generated_offset = 0;
};

struct EngineRequest {
  std::vector<int32_t> prompt;
  // Tokens already generated for this request elsewhere and delivered to
  // the client (a request continuing after its first token was sampled by a
  // prefill worker, or after a migration). They count for penalties,
  // max_tokens and stop strings; their text is never emitted again.
  std::vector<int32_t> generated;
  SamplingParams sampling;
  // Set to the id ReserveTransfer returned when the KV of prompt +
  // generated[0..n-2] has been written into its blocks (and verified):
  // decoding starts at once by feeding generated.back(). Unset: the engine
  // computes prompt + generated itself (prefix cache first).
  std::optional<RequestId> transferred;
  std::function<void(const RequestOutput&)> on_output;
};

// Blocks reserved for KV that another process computes (ReserveTransfer).
struct TransferReservation {
  RequestId id = 0;
  // Leading positions already present from the local prefix cache; the
  // writer sends positions [cached_tokens, tokens.size()).
  int32_t cached_tokens = 0;
  // Block of each position range, in sequence order (cached ones first).
  std::vector<BlockId> blocks;
};

struct EngineStats {
  int32_t waiting = 0;
  int32_t running = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t decode_tokens = 0;
  // Sequences computed in the last step (0 when it ran nothing).
  int32_t last_step_sequences = 0;
  // Speculative decoding: "ngram", "draft_model", or empty when off; draft
  // tokens the target checked (not those after a token that ended the
  // request), and of those the accepted ones.
  std::string spec_method;
  int64_t spec_drafted_tokens = 0;
  int64_t spec_accepted_tokens = 0;
};

class LlmEngine {
 public:
  static absl::StatusOr<std::unique_ptr<LlmEngine>> Create(
      const model::Model& model, const EngineOptions& options);

  // Queues a request. INVALID_ARGUMENT for an empty prompt, a prompt that
  // leaves no room to generate within the context, token ids outside the
  // vocabulary, or invalid sampling parameters.
  absl::StatusOr<RequestId> AddRequest(EngineRequest request)
      ABSL_LOCKS_EXCLUDED(inbox_mu_);
  // Ends the request at the next step with RequestFinish::kCancelled and
  // frees its blocks. Unknown or finished ids are ignored.
  void Cancel(RequestId id) ABSL_LOCKS_EXCLUDED(inbox_mu_);

  // ---- KV computed elsewhere (the decode worker) -------------------------
  // Reserves blocks for the KV of `tokens` (prompt + replayed tokens but
  // the last), reusing the local prefix cache; the reservation then waits
  // for AddRequest with `transferred` set, or ReleaseTransfer. Blocks come
  // from the same pool as running sequences, so reservations and decoding
  // share one accounting. RESOURCE_EXHAUSTED when the blocks are not free
  // now; INVALID_ARGUMENT for empty or over-long token lists.
  absl::StatusOr<TransferReservation> ReserveTransfer(
      absl::Span<const int32_t> tokens)
      ABSL_LOCKS_EXCLUDED(runner_mu_, inbox_mu_);
  // Frees a reservation that will not be decoded. Ignores unknown ids and
  // ids already handed to AddRequest.
  void ReleaseTransfer(RequestId id) ABSL_LOCKS_EXCLUDED(runner_mu_);

  // Blocks until there is work (a queued request or cancel) or `timeout`
  // passes; returns HasWork(). For the loop thread of a server.
  bool WaitForWork(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(inbox_mu_);

  // Runs one scheduling step; returns OK with nothing done when idle. An
  // error from the backend fails the requests of that step (kError) rather
  // than the engine.
  absl::Status Step() ABSL_LOCKS_EXCLUDED(inbox_mu_);
  bool HasWork() const ABSL_LOCKS_EXCLUDED(inbox_mu_);
  // Steps until every queued request has finished.
  absl::Status RunUntilIdle();

  EngineStats stats() const;
  ModelRunner& runner() { return *runner_; }
  const model::Model& model() const { return model_; }

 private:
  struct Request {
    RequestId id = 0;
    std::vector<int32_t> prompt;
    // Owns the generated tokens (stream->generated()).
    std::unique_ptr<TokenStream> stream;
    bool logprobs = false;
    bool transferred = false;
    std::function<void(const RequestOutput&)> on_output;
    absl::Time arrival;
    bool first_output_sent = false;
    int32_t cached_tokens = 0;
    bool in_runner = false;
    // Speculative decoding: set when this request drafts (the engine has a
    // drafter and the request did not opt out), with the draft pending in
    // the runner this step and what it was drawn from.
    std::optional<DraftLength> draft_length;
    std::vector<int32_t> draft;
    std::vector<std::vector<TokenProb>> draft_probs;
  };

  LlmEngine(const model::Model& model, const EngineOptions& options)
      : model_(model), options_(options) {}

  void DrainInbox() ABSL_LOCKS_EXCLUDED(inbox_mu_);
  // Removes the request everywhere and sends its final output.
  void Finish(RequestId id, RequestFinish why, absl::Status error,
              RequestOutput* out);
  // Registers a waiting request with the runner when the blocks of its
  // first chunk (what `budget` leaves it) can be reserved.
  bool Admit(Request& r, const ChunkBudget& budget);
  void Preempt(RequestId id);
  // Removes the request from the runner and the drafter.
  void ReleaseFromRunner(Request& r);
  absl::Status SampleAndEmit(RequestId id, absl::Span<const float> logits);
  // Drafts for every decoding sequence that speculates this step and
  // appends the drafts to the runner (the token budget permitting).
  void ProposeDrafts(int32_t budget);
  // Drops a draft that will not be verified this step.
  void DropDraft(Request& r);
  // Verifies request `id`'s draft against `rows` (one logits row per draft
  // token plus one) and emits the tokens it keeps.
  absl::Status VerifyAndEmit(RequestId id, absl::Span<const float> rows);
  // Reports one chosen token: its output, or the request's end. When the
  // request goes on, `keep` first puts the token into the runner (an error
  // from it fails the request). Returns whether the request goes on.
  bool Emit(RequestId id, absl::StatusOr<StreamStep> step,
            absl::FunctionRef<absl::Status(int32_t token)> keep);

  const model::Model& model_;
  const EngineOptions options_;
  // Held by Step for the whole pass and by the transfer calls: the runner
  // serves one caller at a time.
  mutable absl::Mutex runner_mu_ ABSL_ACQUIRED_BEFORE(inbox_mu_);
  // Callers other than the stepping thread (transfer reservations and
  // releases, transferred requests) that want runner_mu_. absl::Mutex is not
  // fair: a loop that releases it at the end of one step and takes it again
  // for the next wins almost every time, and on a busy decode worker an
  // Admit waited seconds (its request's TTFT, and the router's relay of
  // other streams, with it). Step lets these callers in first.
  std::atomic<int32_t> runner_waiters_{0};
  class RunnerCallerLock;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Drafter> drafter_;  // null: no speculative decoding
  std::vector<uint32_t> eos_ids_;
  // Reservations from ReserveTransfer not yet handed to AddRequest.
  absl::flat_hash_set<RequestId> reserved_ ABSL_GUARDED_BY(runner_mu_);

  mutable absl::Mutex inbox_mu_;
  std::vector<std::unique_ptr<Request>> inbox_ ABSL_GUARDED_BY(inbox_mu_);
  std::vector<RequestId> cancels_ ABSL_GUARDED_BY(inbox_mu_);
  RequestId next_id_ ABSL_GUARDED_BY(inbox_mu_) = 1;
  int64_t pending_ ABSL_GUARDED_BY(inbox_mu_) = 0;  // queued, not finished
  absl::CondVar work_cv_;  // Signalled when requests or cancels arrive.

  // Engine-thread state.
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_;
  std::deque<RequestId> waiting_;
  std::vector<RequestId> running_;  // admission order
  EngineStats stats_;
  // The current step's logits, items and copy of running_, kept so that the
  // scheduling reuses its memory once the largest batch has been seen. (The
  // token streams still allocate as they detokenize and emit; only
  // ModelRunner's steps are held to none, by decode_alloc_test.)
  std::vector<float> step_logits_;
  std::vector<ModelRunner::StepItem> step_items_;
  std::vector<RequestId> running_snapshot_;
  std::vector<DraftJob> draft_jobs_;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_LLM_ENGINE_H_
