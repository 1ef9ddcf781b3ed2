// TokenStream: one request's output side, from next-token logits to the
// tokens and text a client sees.
//
// It bundles what turns logits into a stream: the Sampler (seeded per step,
// penalties over the generated tokens), the stop-token / max_tokens /
// context checks, incremental detokenization and stop-string hold-back. The
// offline engine, the prefill worker (which samples a request's first
// token) and the decode worker (which continues it) all use it, so a request
// produces the same tokens and the same text deltas wherever each step runs.
//
// Replay: a stream created with `generated` tokens (a request continuing on
// another worker after its first token, or after a migration) starts in
// exactly the state it would have after producing them itself: penalties
// count them, the next draw is step generated.size(), and the text already
// released for them is not released again (the released text is a
// deterministic function of the tokens, so both workers agree on it).
// Replayed tokens that already ended the request (a stop token or string,
// max_tokens, which counts them) are refused: there is nothing to continue.
//
// Ownership: borrows the tokenizer, which must outlive the stream.
// Thread-safety: none; a stream belongs to one request.
#ifndef PDSERVE_ENGINE_TOKEN_STREAM_H_
#define PDSERVE_ENGINE_TOKEN_STREAM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "model/tokenizer.h"

namespace pdserve::engine {

struct TokenStreamOptions {
  const model::Tokenizer* tokenizer = nullptr;
  SamplingParams sampling;
  // Tokens that end generation unless sampling.ignore_eos.
  std::vector<uint32_t> eos_ids;
  // Prompt length + generated tokens may not exceed this.
  uint32_t context_length = 0;
  int32_t vocab_size = 0;
};

// What one step produced.
struct StreamStep {
  int32_t token = 0;
  // Set when sampling.logprobs.
  std::optional<SampleResult> logprob;
  // Text released by this token (may be empty while held back). On the
  // final step it includes everything held back, up to a stop string.
  std::string text;
  // kNone: keep generating (the caller computes this token's KV next).
  FinishReason finish = FinishReason::kNone;
  // For kStop: the stop_token_ids entry or the stop string that matched
  // (both unset for an EOS token).
  std::optional<uint32_t> stop_token_id;
  std::optional<std::string> stop_string;
};

class TokenStream {
 public:
  // INVALID_ARGUMENT for invalid sampling parameters or token ids outside
  // the vocabulary.
  static absl::StatusOr<std::unique_ptr<TokenStream>> Create(
      const TokenStreamOptions& options, absl::Span<const int32_t> prompt,
      absl::Span<const int32_t> generated = {});

  // Samples the next token from `logits` (vocab_size floats) and applies
  // every stop condition.
  absl::StatusOr<StreamStep> Next(absl::Span<const float> logits);
  // The same for a step where a drafter proposed `draft` (speculative
  // decoding; see Sampler::SampleVerifying, which chooses the token):
  // *accepted says whether the token is the draft.
  absl::StatusOr<StreamStep> NextVerifying(
      absl::Span<const float> logits, int32_t draft,
      absl::Span<const TokenProb> draft_probs, bool* accepted);
  // The sampling parameters and seed in use (a draft model samples with
  // them).
  const SamplingParams& sampling() const { return sampler_->params(); }
  uint64_t seed() const { return sampler_->seed(); }

  const std::vector<int32_t>& generated() const { return generated_; }

 private:
  TokenStream(const TokenStreamOptions& options, Sampler sampler,
              int32_t prompt_length);
  // Records a chosen token and applies every stop condition.
  absl::StatusOr<StreamStep> Emit(SampleResult sampled);
  // Feeds one token's text through detokenization and stop strings.
  StopChecker::FeedResult FeedText(int32_t token);

  std::optional<Sampler> sampler_;
  StopTokenChecker stop_tokens_;
  StopChecker stop_;
  model::IncrementalDetokenizer detok_;
  std::vector<int32_t> generated_;
  const int32_t prompt_length_;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_TOKEN_STREAM_H_
