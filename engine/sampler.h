// Sampler: chooses the next token of one sequence from the model's logits,
// following the request's SamplingParams (proto/common.proto, message
// SamplingParams, whose semantics the plain struct below carries exactly; the
// serving layer converts the proto into it and this file has no proto
// dependency).
//
// Pipeline for one step (the llama.cpp sampler-chain order, which vLLM
// matches for these knobs):
//   1. sanitise: NaN logits count as -inf;
//   2. logit bias: logit_bias[id] is added to the logit of token id (first,
//      as in llama.cpp's chain and vLLM's logits processors, so that the
//      penalties below see the biased value);
//   3. penalties: repetition (prompt and generated tokens), then frequency
//      and presence (generated tokens only);
//   4. temperature == 0: greedy argmax over the adjusted logits (ties go to
//      the lowest token id); stop here;
//   5. top-k, 6. top-p, 7. min-p, each on the adjusted logits at
//      temperature 1 (top-p and min-p see the distribution renormalised over
//      the tokens the previous steps kept);
//   8. temperature, 9. softmax, 10. one draw.
// "Adjusted" below means after steps 1-3. Ties inside top-k / top-p are
// broken by the lowest token id: candidates are ordered by (adjusted logit
// descending, token id ascending), a strict total order, so the kept set
// never depends on the sort algorithm.
//
// A bias is added, not imposed: -inf (and NaN) stays impossible whatever its
// bias, and +inf wins whatever its bias. With the model's logits spanning
// a few tens, +100 makes a token all but certain and -100 all but bans it,
// which is what OpenAI's logit_bias documents.
//
// Logprobs are the log-softmax of the *raw* model logits (NaN as -inf),
// before logit bias, penalties, temperature and truncation: vLLM's default
// "raw logprobs" and what TokenLogprob.logprob in the proto promises. They
// describe what the model thinks, independent of how the client samples.
//
// Reproducibility. The draw at generation step i uses one uniform double
// from a xoshiro256** generator seeded, through splitmix64, from (seed, i)
// only (SeededUniform below spells out the exact recipe), so a request that
// migrates to another decode worker at step i draws the same number there.
// No std:: distribution is used (their output differs between standard
// libraries). Everything after the draw is a deterministic function of the
// logits, so the same binary picks the same token on any machine; across
// builds the token can only differ if libm's exp() rounds differently and a
// draw lands within that rounding of a bucket boundary. Without a seed, the
// sampler takes one seed from std::random_device at creation and uses the
// same recipe.
//
// Non-finite logits. NaN counts as -inf. +inf logits (or adjusted logits
// that overflow to +inf) win outright: the candidates become exactly the
// +inf tokens, with equal probability. If every logit is -inf/NaN there is
// no meaningful choice: Sample falls back to token 0 and sets
// SampleResult::degenerate so the caller can log or fail the request.
//
// Cost per step. Greedy is a single pass over the logits (plus the
// O(n_logprobs) extras when logprobs are requested). Sampling uses one
// scratch buffer of vocab_size entries, allocated on the first non-greedy
// step and reused afterwards; top-p sorts only as many candidates as it
// needs (in growing chunks). Bias and penalty bookkeeping is proportional to
// the number of biased or distinct seen tokens, not to the vocabulary.
//
// Ownership: a Sampler owns copies of its parameters and token history.
// Thread-safety: none; one Sampler belongs to one sequence and is used by one
// thread at a time (it is movable, e.g. into the sequence's state).
#ifndef PDSERVE_ENGINE_SAMPLER_H_
#define PDSERVE_ENGINE_SAMPLER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pdserve::engine {

// Mirrors pdserve.v1.SamplingParams field by field; defaults are the proto's
// documented values for absent fields. Ranges are checked by
// ValidateSamplingParams, not here.
struct SamplingParams {
  // Softmax temperature, >= 0 and finite; 0 means greedy.
  float temperature = 1.0f;
  // Keep only the k most likely tokens; 0 disables (so does k >= vocab).
  uint32_t top_k = 0;
  // Nucleus sampling mass in (0, 1]; 1 disables.
  float top_p = 1.0f;
  // Relative probability floor in [0, 1]; 0 disables.
  float min_p = 0.0f;
  // > 0 and finite; 1 disables. Positive logits of tokens in the prompt or
  // the generated text are divided by it, negative ones multiplied.
  float repetition_penalty = 1.0f;
  // [-2, 2]; subtracted once from every token present in the generated text.
  float presence_penalty = 0.0f;
  // [-2, 2]; subtracted once per occurrence in the generated text.
  float frequency_penalty = 0.0f;
  // Absent: nondeterministic.
  std::optional<uint64_t> seed;
  // Absent: until the context is full. 0 is invalid.
  std::optional<uint32_t> max_tokens;
  // At most 16, each non-empty.
  std::vector<std::string> stop;
  // Extra token ids that end generation; each < vocab_size.
  std::vector<uint32_t> stop_token_ids;
  // When true, the model's EOS tokens do not end generation.
  bool ignore_eos = false;
  // When true, every sampled token carries its logprob.
  bool logprobs = false;
  // Alternatives per token, 0..20; > 0 requires logprobs.
  uint32_t top_logprobs = 0;
  // Token id (< vocab_size) -> bias in [-100, 100], added to that token's
  // logit before the penalties. Ordered so that validation always names the
  // same offending entry.
  std::map<uint32_t, float> logit_bias;
  // When true, the engine never drafts for this request (speculative
  // decoding off for it; the sampler itself ignores this field).
  bool disable_speculation = false;
};

// Limits from the proto comments, exported for error messages elsewhere.
inline constexpr int kMaxStopStrings = 16;
inline constexpr uint32_t kMaxTopLogprobs = 20;
inline constexpr float kMaxLogitBias = 100.0f;

// OK, or INVALID_ARGUMENT whose message names the first offending field, its
// allowed range and the value received. vocab_size (the length of a logits
// row) must be > 0; stop_token_ids and logit_bias keys must lie in
// [0, vocab_size); logit_bias values in [-kMaxLogitBias, kMaxLogitBias].
absl::Status ValidateSamplingParams(const SamplingParams& params,
                                    int32_t vocab_size);

// A token and its raw log-probability.
struct TokenLogprob {
  uint32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  uint32_t token_id = 0;
  // Raw log-softmax of token_id (see the file comment). Computed only when
  // params.logprobs is true; 0 otherwise.
  float logprob = 0.0f;
  // The params.top_logprobs most likely tokens under the raw distribution,
  // most likely first (ties: lowest id first); may include token_id. Empty
  // unless params.logprobs.
  std::vector<TokenLogprob> top_logprobs;
  // True when every logit was NaN or -inf (after bias and penalties) and
  // token 0 was returned by the documented fallback.
  bool degenerate = false;
};

// One entry of the final sampling distribution (see Sampler::Distribution).
struct TokenProb {
  uint32_t token_id = 0;
  double prob = 0.0;
};

class Sampler {
 public:
  // Validates `params` (ValidateSamplingParams) and the token ids (each must
  // be < vocab_size; INVALID_ARGUMENT otherwise). `generated_ids` are tokens
  // already generated for this request (a migrated or resumed sequence), so
  // the penalties continue where they left off.
  static absl::StatusOr<Sampler> Create(
      const SamplingParams& params, int32_t vocab_size,
      absl::Span<const uint32_t> prompt_ids,
      absl::Span<const uint32_t> generated_ids = {});

  Sampler(Sampler&&) = default;
  Sampler& operator=(Sampler&&) = default;
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Chooses the token for generation step `step` (0 for the first generated
  // token; with a seed, the draw depends only on (seed, step)). Does not
  // record the token: call Accept with the token the sequence actually
  // keeps. INVALID_ARGUMENT when logits.size() != vocab_size or step < 0.
  absl::StatusOr<SampleResult> Sample(absl::Span<const float> logits,
                                      int64_t step);

  // Speculative decoding: chooses the token for step `step` when a drafter
  // proposed `draft` there, and sets *accepted when that token is the draft.
  // The token always follows this sampler's distribution exactly (what
  // Sample draws from), whatever the drafter did:
  //   - draft_probs empty: the draft was proposed deterministically (n-gram
  //     lookup, a greedy draft model). The token is exactly the one Sample
  //     would return, and the draft is accepted when they agree. That is
  //     the standard rejection rule for a proposal distribution that puts
  //     all its mass on `draft` (accept with probability p(draft), else draw
  //     from p without `draft`), coupled to Sample's own draw, so greedy and
  //     seeded output are those of plain decoding, token for token, however
  //     many tokens were drafted.
  //   - draft_probs given: the draft was drawn from that distribution q
  //     (sparse; absent tokens have q = 0). The standard rule (Leviathan et
  //     al. 2023, Chen et al. 2023): accept with probability
  //     min(1, p(draft) / q(draft)), else draw from max(0, p - q)
  //     normalised. Both draws are seeded by (seed, step) like Sample's, so
  //     seeded runs are reproducible. At temperature 0 it is the greedy case
  //     above.
  // Does not record the token (call Accept). Errors as Sample.
  absl::StatusOr<SampleResult> SampleVerifying(
      absl::Span<const float> logits, int64_t step, uint32_t draft,
      absl::Span<const TokenProb> draft_probs, bool* accepted);

  // Appends `token` to the generated text (affects later penalties).
  // INVALID_ARGUMENT when token >= vocab_size.
  absl::Status Accept(uint32_t token);

  // The distribution Sample draws from at temperature > 0: the kept
  // candidates with their probabilities (summing to 1), in the order the
  // draw walks them. For temperature == 0, the single greedy token with
  // probability 1; for degenerate logits, token 0 with probability 1. Meant
  // for tests, debugging and (later) speculative-decoding acceptance.
  // INVALID_ARGUMENT when logits.size() != vocab_size.
  absl::StatusOr<std::vector<TokenProb>> Distribution(
      absl::Span<const float> logits);

  const SamplingParams& params() const { return params_; }
  int32_t vocab_size() const { return vocab_size_; }
  // Number of tokens passed to Create as generated plus those Accepted.
  int64_t num_generated() const { return num_generated_; }
  // The seed in use (params.seed, or the one drawn at creation).
  uint64_t seed() const { return seed_; }

 private:
  // What changes one token's logit (steps 2 and 3 of the pipeline).
  struct Adjustment {
    // logit_bias entry; 0 when the token has none.
    float bias = 0.0f;
    // Penalty history, kept only when penalties are active.
    bool in_prompt = false;
    int32_t generated_count = 0;
  };
  // A candidate in the scratch buffer. `value` is the (adjusted) logit
  // while truncating and becomes the unnormalised probability in ToWeights,
  // so one vocab-sized buffer serves the whole step.
  struct Candidate {
    float value;
    uint32_t id;
  };
  // What Prepare leaves in scratch_[0, size): the kept candidates, in id
  // order (nothing sorted them) or in (logit desc, id asc) order (top-k or
  // top-p did); both orders are functions of the logits alone.
  struct Kept {
    size_t size = 0;
    // Largest kept logit (0 when +inf logits took over).
    float max = 0.0f;
    // Every logit was -inf/NaN; scratch_ holds nothing useful.
    bool degenerate = false;
  };

  Sampler(const SamplingParams& params, int32_t vocab_size, uint64_t seed);

  bool PenaltiesActive() const;
  void Record(uint32_t token, bool in_prompt);
  // Steps 2 and 3 for one token's logit.
  float Adjust(float logit, const Adjustment& adjustment) const;
  // Single-pass argmax over sanitised, adjusted logits; lowest id on ties.
  // Sets *degenerate (and returns 0) when nothing is above -inf.
  uint32_t Greedy(absl::Span<const float> logits, bool* degenerate) const;
  // Pipeline steps 1, 2, 3, 5, 6 and 7 into scratch_.
  Kept Prepare(absl::Span<const float> logits);
  // Replaces the kept logits by exp((l - max) / T) and returns their sum.
  double ToWeights(size_t n, float max);
  void FillLogprobs(absl::Span<const float> logits, uint32_t token,
                    SampleResult* result) const;

  SamplingParams params_;
  int32_t vocab_size_ = 0;
  uint64_t seed_ = 0;
  int64_t num_generated_ = 0;
  // Every token with a nonzero logit_bias, and, when penalties are active,
  // every token seen in the prompt or the generated text (without
  // penalties nothing reads the history, so it is not kept).
  absl::flat_hash_map<uint32_t, Adjustment> adjusted_;
  // Bit per vocabulary entry: set when the token is in adjusted_. Empty when
  // nothing can be adjusted; lets greedy skip hash lookups for the rest.
  std::vector<uint64_t> adjusted_bits_;
  // Reused across steps; sized vocab_size on first non-greedy use.
  std::vector<Candidate> scratch_;
  // SampleVerifying's draft probabilities by token id; all zero between
  // calls. Sized vocab_size on first use.
  std::vector<double> draft_dense_;
};

// The exact, portable randomness recipe (exposed so other implementations,
// e.g. a GPU sampler or a test oracle, can reproduce it):
//   k = SplitMix64Next(&seed_state) with seed_state = seed (first splitmix64
//       output for `seed`);
//   s = k ^ step; the xoshiro256** state is the next four outputs of
//       splitmix64 started at state s;
//   the uniform is (first xoshiro256** output >> 11) * 2^-53, in [0, 1).
double SeededUniform(uint64_t seed, uint64_t step);

// The seed of a second, independent stream of draws for the same request
// (speculative decoding's residual draw and a draft model's own draws use
// DerivedSeed(seed, 1) and DerivedSeed(seed, 2) with SeededUniform).
uint64_t DerivedSeed(uint64_t seed, uint64_t stream);

// splitmix64 (Vigna): advances *state by the golden gamma and returns the
// mixed value.
uint64_t SplitMix64Next(uint64_t* state);

// xoshiro256** 1.0 (Blackman & Vigna).
class Xoshiro256StarStar {
 public:
  // State words taken verbatim (must not all be zero).
  explicit Xoshiro256StarStar(const uint64_t state[4]);
  // State words from four splitmix64 outputs starting at `seed`.
  static Xoshiro256StarStar FromSplitMix64(uint64_t seed);
  uint64_t Next();

 private:
  uint64_t s_[4];
};

// Top 53 bits of `bits` as a double in [0, 1).
inline double UniformDoubleFromBits(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_SAMPLER_H_
