#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace pdserve::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Candidates ordered most likely first, ties by lowest id: a strict total
// order, so every selection or sort yields the same sequence.
struct MoreLikely {
  template <typename C>
  bool operator()(const C& a, const C& b) const {
    if (a.value != b.value) return a.value > b.value;
    return a.id < b.id;
  }
};

// NaN would poison every comparison and sum; it carries no preference, so it
// becomes the least likely value.
inline float Sanitise(float x) { return std::isnan(x) ? kNegInf : x; }

absl::Status Invalid(absl::string_view field, absl::string_view range,
                     double value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "SamplingParams.", field, " must be ", range, ", got ", value));
}

uint64_t RandomDeviceSeed() {
  std::random_device device;
  uint64_t hi = device();
  uint64_t lo = device();
  return (hi << 32) ^ lo;
}

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p,
                                    int32_t vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be > 0, got ", vocab_size));
  }
  // Written as !(in range) so NaN, which fails every comparison, is out.
  if (!(p.temperature >= 0.0f && std::isfinite(p.temperature))) {
    return Invalid("temperature", "a finite number >= 0 (0 = greedy)",
                   p.temperature);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Invalid("top_p", "in (0, 1]", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return Invalid("min_p", "in [0, 1]", p.min_p);
  }
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty))) {
    return Invalid("repetition_penalty", "a finite number > 0 (1 = off)",
                   p.repetition_penalty);
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return Invalid("presence_penalty", "in [-2, 2]", p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return Invalid("frequency_penalty", "in [-2, 2]", p.frequency_penalty);
  }
  if (p.max_tokens.has_value() && *p.max_tokens == 0) {
    return absl::InvalidArgumentError(
        "SamplingParams.max_tokens must be >= 1 when set (absent means "
        "until the context length), got 0");
  }
  if (p.stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("SamplingParams.stop must hold at most ", kMaxStopStrings,
                     " strings, got ", p.stop.size()));
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SamplingParams.stop[", i,
                       "] is empty; stop strings must be "
                       "non-empty"));
    }
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    if (p.stop_token_ids[i] >= static_cast<uint32_t>(vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SamplingParams.stop_token_ids[", i, "] must be in [0, ",
                       vocab_size, "), got ", p.stop_token_ids[i]));
    }
  }
  if (p.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("SamplingParams.top_logprobs must be in [0, ",
                     kMaxTopLogprobs, "], got ", p.top_logprobs));
  }
  if (p.top_logprobs > 0 && !p.logprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("SamplingParams.top_logprobs = ", p.top_logprobs,
                     " requires logprobs = true"));
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id >= static_cast<uint32_t>(vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SamplingParams.logit_bias key ", id,
          " is not a token id: it must be in [0, ", vocab_size, ")"));
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SamplingParams.logit_bias[", id, "] must be in [-",
                       kMaxLogitBias, ", ", kMaxLogitBias, "], got ", bias));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Randomness.

uint64_t SplitMix64Next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Xoshiro256StarStar::Xoshiro256StarStar(const uint64_t state[4]) {
  for (int i = 0; i < 4; ++i) s_[i] = state[i];
}

Xoshiro256StarStar Xoshiro256StarStar::FromSplitMix64(uint64_t seed) {
  uint64_t state[4];
  // Consecutive splitmix64 outputs are distinct (the output function is a
  // bijection of distinct states), so at most one word is zero and the
  // forbidden all-zero state cannot occur.
  for (uint64_t& word : state) word = SplitMix64Next(&seed);
  return Xoshiro256StarStar(state);
}

uint64_t Xoshiro256StarStar::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double SeededUniform(uint64_t seed, uint64_t step) {
  // Mixing the seed before the XOR keeps (seed, step) and (seed ^ d,
  // step ^ d) from sharing a stream.
  uint64_t state = seed;
  const uint64_t key = SplitMix64Next(&state);
  Xoshiro256StarStar rng = Xoshiro256StarStar::FromSplitMix64(key ^ step);
  return UniformDoubleFromBits(rng.Next());
}

namespace {

// The index at which the running sum of weight(0..n-1) first exceeds
// `target`: one draw from those weights, walked in index order (a function
// of the logits alone) so a given uniform always maps to the same token.
// When rounding leaves target at or past the end, the last positive weight.
template <class Weight>
size_t WalkCumulative(size_t n, double target, const Weight& weight) {
  double cum = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = weight(i);
    if (w > 0.0) last_positive = i;
    cum += w;
    if (target < cum) return i;
  }
  return last_positive;
}

}  // namespace

uint64_t DerivedSeed(uint64_t seed, uint64_t stream) {
  uint64_t state = seed ^ (stream * 0xD1B54A32D192ED03ull);
  return SplitMix64Next(&state);
}

// ---------------------------------------------------------------------------
// Sampler.

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size,
                 uint64_t seed)
    : params_(params), vocab_size_(vocab_size), seed_(seed) {}

absl::StatusOr<Sampler> Sampler::Create(
    const SamplingParams& params, int32_t vocab_size,
    absl::Span<const uint32_t> prompt_ids,
    absl::Span<const uint32_t> generated_ids) {
  PD_RETURN_IF_ERROR(ValidateSamplingParams(params, vocab_size));
  const uint32_t vocab = static_cast<uint32_t>(vocab_size);
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    if (prompt_ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", i, " is ", prompt_ids[i],
                       ", outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  for (size_t i = 0; i < generated_ids.size(); ++i) {
    if (generated_ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("generated token ", i, " is ", generated_ids[i],
                       ", outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  Sampler sampler(params, vocab_size,
                  params.seed.has_value() ? *params.seed : RandomDeviceSeed());
  const bool penalties = sampler.PenaltiesActive();
  bool biased = false;
  for (const auto& [id, bias] : params.logit_bias) biased |= bias != 0.0f;
  if (penalties || biased) {
    sampler.adjusted_bits_.assign((vocab + 63) / 64, 0);
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (bias == 0.0f) continue;
    sampler.adjusted_[id].bias = bias;
    sampler.adjusted_bits_[id >> 6] |= uint64_t{1} << (id & 63);
  }
  if (penalties) {
    for (uint32_t t : prompt_ids) sampler.Record(t, /*in_prompt=*/true);
    for (uint32_t t : generated_ids) sampler.Record(t, /*in_prompt=*/false);
  }
  sampler.num_generated_ = static_cast<int64_t>(generated_ids.size());
  return sampler;
}

bool Sampler::PenaltiesActive() const {
  return params_.repetition_penalty != 1.0f ||
         params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
}

void Sampler::Record(uint32_t token, bool in_prompt) {
  Adjustment& a = adjusted_[token];
  if (in_prompt) {
    a.in_prompt = true;
  } else {
    ++a.generated_count;
  }
  adjusted_bits_[token >> 6] |= uint64_t{1} << (token & 63);
}

absl::Status Sampler::Accept(uint32_t token) {
  if (token >= static_cast<uint32_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("accepted token ", token,
                     " is outside the vocabulary [0, ", vocab_size_, ")"));
  }
  // Without penalties the history is never read, so it is not kept.
  if (PenaltiesActive()) Record(token, /*in_prompt=*/false);
  ++num_generated_;
  return absl::OkStatus();
}

float Sampler::Adjust(float logit, const Adjustment& a) const {
  logit += a.bias;
  // Same formulas and order as vLLM's apply_penalties and llama.cpp's
  // penalties sampler: repetition first, then frequency and presence. A
  // token that is here only for its bias has no history to penalise.
  if (params_.repetition_penalty != 1.0f &&
      (a.in_prompt || a.generated_count > 0)) {
    logit = logit > 0.0f ? logit / params_.repetition_penalty
                         : logit * params_.repetition_penalty;
  }
  if (a.generated_count > 0) {
    logit -= static_cast<float>(a.generated_count) * params_.frequency_penalty +
             params_.presence_penalty;
  }
  return logit;
}

uint32_t Sampler::Greedy(absl::Span<const float> logits,
                         bool* degenerate) const {
  // `v > best` is false for NaN, so NaN logits are skipped without a
  // separate sanitising step; starting from -inf makes -inf never win.
  float best = kNegInf;
  uint32_t best_id = 0;
  bool found = false;
  const uint32_t n = static_cast<uint32_t>(logits.size());
  if (adjusted_bits_.empty()) {
    for (uint32_t i = 0; i < n; ++i) {
      if (logits[i] > best) {
        best = logits[i];
        best_id = i;
        found = true;
      }
    }
  } else {
    for (uint32_t i = 0; i < n; ++i) {
      float v = logits[i];
      if ((adjusted_bits_[i >> 6] >> (i & 63)) & 1) {
        v = Adjust(v, adjusted_.find(i)->second);
      }
      if (v > best) {
        best = v;
        best_id = i;
        found = true;
      }
    }
  }
  *degenerate = !found;
  return found ? best_id : 0;
}

Sampler::Kept Sampler::Prepare(absl::Span<const float> logits) {
  const size_t vocab = logits.size();
  scratch_.resize(vocab);  // Allocates once; later steps reuse capacity.
  Candidate* c = scratch_.data();
  float max = kNegInf;
  size_t n = 0;
  // Impossible (-inf, NaN) candidates are dropped as they are copied, in id
  // order; `!(v > -inf)` catches both.
  if (adjusted_bits_.empty()) {
    for (size_t i = 0; i < vocab; ++i) {
      const float v = logits[i];
      if (!(v > kNegInf)) continue;
      max = std::max(max, v);
      c[n++] = {v, static_cast<uint32_t>(i)};
    }
  } else {
    // Adjustments index by token id, so copy the whole row first.
    for (size_t i = 0; i < vocab; ++i) {
      c[i] = {Sanitise(logits[i]), static_cast<uint32_t>(i)};
    }
    for (const auto& [id, adjustment] : adjusted_) {
      c[id].value = Adjust(c[id].value, adjustment);
    }
    for (size_t i = 0; i < vocab; ++i) {
      if (!(c[i].value > kNegInf)) continue;
      max = std::max(max, c[i].value);
      c[n++] = c[i];
    }
  }
  Kept kept;
  if (n == 0) {
    kept.degenerate = true;
    return kept;
  }
  if (max == kPosInf) {
    // The limit of the softmax: all mass shared equally by the +inf tokens.
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      if (c[i].value == kPosInf) c[m++] = {0.0f, c[i].id};
    }
    n = m;
    max = 0.0f;
  }
  bool sorted = false;

  const uint32_t k = params_.top_k;
  if (k > 0 && k < n) {
    std::nth_element(c, c + k, c + n, MoreLikely());
    std::sort(c, c + k, MoreLikely());
    n = k;
    sorted = true;
  }

  if (params_.top_p < 1.0f && n > 1) {
    // Probabilities at temperature 1 over the current candidates; sort only
    // as far as the mass requires, in chunks growing 4x.
    double z = 0.0;
    for (size_t i = 0; i < n; ++i) z += std::exp(c[i].value - max);
    const double target = double{params_.top_p} * z;
    size_t done = sorted ? n : 0;  // c[0, done) is in final sorted order.
    size_t chunk = 64;
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      if (i == done) {
        const size_t end = std::min(n, done + chunk);
        if (end < n) std::nth_element(c + done, c + end, c + n, MoreLikely());
        std::sort(c + done, c + end, MoreLikely());
        done = end;
        chunk *= 4;
      }
      cum += std::exp(c[i].value - max);
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    // If rounding kept cum below target to the end, every candidate was
    // walked and therefore sorted.
    n = keep;
    sorted = true;
  }

  if (params_.min_p > 0.0f && n > 1) {
    // p_i >= min_p * p_max  <=>  l_i >= l_max + log(min_p); independent of
    // the normalisation, so no softmax is needed.
    const double threshold = double{max} + std::log(double{params_.min_p});
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      if (double{c[i].value} >= threshold) c[m++] = c[i];
    }
    n = m;  // The max itself always passes, so n >= 1.
  }

  kept.size = n;
  kept.max = max;
  return kept;
}

double Sampler::ToWeights(size_t n, float max) {
  Candidate* c = scratch_.data();
  // The exponent in double, so that a tiny temperature scales differences
  // to large but finite values instead of overflowing float; exp itself in
  // float (std::exp(float)), which is plenty for sampling and much cheaper.
  const double t = params_.temperature;
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float w =
        std::exp(static_cast<float>((double{c[i].value} - max) / t));
    c[i].value = w;
    total += w;
  }
  return total;
}

void Sampler::FillLogprobs(absl::Span<const float> logits, uint32_t token,
                           SampleResult* result) const {
  const size_t n_top = std::min<size_t>(params_.top_logprobs, logits.size());
  // One pass for the max, the +inf count and the running top-n (insertion
  // into a sorted array of at most 20 entries).
  struct Entry {
    float value;
    uint32_t id;
  };
  Entry top[kMaxTopLogprobs];
  size_t top_size = 0;
  float max = kNegInf;
  size_t num_pos_inf = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = Sanitise(logits[i]);
    max = std::max(max, v);
    if (v == kPosInf) ++num_pos_inf;
    if (n_top == 0) continue;
    const Entry e{v, static_cast<uint32_t>(i)};
    if (top_size == n_top && !MoreLikely()(e, top[top_size - 1])) continue;
    size_t j = top_size < n_top ? top_size++ : top_size - 1;
    while (j > 0 && MoreLikely()(e, top[j - 1])) {
      top[j] = top[j - 1];
      --j;
    }
    top[j] = e;
  }
  // log_softmax(v) for a sanitised raw logit v.
  double lse = 0.0;
  if (max == kPosInf) {
    lse = std::log(static_cast<double>(num_pos_inf));
  } else if (max != kNegInf) {
    double sum = 0.0;
    for (float x : logits) sum += std::exp(Sanitise(x) - max);
    lse = double{max} + std::log(sum);
  }
  auto logprob = [&](float v) -> float {
    if (max == kPosInf) {
      return v == kPosInf ? static_cast<float>(-lse) : kNegInf;
    }
    // Degenerate rows (all -inf) give -inf for every token.
    if (max == kNegInf) return kNegInf;
    return static_cast<float>(double{v} - lse);
  };
  result->logprob = logprob(Sanitise(logits[token]));
  result->top_logprobs.clear();
  result->top_logprobs.reserve(top_size);
  for (size_t i = 0; i < top_size; ++i) {
    result->top_logprobs.push_back({top[i].id, logprob(top[i].value)});
  }
}

absl::StatusOr<SampleResult> Sampler::Sample(absl::Span<const float> logits,
                                             int64_t step) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits row has ", logits.size(),
                     " entries, the sampler's vocab_size is ", vocab_size_));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation step must be >= 0, got ", step));
  }
  SampleResult result;
  if (params_.temperature == 0.0f) {
    result.token_id = Greedy(logits, &result.degenerate);
  } else {
    const Kept kept = Prepare(logits);
    if (kept.degenerate) {
      result.token_id = 0;
      result.degenerate = true;
    } else if (kept.size == 1) {
      result.token_id = scratch_[0].id;
    } else {
      const double total = ToWeights(kept.size, kept.max);
      const double target =
          SeededUniform(seed_, static_cast<uint64_t>(step)) * total;
      // The running sum repeats ToWeights' additions exactly, so it ends at
      // `total`.
      result.token_id =
          scratch_[WalkCumulative(kept.size, target, [&](size_t i) {
            return double{scratch_[i].value};
          })].id;
    }
  }
  if (params_.logprobs) FillLogprobs(logits, result.token_id, &result);
  return result;
}

absl::StatusOr<SampleResult> Sampler::SampleVerifying(
    absl::Span<const float> logits, int64_t step, uint32_t draft,
    absl::Span<const TokenProb> draft_probs, bool* accepted) {
  *accepted = false;
  if (draft_probs.empty() || params_.temperature == 0.0f) {
    PD_ASSIGN_OR_RETURN(SampleResult result, Sample(logits, step));
    *accepted = result.token_id == draft;
    return result;
  }
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits row has ", logits.size(),
                     " entries, the sampler's vocab_size is ", vocab_size_));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation step must be >= 0, got ", step));
  }
  const Kept kept = Prepare(logits);
  if (kept.degenerate) return Sample(logits, step);  // token 0, flagged
  if (draft_dense_.empty()) draft_dense_.assign(vocab_size_, 0.0);
  for (const TokenProb& q : draft_probs) {
    if (q.token_id < static_cast<uint32_t>(vocab_size_)) {
      draft_dense_[q.token_id] = q.prob;
    }
  }
  const double total = ToWeights(kept.size, kept.max);
  double p_draft = 0.0;
  for (size_t i = 0; i < kept.size; ++i) {
    if (scratch_[i].id == draft) p_draft = scratch_[i].value / total;
  }
  const double q_draft =
      draft < static_cast<uint32_t>(vocab_size_) ? draft_dense_[draft] : 0.0;
  SampleResult result;
  const double u = SeededUniform(seed_, static_cast<uint64_t>(step));
  if (q_draft > 0.0 && u * q_draft < p_draft) {
    *accepted = true;
    result.token_id = draft;
  } else {
    // The residual max(0, p - q), walked in scratch order like Sample.
    auto residual = [&](size_t i) {
      return std::max(0.0,
                      scratch_[i].value / total - draft_dense_[scratch_[i].id]);
    };
    double residual_total = 0.0;
    for (size_t i = 0; i < kept.size; ++i) residual_total += residual(i);
    const double target =
        SeededUniform(DerivedSeed(seed_, 1), static_cast<uint64_t>(step)) *
        residual_total;
    // residual_total == 0 only when p == q (then the draft is always
    // accepted, up to rounding); the walk's fallback is as good a pick.
    result.token_id = scratch_[WalkCumulative(kept.size, target, residual)].id;
  }
  for (const TokenProb& q : draft_probs) {
    if (q.token_id < static_cast<uint32_t>(vocab_size_)) {
      draft_dense_[q.token_id] = 0.0;
    }
  }
  if (params_.logprobs) FillLogprobs(logits, result.token_id, &result);
  return result;
}

absl::StatusOr<std::vector<TokenProb>> Sampler::Distribution(
    absl::Span<const float> logits) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits row has ", logits.size(),
                     " entries, the sampler's vocab_size is ", vocab_size_));
  }
  std::vector<TokenProb> out;
  if (params_.temperature == 0.0f) {
    bool degenerate = false;
    out.push_back({Greedy(logits, &degenerate), 1.0});
    return out;
  }
  const Kept kept = Prepare(logits);
  if (kept.degenerate) {
    out.push_back({0, 1.0});
    return out;
  }
  const double total = ToWeights(kept.size, kept.max);
  out.reserve(kept.size);
  for (size_t i = 0; i < kept.size; ++i) {
    out.push_back({scratch_[i].id, scratch_[i].value / total});
  }
  return out;
}

}  // namespace pdserve::engine
