// What the sampler does to the logits: truncation (top-k, top-p, min-p) and
// temperature, repetition penalties, logit bias, and the logprobs it
// reports. Validation, randomness and seeds are in sampler_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sampler.h"
#include "engine/sampler_test_util.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

using sampler_testing::kInf;
using sampler_testing::kNaN;
using sampler_testing::MakeSampler;
using sampler_testing::RandomLogits;
using sampler_testing::SampleToken;
using sampler_testing::Softmax;

// Distribution as token -> probability.
std::map<uint32_t, double> Dist(Sampler& s, const std::vector<float>& logits) {
  absl::StatusOr<std::vector<TokenProb>> d = s.Distribution(logits);
  EXPECT_TRUE(d.ok()) << d.status();
  std::map<uint32_t, double> out;
  if (!d.ok()) return out;
  double sum = 0;
  for (const TokenProb& tp : *d) {
    EXPECT_FALSE(out.count(tp.token_id)) << "duplicate " << tp.token_id;
    out[tp.token_id] = tp.prob;
    sum += tp.prob;
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  return out;
}

std::set<uint32_t> Keys(const std::map<uint32_t, double>& m) {
  std::set<uint32_t> k;
  for (const auto& [id, p] : m) k.insert(id);
  return k;
}

// ---------------------------------------------------------------------------
// Truncation: kept candidate sets and their probabilities.

TEST(Sampler, TopKKeepsKMostLikelyTiesToLowestId) {
  //                       0     1     2     3     4     5     6     7
  std::vector<float> l = {0.5f, 3.0f, -1.f, 2.0f, 3.0f, 1.0f, 2.0f, 0.0f};
  SamplingParams p;
  p.top_k = 3;
  Sampler s = MakeSampler(p, 8);
  auto d = Dist(s, l);
  // 3.0 (ids 1, 4), then 2.0 whose lowest id is 3.
  EXPECT_EQ(Keys(d), (std::set<uint32_t>{1, 3, 4}));
  const double z = 2 * std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(d[1], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(d[4], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(d[3], std::exp(2.0) / z, 1e-6);
  // Draws stay in the set.
  for (int step = 0; step < 300; ++step) {
    EXPECT_TRUE(d.count(SampleToken(s, l, step)));
  }
  // k >= vocab keeps everything.
  p.top_k = 8;
  Sampler all = MakeSampler(p, 8);
  EXPECT_EQ(Dist(all, l).size(), 8u);
}

std::vector<float> LogProbs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double x : probs) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

TEST(Sampler, TopPKeepsSmallestSetReachingMass) {
  // Probabilities by id; in likelihood order: 1 (.5), 3 (.2), 4 (.15),
  // 2 (.1), 0 (.05).
  const auto l = LogProbs({0.05, 0.5, 0.1, 0.2, 0.15});
  struct Case {
    float top_p;
    std::set<uint32_t> kept;
  };
  for (const Case& c : std::vector<Case>{{0.45f, {1}},
                                         {0.6f, {1, 3}},
                                         {0.8f, {1, 3, 4}},
                                         {0.9f, {1, 3, 4, 2}},
                                         {0.97f, {0, 1, 2, 3, 4}},
                                         {1.0f, {0, 1, 2, 3, 4}}}) {
    SamplingParams p;
    p.top_p = c.top_p;
    Sampler s = MakeSampler(p, 5);
    auto d = Dist(s, l);
    EXPECT_EQ(Keys(d), c.kept) << "top_p " << c.top_p;
  }
  SamplingParams p;
  p.top_p = 0.8f;
  Sampler s = MakeSampler(p, 5);
  auto d = Dist(s, l);
  EXPECT_NEAR(d[1], 0.5 / 0.85, 1e-6);
  EXPECT_NEAR(d[3], 0.2 / 0.85, 1e-6);
  EXPECT_NEAR(d[4], 0.15 / 0.85, 1e-6);
}

TEST(Sampler, TopPOnLargeVocabularySortsAsFarAsNeeded) {
  // 5000 tokens with a slowly decaying distribution, so the nucleus spans
  // several of the sampler's sort chunks. The expectation uses a full sort.
  const int vocab = 5000;
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> uni(-4, 0);
  std::vector<float> l(vocab);
  for (float& x : l) x = uni(gen);
  std::vector<uint32_t> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return l[a] != l[b] ? l[a] > l[b] : a < b;
  });
  double z = 0;
  for (float x : l) z += std::exp(double{x});
  for (float top_p : {0.01f, 0.05f, 0.3f, 0.7f}) {
    std::set<uint32_t> expected;
    double cum = 0;
    for (uint32_t id : order) {
      expected.insert(id);
      cum += std::exp(double{l[id]}) / z;
      if (cum >= top_p) break;
    }
    SamplingParams p;
    p.top_p = top_p;
    Sampler s = MakeSampler(p, vocab);
    EXPECT_EQ(Keys(Dist(s, l)), expected) << "top_p " << top_p;
    // The larger nuclei need more than the first sort chunk (64).
    if (top_p >= 0.3f) {
      EXPECT_GT(expected.size(), 64u);
    }
  }
}

TEST(Sampler, MinPKeepsTokensAboveFractionOfTop) {
  // Probabilities by id: .06, .4, .04, .2, .3
  const auto l = LogProbs({0.06, 0.4, 0.04, 0.2, 0.3});
  struct Case {
    float min_p;
    std::set<uint32_t> kept;
  };
  // Thresholds min_p * 0.4: .08 -> {.4,.3,.2}; .048 -> adds .06;
  // .2 -> {.4,.3}; 1.0 -> {.4}; 0 -> everything.
  for (const Case& c : std::vector<Case>{{0.2f, {1, 3, 4}},
                                         {0.12f, {0, 1, 3, 4}},
                                         {0.5f, {1, 4}},
                                         {1.0f, {1}},
                                         {0.0f, {0, 1, 2, 3, 4}}}) {
    SamplingParams p;
    p.min_p = c.min_p;
    Sampler s = MakeSampler(p, 5);
    EXPECT_EQ(Keys(Dist(s, l)), c.kept) << "min_p " << c.min_p;
  }
}

TEST(Sampler, TruncationStepsApplyInOrderOnRenormalisedMass) {
  // Probabilities by id: .1, .2, .4, .3.
  const auto l = LogProbs({0.1, 0.2, 0.4, 0.3});
  {
    // top_p alone: .4, .7 -> {2, 3}.
    SamplingParams p;
    p.top_p = 0.5f;
    Sampler s = MakeSampler(p, 4);
    EXPECT_EQ(Keys(Dist(s, l)), (std::set<uint32_t>{2, 3}));
  }
  {
    // top_k = 2 first: {2, 3} renormalised to 4/7, 3/7; 4/7 >= .5 -> {2}.
    SamplingParams p;
    p.top_k = 2;
    p.top_p = 0.5f;
    Sampler s = MakeSampler(p, 4);
    EXPECT_EQ(Keys(Dist(s, l)), (std::set<uint32_t>{2}));
  }
  {
    // top_p .85: .4, .7, .9 -> {2, 3, 1}; then min_p .6: floor .6 * .4 =
    // .24 -> {2, 3}.
    SamplingParams p;
    p.top_p = 0.85f;
    p.min_p = 0.6f;
    Sampler s = MakeSampler(p, 4);
    EXPECT_EQ(Keys(Dist(s, l)), (std::set<uint32_t>{2, 3}));
  }
}

TEST(Sampler, TemperatureAppliesAfterTruncation) {
  // Probabilities .5, .3, .2. top_p .6 at temperature 1 keeps {0, 1}; had
  // temperature 0.5 come first (p^2 renormalised: .658, .237, .105) only
  // {0} would remain. Kept tokens then get p^2 renormalised: .25 / .34 and
  // .09 / .34.
  const auto l = LogProbs({0.5, 0.3, 0.2});
  SamplingParams p;
  p.top_p = 0.6f;
  p.temperature = 0.5f;
  Sampler s = MakeSampler(p, 3);
  auto d = Dist(s, l);
  EXPECT_EQ(Keys(d), (std::set<uint32_t>{0, 1}));
  EXPECT_NEAR(d[0], 0.25 / 0.34, 1e-6);
  EXPECT_NEAR(d[1], 0.09 / 0.34, 1e-6);
}

TEST(Sampler, InfiniteLogitsShareAllMass) {
  SamplingParams p;
  p.seed = 3;
  Sampler s = MakeSampler(p, 5);
  std::vector<float> l = {1, kInf, kNaN, kInf, 100};
  auto d = Dist(s, l);
  EXPECT_EQ(Keys(d), (std::set<uint32_t>{1, 3}));
  EXPECT_NEAR(d[1], 0.5, 1e-12);
  std::set<uint32_t> seen;
  for (int step = 0; step < 100; ++step) seen.insert(SampleToken(s, l, step));
  EXPECT_EQ(seen, (std::set<uint32_t>{1, 3}));
  // NaN is never drawn.
  std::vector<float> with_nan = {kNaN, 0, kNaN, 0, -kInf};
  for (int step = 0; step < 100; ++step) {
    uint32_t t = SampleToken(s, with_nan, step);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

// ---------------------------------------------------------------------------
// Penalties.

TEST(Sampler, PenaltiesChangeLogitsByDocumentedAmounts) {
  // prompt {1, 2, 5}; generated {2, 3, 3}. repetition 2, presence .5,
  // frequency .25. Hand-computed penalised logits:
  //   0: unseen                    1.0
  //   1: prompt, 2 / 2             1.0
  //   2: prompt + generated once,  -1 * 2 - .25 - .5 = -2.75
  //   3: generated twice, 3 / 2 - 2 * .25 - .5 = 0.5
  //   4: unseen                    0.0
  //   5: prompt, 4 / 2             2.0
  const std::vector<float> raw = {1.0f, 2.0f, -1.0f, 3.0f, 0.0f, 4.0f};
  const std::vector<double> expected = {1.0, 1.0, -2.75, 0.5, 0.0, 2.0};
  SamplingParams p;
  p.repetition_penalty = 2;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  // History given at creation (a resumed sequence) and built by Accept must
  // agree.
  Sampler resumed = MakeSampler(p, 6, {1, 2, 5}, {2, 3, 3});
  Sampler built = MakeSampler(p, 6, {1, 2, 5});
  for (uint32_t t : {2u, 3u, 3u}) ASSERT_TRUE(built.Accept(t).ok());
  const std::vector<double> want = Softmax(expected);
  for (Sampler* s : {&resumed, &built}) {
    auto d = Dist(*s, raw);
    ASSERT_EQ(d.size(), 6u);
    for (uint32_t i = 0; i < 6; ++i) EXPECT_NEAR(d[i], want[i], 1e-6) << i;
  }
}

TEST(Sampler, PresenceAndFrequencyIgnorePromptRepetitionDoesNot) {
  const std::vector<float> raw = {0.0f, 2.5f, 0.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 1;
  p.frequency_penalty = 1;
  {
    // Token 3 only in the prompt: presence/frequency leave it at 3.0.
    Sampler s = MakeSampler(p, 4, {3});
    EXPECT_EQ(SampleToken(s, raw, 0), 3u);
    // Generated once: 3 - 1 - 1 = 1.0 < 2.5.
    ASSERT_TRUE(s.Accept(3).ok());
    EXPECT_EQ(SampleToken(s, raw, 1), 1u);
  }
  {
    // Repetition 2 on a prompt token: 3 / 2 = 1.5 < 2.5.
    SamplingParams r;
    r.temperature = 0;
    r.repetition_penalty = 2;
    Sampler s = MakeSampler(r, 4, {3});
    EXPECT_EQ(SampleToken(s, raw, 0), 1u);
    // Repetition below 1 boosts: negative logit -1 * 0.5 = -0.5 beats -0.9.
    r.repetition_penalty = 0.5f;
    Sampler boost = MakeSampler(r, 3, {0});
    EXPECT_EQ(SampleToken(boost, {-1.0f, -0.9f, -3.0f}, 0), 0u);
  }
  {
    // Negative presence penalty encourages: 0 + 1 = 1 beats 0.9.
    SamplingParams n;
    n.temperature = 0;
    n.presence_penalty = -1;
    Sampler s = MakeSampler(n, 3, {}, {0});
    EXPECT_EQ(SampleToken(s, {0.0f, 0.9f, 0.5f}, 0), 0u);
  }
}

TEST(Sampler, GreedyAndTopK1AgreeUnderPenalties) {
  auto rows = RandomLogits(60, 300, 17);
  SamplingParams g;
  g.temperature = 0;
  g.repetition_penalty = 1.3f;
  g.presence_penalty = 0.4f;
  g.frequency_penalty = 0.7f;
  SamplingParams k = g;
  k.temperature = 0.8f;
  k.top_k = 1;
  std::vector<uint32_t> prompt = {4, 8, 15, 16, 23, 42, 299};
  Sampler a = MakeSampler(g, 300, prompt);
  Sampler b = MakeSampler(k, 300, prompt);
  for (int i = 0; i < 60; ++i) {
    uint32_t ta = SampleToken(a, rows[i], i);
    EXPECT_EQ(SampleToken(b, rows[i], i), ta);
    ASSERT_TRUE(a.Accept(ta).ok());
    ASSERT_TRUE(b.Accept(ta).ok());
  }
}

// ---------------------------------------------------------------------------
// Logit bias.

TEST(Sampler, LogitBiasOfHundredForcesOrBansATokenUnderGreedy) {
  // Logits spread over about [-12, 12], as a small model's are.
  std::vector<std::vector<float>> rows = RandomLogits(20, 500, 23);
  for (std::vector<float>& raw : rows) {
    for (float& x : raw) x *= 4;
    const uint32_t argmax = static_cast<uint32_t>(
        std::max_element(raw.begin(), raw.end()) - raw.begin());
    const uint32_t least = static_cast<uint32_t>(
        std::min_element(raw.begin(), raw.end()) - raw.begin());
    SamplingParams p;
    p.temperature = 0;
    p.logit_bias = {{least, 100.0f}};
    Sampler forced = MakeSampler(p, 500);
    EXPECT_EQ(SampleToken(forced, raw, 0), least);

    // -100 on the argmax: the runner-up wins.
    std::vector<float> rest = raw;
    rest[argmax] = -kInf;
    const uint32_t second = static_cast<uint32_t>(
        std::max_element(rest.begin(), rest.end()) - rest.begin());
    p.logit_bias = {{argmax, -100.0f}};
    Sampler banned = MakeSampler(p, 500);
    EXPECT_EQ(SampleToken(banned, raw, 0), second);

    // Sampling at temperature 1 agrees: all the mass (to 1e-20) moves.
    p.temperature = 1;
    p.logit_bias = {{least, 100.0f}};
    Sampler sampled = MakeSampler(p, 500);
    double others = 0;
    for (const auto& [id, prob] : Dist(sampled, raw)) {
      if (id != least) others += prob;
    }
    EXPECT_LT(others, 1e-20);
    p.logit_bias = {{argmax, -100.0f}};
    Sampler sampled_ban = MakeSampler(p, 500);
    EXPECT_LT(Dist(sampled_ban, raw)[argmax], 1e-30);
  }
}

TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  // Token 1 is in the prompt, biased +3: (2 + 3) / 2 = 2.5 with the bias
  // first; 2 / 2 + 3 = 4 had the penalty come first. Token 2 is biased but
  // unseen, so the repetition penalty leaves it alone: 1 + 1.25 = 2.25.
  const std::vector<float> raw = {3.0f, 2.0f, 1.0f, 0.0f};
  const std::vector<double> adjusted = {3.0, 2.5, 2.25, -1.0};
  SamplingParams p;
  p.repetition_penalty = 2;
  p.logit_bias = {{1, 3.0f}, {2, 1.25f}, {3, -1.0f}};
  Sampler s = MakeSampler(p, 4, {1});
  const std::vector<double> want = Softmax(adjusted);
  auto d = Dist(s, raw);
  ASSERT_EQ(d.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_NEAR(d[i], want[i], 1e-6) << i;

  // Greedy sees the same values: 3.0 still beats 2.5 (penalty first would
  // have made token 1 win with 4).
  p.temperature = 0;
  Sampler g = MakeSampler(p, 4, {1});
  EXPECT_EQ(SampleToken(g, raw, 0), 0u);
  // And presence/frequency subtract from the biased value: token 2
  // generated once with presence 1: 2.25 - 1 = 1.25.
  p.temperature = 1;
  p.repetition_penalty = 1;
  p.presence_penalty = 1;
  p.logit_bias = {{2, 1.25f}};
  Sampler pr = MakeSampler(p, 4, {}, {2});
  const std::vector<double> want2 = Softmax({3.0, 2.0, 1.25, 0.0});
  auto d2 = Dist(pr, raw);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_NEAR(d2[i], want2[i], 1e-6) << i;
}

TEST(Sampler, LogitBiasKeepsNonFiniteLogitsAndRawLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  p.logit_bias = {{0, 100.0f}, {1, 50.0f}};
  Sampler s = MakeSampler(p, 3);
  // -inf and NaN stay impossible whatever their bias.
  absl::StatusOr<SampleResult> r = s.Sample({-kInf, kNaN, -5.0f}, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_id, 2u);
  EXPECT_FALSE(r->degenerate);
  // Logprobs are the raw model's: the bias that picked token 0 is not in
  // them.
  r = s.Sample({0.0f, 1.0f, 2.0f}, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_id, 0u);
  const double lse = std::log(1.0 + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(r->logprob, 0.0 - lse, 1e-6);
  ASSERT_EQ(r->top_logprobs.size(), 2u);
  EXPECT_EQ(r->top_logprobs[0].token_id, 2u);
  EXPECT_NEAR(r->top_logprobs[0].logprob, 2.0 - lse, 1e-6);
}

TEST(Sampler, GreedyAndTopK1AgreeUnderLogitBiasAndPenalties) {
  auto rows = RandomLogits(60, 300, 29);
  SamplingParams g;
  g.temperature = 0;
  g.repetition_penalty = 1.3f;
  g.frequency_penalty = 0.7f;
  for (uint32_t id = 0; id < 300; id += 7) {
    g.logit_bias[id] = static_cast<float>(id % 11) - 5.0f;
  }
  SamplingParams k = g;
  k.temperature = 0.8f;
  k.top_k = 1;
  std::vector<uint32_t> prompt = {4, 8, 14, 16, 21, 42, 299};
  Sampler a = MakeSampler(g, 300, prompt);
  Sampler b = MakeSampler(k, 300, prompt);
  int biased_picks = 0;
  for (int i = 0; i < 60; ++i) {
    uint32_t ta = SampleToken(a, rows[i], i);
    EXPECT_EQ(SampleToken(b, rows[i], i), ta);
    biased_picks += ta % 7 == 0;
    ASSERT_TRUE(a.Accept(ta).ok());
    ASSERT_TRUE(b.Accept(ta).ok());
  }
  // The biases mattered: 1 in 7 tokens is biased, up to +5.
  EXPECT_GT(biased_picks, 8);
}

// ---------------------------------------------------------------------------
// Logprobs.

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  const std::vector<float> raw = {1.0f, 2.0f, 3.0f, 0.5f};
  const double lse =
      std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(0.5));
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 3;
  Sampler s = MakeSampler(p, 4);
  absl::StatusOr<SampleResult> r = s.Sample(raw, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_id, 2u);
  EXPECT_NEAR(r->logprob, 3.0 - lse, 1e-6);
  ASSERT_EQ(r->top_logprobs.size(), 3u);
  EXPECT_EQ(r->top_logprobs[0].token_id, 2u);
  EXPECT_EQ(r->top_logprobs[1].token_id, 1u);
  EXPECT_EQ(r->top_logprobs[2].token_id, 0u);
  EXPECT_NEAR(r->top_logprobs[0].logprob, 3.0 - lse, 1e-6);
  EXPECT_NEAR(r->top_logprobs[1].logprob, 2.0 - lse, 1e-6);
  EXPECT_NEAR(r->top_logprobs[2].logprob, 1.0 - lse, 1e-6);

  // Penalties, temperature and truncation do not change logprobs.
  SamplingParams q = p;
  q.temperature = 0.3f;
  q.top_k = 2;
  q.repetition_penalty = 3;
  q.presence_penalty = 2;
  q.seed = 1;
  Sampler t = MakeSampler(q, 4, {2}, {2, 1});
  for (int step = 0; step < 20; ++step) {
    r = t.Sample(raw, step);
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(r->logprob, raw[r->token_id] - lse, 1e-6);
    ASSERT_EQ(r->top_logprobs.size(), 3u);
    EXPECT_NEAR(r->top_logprobs[0].logprob, 3.0 - lse, 1e-6);
  }
}

TEST(Sampler, LogprobsEdgeCases) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 5;  // More than the vocabulary.
  Sampler s = MakeSampler(p, 3);
  // Ties: equal logits listed by id.
  absl::StatusOr<SampleResult> r = s.Sample({1, 1, 1}, 0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->top_logprobs.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->top_logprobs[i].token_id, i);
    EXPECT_NEAR(r->top_logprobs[i].logprob, -std::log(3.0), 1e-6);
  }
  // NaN counts as -inf, without disturbing the others.
  r = s.Sample({kNaN, 0, 0}, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_id, 1u);
  EXPECT_NEAR(r->logprob, -std::log(2.0), 1e-6);
  EXPECT_EQ(r->top_logprobs[2].token_id, 0u);
  EXPECT_EQ(r->top_logprobs[2].logprob, -kInf);
  // +inf tokens share the mass.
  r = s.Sample({kInf, 0, kInf}, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_id, 0u);
  EXPECT_NEAR(r->logprob, -std::log(2.0), 1e-6);
  EXPECT_EQ(r->top_logprobs[2].logprob, -kInf);

  // logprobs off: nothing computed.
  SamplingParams off;
  off.temperature = 0;
  Sampler o = MakeSampler(off, 3);
  r = o.Sample({1, 2, 3}, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->logprob, 0.0f);
  EXPECT_TRUE(r->top_logprobs.empty());

  // top_logprobs 0 with logprobs: only the sampled token's.
  SamplingParams only;
  only.temperature = 0;
  only.logprobs = true;
  Sampler n = MakeSampler(only, 3);
  r = n.Sample({0, 0, std::log(2.0f)}, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->logprob, std::log(0.5), 1e-6);
  EXPECT_TRUE(r->top_logprobs.empty());
}

TEST(Sampler, GreedyDistributionIsOneToken) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s = MakeSampler(p, 3);
  auto d = s.Distribution({0, 5, 5});
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->size(), 1u);
  EXPECT_EQ((*d)[0].token_id, 1u);
  EXPECT_EQ((*d)[0].prob, 1.0);
}

}  // namespace
}  // namespace pdserve::engine
