// The sampler's checks and randomness: parameter validation, the seeded
// random recipe, greedy decoding, seeds, and that sampled frequencies match
// the softmax. What it does to the logits (truncation, penalties, logit
// bias, logprobs) is in sampler_logits_test.cc.
#include "engine/sampler.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/sampler_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

using sampler_testing::kInf;
using sampler_testing::kNaN;
using sampler_testing::MakeSampler;
using sampler_testing::RandomLogits;
using sampler_testing::SampleToken;
using sampler_testing::Softmax;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Validation.

void ExpectInvalid(const SamplingParams& p, const std::string& field,
                   const std::string& range, int32_t vocab = 100) {
  absl::Status s = ValidateSamplingParams(p, vocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(s.message(), HasSubstr(field));
  EXPECT_THAT(s.message(), HasSubstr(range));
}

TEST(ValidateSamplingParams, DefaultsAndBoundariesAreValid) {
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p, 100).ok());
  p.temperature = 0;
  p.top_p = 1;
  p.min_p = 1;
  p.repetition_penalty = 0.01f;
  p.presence_penalty = -2;
  p.frequency_penalty = 2;
  p.max_tokens = 1;
  p.stop = std::vector<std::string>(16, "x");
  p.stop_token_ids = {0, 99};
  p.logprobs = true;
  p.top_logprobs = 20;
  p.top_k = 1000000;  // Larger than the vocabulary: simply no truncation.
  p.logit_bias = {{0, -100.0f}, {42, 0.0f}, {99, 100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p, 100).ok());
}

TEST(ValidateSamplingParams, RejectsEachOutOfRangeField) {
  const float nan = kNaN;
  for (float t : {-0.5f, nan, kInf}) {
    SamplingParams p;
    p.temperature = t;
    ExpectInvalid(p, "temperature", ">= 0");
  }
  for (float v : {0.0f, -0.1f, 1.01f, nan}) {
    SamplingParams p;
    p.top_p = v;
    ExpectInvalid(p, "top_p", "(0, 1]");
  }
  for (float v : {-0.01f, 1.01f, nan}) {
    SamplingParams p;
    p.min_p = v;
    ExpectInvalid(p, "min_p", "[0, 1]");
  }
  for (float v : {0.0f, -1.0f, nan, kInf}) {
    SamplingParams p;
    p.repetition_penalty = v;
    ExpectInvalid(p, "repetition_penalty", "> 0");
  }
  for (float v : {-2.01f, 2.01f, nan}) {
    SamplingParams p;
    p.presence_penalty = v;
    ExpectInvalid(p, "presence_penalty", "[-2, 2]");
    SamplingParams q;
    q.frequency_penalty = v;
    ExpectInvalid(q, "frequency_penalty", "[-2, 2]");
  }
  {
    SamplingParams p;
    p.logprobs = true;
    p.top_logprobs = 21;
    ExpectInvalid(p, "top_logprobs", "[0, 20]");
  }
  {
    SamplingParams p;
    p.top_logprobs = 1;
    ExpectInvalid(p, "top_logprobs", "requires logprobs");
  }
  {
    SamplingParams p;
    p.stop = std::vector<std::string>(17, "x");
    ExpectInvalid(p, "stop", "at most 16");
  }
  {
    SamplingParams p;
    p.stop = {"ok", ""};
    ExpectInvalid(p, "stop[1]", "non-empty");
  }
  {
    SamplingParams p;
    p.stop_token_ids = {5, 100};
    ExpectInvalid(p, "stop_token_ids[1]", "[0, 100)");
  }
  {
    SamplingParams p;
    p.max_tokens = 0;
    ExpectInvalid(p, "max_tokens", ">= 1");
  }
  for (uint32_t id : {100u, 4294967295u}) {
    SamplingParams p;
    p.logit_bias = {{3, 1.0f}, {id, 1.0f}};
    ExpectInvalid(p, absl::StrCat("logit_bias key ", id), "[0, 100)");
  }
  for (float v : {100.01f, -100.01f, 1e9f, kInf, -kInf, nan}) {
    SamplingParams p;
    p.logit_bias = {{3, 1.0f}, {7, v}};
    ExpectInvalid(p, "logit_bias[7]", "[-100, 100]");
  }
  EXPECT_EQ(ValidateSamplingParams(SamplingParams(), 0).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Sampler, CreateAndCallsRejectBadInput) {
  SamplingParams bad;
  bad.top_p = 0;
  EXPECT_EQ(Sampler::Create(bad, 10, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint32_t> prompt = {1, 10};
  EXPECT_THAT(Sampler::Create(SamplingParams(), 10, prompt).status().message(),
              HasSubstr("prompt token 1 is 10"));
  std::vector<uint32_t> generated = {11};
  EXPECT_FALSE(Sampler::Create(SamplingParams(), 10, {}, generated).ok());

  Sampler s = MakeSampler(SamplingParams(), 4);
  std::vector<float> wrong(5, 0.0f);
  EXPECT_EQ(s.Sample(wrong, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(s.Distribution(wrong).ok());
  std::vector<float> ok(4, 0.0f);
  EXPECT_FALSE(s.Sample(ok, -1).ok());
  EXPECT_FALSE(s.Accept(4).ok());
  EXPECT_TRUE(s.Accept(3).ok());
  EXPECT_EQ(s.num_generated(), 1);
}

// ---------------------------------------------------------------------------
// Randomness recipe.

TEST(Random, SplitMix64MatchesReferenceVectors) {
  // Published outputs of splitmix64 started at state 0.
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64Next(&state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64Next(&state), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(SplitMix64Next(&state), 0x06C45D188009454Full);
}

TEST(Random, Xoshiro256StarStarMatchesReferenceVectors) {
  // Outputs of the reference C implementation for state {1, 2, 3, 4}.
  const uint64_t s[4] = {1, 2, 3, 4};
  Xoshiro256StarStar rng(s);
  EXPECT_EQ(rng.Next(), 11520u);
  EXPECT_EQ(rng.Next(), 0u);
  EXPECT_EQ(rng.Next(), 1509978240u);
  EXPECT_EQ(rng.Next(), 1215971899390074240ull);
  EXPECT_EQ(rng.Next(), 1216172134540287360ull);
  EXPECT_EQ(rng.Next(), 607988272756665600ull);
}

TEST(Random, SeededUniformMatchesIndependentImplementation) {
  // 53-bit values from a separate Python implementation of the recipe in
  // sampler.h (splitmix64 key, XOR step, splitmix64 -> xoshiro256**).
  EXPECT_EQ(SeededUniform(0, 0), 8842825470291768.0 * 0x1.0p-53);
  EXPECT_EQ(SeededUniform(42, 7), 2298016435735861.0 * 0x1.0p-53);
  EXPECT_EQ(SeededUniform(~0ull, 123456789), 3269600644371502.0 * 0x1.0p-53);
  EXPECT_EQ(SeededUniform(1234, 0), 7892160915115173.0 * 0x1.0p-53);
  EXPECT_EQ(UniformDoubleFromBits(0), 0.0);
  EXPECT_EQ(UniformDoubleFromBits(~0ull), 1.0 - 0x1.0p-53);
}

TEST(Random, SeededUniformIsUniformAcrossSteps) {
  // Mean of n uniforms has sd 1/sqrt(12 n) = 0.00091 for n = 1e5; 6 sd.
  // Deciles: count ~ Binomial(n, 0.1), sd 95; 6 sd = 570.
  const int n = 100000;
  double sum = 0;
  int deciles[10] = {};
  for (int i = 0; i < n; ++i) {
    double u = SeededUniform(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++deciles[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.0055);
  for (int d : deciles) EXPECT_NEAR(d, n / 10, 570);
}

// ---------------------------------------------------------------------------
// Greedy.

TEST(Sampler, GreedyPicksArgmaxWithTiesToLowestId) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s = MakeSampler(p, 6);
  EXPECT_EQ(SampleToken(s, {1, 5, 3, 5, -2, 4.999f}, 0), 1u);
  EXPECT_EQ(SampleToken(s, {-3, -2, -1, -1, -5, -9}, 0), 2u);
  EXPECT_EQ(SampleToken(s, {0, 0, 0, 0, 0, 1e-6f}, 0), 5u);
  // NaN is never chosen; +inf always wins.
  EXPECT_EQ(SampleToken(s, {kNaN, 2, 1, kNaN, 0, 0}, 0), 1u);
  EXPECT_EQ(SampleToken(s, {1, 2, kInf, kNaN, kInf, 0}, 0), 2u);
  // Greedy never depends on step or seed.
  for (int step = 0; step < 20; ++step) {
    EXPECT_EQ(SampleToken(s, {1, 5, 3, 5, -2, 4}, step), 1u);
  }
}

TEST(Sampler, DegenerateLogitsFallBackToTokenZero) {
  for (float t : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.logprobs = true;
    Sampler s = MakeSampler(p, 4);
    absl::StatusOr<SampleResult> r = s.Sample({kNaN, -kInf, kNaN, -kInf}, 3);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->token_id, 0u);
    EXPECT_TRUE(r->degenerate);
    EXPECT_EQ(r->logprob, -kInf);
    r = s.Sample({kNaN, -kInf, 0, -kInf}, 3);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->token_id, 2u);
    EXPECT_FALSE(r->degenerate);
    EXPECT_EQ(r->logprob, 0.0f);
  }
}

TEST(Sampler, TopK1EqualsGreedyAtAnyTemperature) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0, 3);
  SamplingParams greedy_params;
  greedy_params.temperature = 0;
  Sampler greedy = MakeSampler(greedy_params, 64);
  for (float t : {0.05f, 1.0f, 7.0f, 1000.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = 1;
    p.seed = 99;
    Sampler s = MakeSampler(p, 64);
    for (int step = 0; step < 100; ++step) {
      std::vector<float> logits(64);
      // Rounded to force frequent ties.
      for (float& x : logits) x = std::round(normal(gen));
      uint32_t expected = 0;
      for (uint32_t i = 1; i < 64; ++i) {
        if (logits[i] > logits[expected]) expected = i;
      }
      EXPECT_EQ(SampleToken(greedy, logits, step), expected);
      EXPECT_EQ(SampleToken(s, logits, step), expected) << "t=" << t;
    }
  }
}

TEST(Sampler, TinyTemperatureBehavesLikeGreedyWithoutOverflow) {
  SamplingParams p;
  p.temperature = 1e-30f;
  p.seed = 1;
  Sampler s = MakeSampler(p, 4);
  for (int step = 0; step < 50; ++step) {
    EXPECT_EQ(SampleToken(s, {3e38f, 3.0001e38f, -3e38f, 1}, step), 1u);
    EXPECT_EQ(SampleToken(s, {1.0f, 1.0001f, 0.9999f, 0}, step), 1u);
  }
}

// ---------------------------------------------------------------------------
// Seeds.

TEST(Sampler, SeededRunsReproduceAndDifferAcrossSeeds) {
  const int vocab = 1000, steps = 200;
  auto rows = RandomLogits(steps, vocab, 11);
  SamplingParams p;
  p.seed = 42;
  p.top_p = 0.95f;
  p.top_k = 500;
  Sampler a = MakeSampler(p, vocab);
  Sampler b = MakeSampler(p, vocab);
  p.seed = 43;
  Sampler c = MakeSampler(p, vocab);
  std::vector<uint32_t> ta, tb, tc;
  for (int i = 0; i < steps; ++i) {
    ta.push_back(SampleToken(a, rows[i], i));
    tb.push_back(SampleToken(b, rows[i], i));
    tc.push_back(SampleToken(c, rows[i], i));
  }
  EXPECT_EQ(ta, tb);
  // Two independent draws from ~500 comparable tokens agree with
  // probability ~sum p^2 < 0.01, so nearly all steps must differ.
  int differ = 0;
  for (int i = 0; i < steps; ++i) differ += ta[i] != tc[i];
  EXPECT_GT(differ, 180);

  // The draw depends on (seed, step) only: a fresh sampler (as on another
  // worker) asked for step 137 directly reproduces it.
  p.seed = 42;
  Sampler fresh = MakeSampler(p, vocab);
  EXPECT_EQ(SampleToken(fresh, rows[137], 137), ta[137]);
  EXPECT_EQ(SampleToken(fresh, rows[5], 5), ta[5]);
}

TEST(Sampler, UnseededSamplersUseDistinctSeeds) {
  Sampler a = MakeSampler(SamplingParams(), 10);
  Sampler b = MakeSampler(SamplingParams(), 10);
  EXPECT_NE(a.seed(), b.seed());
  SamplingParams p;
  p.seed = 5;
  EXPECT_EQ(MakeSampler(p, 10).seed(), 5u);
}

// ---------------------------------------------------------------------------
// Empirical distribution.

// Draws `n` tokens (steps 0..n-1 of one seed) and checks the frequencies
// against `expected`. Two criteria:
//  - Pearson chi-square with (k - 1) degrees of freedom below the 0.999
//    quantile: a correct sampler fails with probability 0.001 for a random
//    seed, and the seed is fixed so the test is deterministic;
//  - every frequency within 5 standard errors sqrt(p (1 - p) / n) (<= 0.0177
//    for n = 20000), which catches a single badly wrong probability.
void ExpectFrequencies(Sampler& s, const std::vector<float>& logits,
                       const std::vector<double>& expected, int n,
                       double chi2_critical) {
  std::vector<int> counts(logits.size());
  for (int i = 0; i < n; ++i) {
    uint32_t t = SampleToken(s, logits, i);
    ASSERT_LT(t, logits.size());
    ++counts[t];
  }
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = expected[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    const double se = std::sqrt(expected[i] * (1 - expected[i]) / n);
    EXPECT_NEAR(static_cast<double>(counts[i]) / n, expected[i], 5 * se)
        << "token " << i;
  }
  EXPECT_LT(chi2, chi2_critical);
}

TEST(Sampler, EmpiricalDistributionMatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, 1.5f};
  const std::vector<double> l(logits.begin(), logits.end());
  // chi-square 0.999 quantile for 5 degrees of freedom.
  const double kChi2Df5 = 20.515;
  {
    SamplingParams p;
    p.seed = 2024;
    Sampler s = MakeSampler(p, 6);
    ExpectFrequencies(s, logits, Softmax(l), 20000, kChi2Df5);
  }
  {
    SamplingParams p;
    p.seed = 7;
    p.temperature = 0.7f;
    Sampler s = MakeSampler(p, 6);
    ExpectFrequencies(s, logits, Softmax(l, 0.7), 20000, kChi2Df5);
  }
}

}  // namespace
}  // namespace pdserve::engine
