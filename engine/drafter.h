// Drafter: proposes tokens for speculative decoding, which the target model
// then verifies in one forward pass (LlmEngine; the rule that keeps the
// output exact is Sampler::SampleVerifying).
//
// Decode is memory-bound: a pass over k + 1 tokens of one sequence reads the
// weights once, like a pass over one, so every accepted draft token is a
// step saved. Two drafters:
//   - NgramDrafter (prompt lookup): the continuation of the most recent
//     earlier occurrence of the sequence's last n tokens. No model, no
//     state; strong where the output copies its input (code editing,
//     summaries that quote).
//   - DraftModelDrafter: a smaller GGUF model sharing the target's
//     tokenizer, with its own paged KV cache, run k steps ahead.
//
// The engine calls Propose once per step for every sequence that
// speculates, then, after verification, Resolve with how many draft tokens
// the sequence kept, and Release when the sequence leaves the runner
// (finished, preempted, cancelled).
//
// Thread-safety: called from the engine's stepping thread only.
#ifndef PDSERVE_ENGINE_DRAFTER_H_
#define PDSERVE_ENGINE_DRAFTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/kv_block_manager.h"
#include "engine/sampler.h"

namespace pdserve::engine {

// One sequence's request for a draft, and the draft.
struct DraftJob {
  // ---- Set by the engine ----
  SeqId id = 0;
  // The sequence so far: prompt, generated tokens, and last the token whose
  // KV the target computes in this step (the draft continues after it).
  absl::Span<const int32_t> tokens;
  int32_t prompt_length = 0;
  // Propose at most this many tokens (> 0).
  int32_t max_tokens = 0;
  // The request's sampling (a draft model samples with its temperature and
  // truncation) and seed, and the generation index of the first draft token.
  const SamplingParams* sampling = nullptr;
  uint64_t seed = 0;
  int64_t step = 0;

  // ---- Set by the drafter ----
  std::vector<int32_t> draft;  // empty: nothing to propose this step
  // Per draft token, the distribution it was drawn from (sparse); empty
  // when the drafter chose deterministically (see SampleVerifying).
  std::vector<std::vector<TokenProb>> probs;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // "ngram" or "draft_model": the label of the drafted/accepted metrics.
  virtual absl::string_view method() const = 0;
  // Fills each job's draft (up to max_tokens; empty is allowed). An error
  // fails the step's speculation only: the engine then decodes plainly.
  virtual absl::Status Propose(absl::Span<DraftJob> jobs) = 0;
  // The sequence kept the first `accepted` tokens of its last draft.
  virtual void Resolve(SeqId id, int32_t accepted) = 0;
  // The sequence left the runner; forget what is kept for it.
  virtual void Release(SeqId id) = 0;
};

struct NgramDrafterOptions {
  // The longest and shortest suffix looked up; longer matches are tried
  // first, and a match shorter than min_ngram proposes nothing.
  // Measured on code editing (bench/spec_decode_bench.cc): 3..6 accepts 92 %
  // of its drafts, 2..4 85 %, and the rejected ones cost a pass's compute.
  int32_t max_ngram = 6;
  int32_t min_ngram = 3;
};

class NgramDrafter : public Drafter {
 public:
  explicit NgramDrafter(const NgramDrafterOptions& options)
      : options_(options) {}
  absl::string_view method() const override { return "ngram"; }
  absl::Status Propose(absl::Span<DraftJob> jobs) override;
  void Resolve(SeqId, int32_t) override {}
  void Release(SeqId) override {}

 private:
  const NgramDrafterOptions options_;
};

// The continuation (at most max_tokens) of the most recent earlier
// occurrence of the last n tokens of `tokens`, for n from max_ngram down to
// min_ngram; empty when none occurs. Exposed for tests.
std::vector<int32_t> PromptLookup(absl::Span<const int32_t> tokens,
                                  int32_t max_tokens, int32_t min_ngram,
                                  int32_t max_ngram);

// How many tokens a sequence drafts next, from how its drafts fared: one
// more after a draft was accepted whole, one more than was accepted after a
// partial one. A sequence whose acceptance rate (exponential average) falls
// below `min_acceptance` pauses drafting for `pause_steps` steps, then tries
// a single token again, so a workload speculation cannot help (plain chat)
// pays for one token in the pass now and then, not every step.
struct DraftLengthOptions {
  int32_t max_tokens = 4;
  bool adaptive = true;
  double min_acceptance = 0.3;
  int32_t pause_steps = 16;
};

class DraftLength {
 public:
  explicit DraftLength(const DraftLengthOptions& options)
      : options_(options), next_(options.max_tokens) {}
  // Tokens to draft this step (0: plain decode this step). Counts a step.
  int32_t Next();
  // A verification of `drafted` tokens kept `accepted` of them.
  void Record(int32_t drafted, int32_t accepted);

 private:
  DraftLengthOptions options_;
  int32_t next_;
  double acceptance_ = 1.0;  // optimistic start
  int32_t paused_for_ = 0;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_DRAFTER_H_
