// Speculative decoding (engine/drafter.h, LlmEngine, ModelRunner's drafts,
// Sampler::SampleVerifying): whatever is drafted, greedy output is plain
// decoding's token for token, sampled output keeps the target's
// distribution, and rejected drafts leave no trace in the KV cache.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/draft_model_drafter.h"
#include "engine/drafter.h"
#include "engine/llm_engine.h"
#include "gtest/gtest.h"
#include "model/default_model.h"
#include "model/model.h"
#include "model/testing/tiny_model_testing.h"
#include "model/tiny_model.h"

namespace pdserve::engine {
namespace {

using Method = SpeculativeOptions::Method;

using model::testing::OpenTinyModel;

std::unique_ptr<model::Model> TinyModel(uint64_t seed, const std::string& name,
                                        bool tied_output = true) {
  model::TinyModelOptions o;
  o.num_layers = 2;
  o.seed = seed;
  o.tied_output = tied_output;
  return OpenTinyModel(o, name);
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  RequestFinish finish = RequestFinish::kNone;
};

std::vector<Result> RunAll(LlmEngine& engine,
                           std::vector<EngineRequest> requests) {
  std::vector<Result> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const int32_t replayed = requests[i].generated.size();
    requests[i].on_output = [&results, i, replayed](const RequestOutput& out) {
      Result& r = results[i];
      EXPECT_EQ(r.finish, RequestFinish::kNone) << "output after the end";
      // One output per token, in order, even when a step keeps several.
      EXPECT_EQ(out.generated_offset,
                replayed + static_cast<int32_t>(r.tokens.size()));
      r.tokens.insert(r.tokens.end(), out.token_ids.begin(),
                      out.token_ids.end());
      r.text += out.text;
      r.finish = out.finish;
    };
    EXPECT_TRUE(engine.AddRequest(std::move(requests[i])).ok());
  }
  EXPECT_TRUE(engine.RunUntilIdle().ok());
  return results;
}

EngineRequest Greedy(std::vector<int32_t> prompt, uint32_t n) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  return r;
}

// A prompt that repeats a phrase: n-gram drafts find matches, and a random
// model's greedy output tends to loop, so drafts are accepted and rejected
// both.
std::vector<int32_t> RepetitivePrompt(int vocab, int salt, int length) {
  std::vector<int32_t> phrase;
  for (int i = 0; i < 7; ++i)
    phrase.push_back((i * 37 + salt * 11 + 5) % vocab);
  std::vector<int32_t> p;
  for (int i = 0; p.size() < static_cast<size_t>(length); ++i) {
    p.push_back(phrase[i % phrase.size()]);
    if (i % 10 == 9) p.push_back((salt * 13 + i) % vocab);
  }
  return p;
}

class SpeculativeDecodingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_ = TinyModel(1, "spec_target.gguf").release();
    // Its own output head: a tied one makes any random model lean towards
    // repeating its input, which would make it agree with the target.
    other_ = TinyModel(2, "spec_draft.gguf", /*tied_output=*/false).release();
    // Tied: often agrees with the target, not always.
    similar_ = TinyModel(3, "spec_similar.gguf").release();
  }
  static void TearDownTestSuite() {
    delete target_;
    delete other_;
    delete similar_;
  }

  static std::unique_ptr<LlmEngine> MakeEngine(Method method,
                                               const model::Model* draft,
                                               int32_t num_blocks = 256,
                                               int32_t batch_tokens = 512,
                                               int32_t k = 4) {
    EngineOptions o;
    o.runner.block_size = 4;
    o.runner.num_blocks = num_blocks;
    o.runner.max_batch_tokens = batch_tokens;
    o.speculative.method = method;
    o.speculative.num_tokens = k;
    o.speculative.draft_model = draft;
    o.speculative.draft_kv_cache_bytes = 4 << 20;
    auto e = LlmEngine::Create(*target_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static std::vector<EngineRequest> Requests() {
    const int vocab = target_->config().vocab_size;
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 6; ++i) {
      requests.push_back(
          Greedy(RepetitivePrompt(vocab, i, 20 + 9 * i), 40 + 3 * i));
    }
    return requests;
  }

  static model::Model* target_;
  static model::Model* other_;
  static model::Model* similar_;
};

model::Model* SpeculativeDecodingTest::target_ = nullptr;
model::Model* SpeculativeDecodingTest::other_ = nullptr;
model::Model* SpeculativeDecodingTest::similar_ = nullptr;

TEST(PromptLookupTest, ContinuesTheMostRecentLongestMatch) {
  //                      0  1  2  3  4  5  6  7  8  9 10 11
  const std::vector<int32_t> t = {1, 2, 3, 9, 1, 2, 3, 4, 5, 6, 1, 2};
  // Suffix [1, 2]: most recent earlier occurrence at 4 -> continue 3 4 5.
  EXPECT_EQ(PromptLookup(t, 3, 2, 4), (std::vector<int32_t>{3, 4, 5}));
  // Capped by the sequence end.
  const std::vector<int32_t> u = {7, 8, 9, 7, 8};
  EXPECT_EQ(PromptLookup(u, 5, 2, 4), (std::vector<int32_t>{9, 7, 8}));
  // No occurrence of any suffix of length >= min_ngram.
  EXPECT_TRUE(PromptLookup({1, 2, 3, 4}, 3, 2, 4).empty());
  // A longer match wins over a more recent shorter one.
  const std::vector<int32_t> v = {5, 1, 2, 8, 0, 2, 9, 5, 1, 2};
  EXPECT_EQ(PromptLookup(v, 1, 2, 3), (std::vector<int32_t>{8}));
}

TEST(DraftLengthTest, GrowsOnFullAcceptanceShrinksOnMissesAndPauses) {
  DraftLengthOptions o;
  o.max_tokens = 6;
  DraftLength length(o);
  EXPECT_EQ(length.Next(), 6);
  length.Record(6, 2);
  EXPECT_EQ(length.Next(), 3);
  length.Record(3, 3);
  EXPECT_EQ(length.Next(), 4);
  // Misses pull the acceptance average under the threshold: a pause.
  for (int i = 0; i < 4; ++i) length.Record(4, 0);
  int paused = 0;
  while (length.Next() == 0) ++paused;
  EXPECT_EQ(paused, o.pause_steps);
  EXPECT_EQ(length.Next(), 1);  // the trial after a pause
}

TEST_F(SpeculativeDecodingTest, RejectedDraftsLeaveNoTraceInTheKvCache) {
  // One sequence decoded plainly; a twin decodes the same tokens with a
  // draft of 2 right tokens and 5 wrong ones across block boundaries. Its
  // logits at the kept positions and after the rollback equal the plain
  // sequence's bit for bit, and no block holding a wrong token is cached.
  ModelRunnerOptions o;
  o.block_size = 4;
  o.num_blocks = 64;
  auto created = ModelRunner::Create(*target_, o);
  ASSERT_TRUE(created.ok());
  ModelRunner& r = **created;
  const int vocab = r.vocab_size();
  const std::vector<int32_t> prompt = RepetitivePrompt(vocab, 3, 10);
  auto argmax = [&](const float* row) {
    return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  };
  // Plain: prompt, then 6 greedy tokens one step at a time.
  std::vector<std::vector<float>> plain_rows;
  std::vector<int32_t> plain_tokens;
  auto pre = r.Prefill({{1, prompt}});
  ASSERT_TRUE(pre.ok());
  int32_t next = argmax((*pre)[0].logits.data());
  for (int i = 0; i < 6; ++i) {
    plain_tokens.push_back(next);
    std::vector<float> logits;
    ASSERT_TRUE(r.Decode({1}, {next}, &logits).ok());
    plain_rows.push_back(logits);
    next = argmax(logits.data());
  }
  // Speculative twin (sequence 2; the prompt's blocks come from the prefix
  // cache, which is also what a wrong cached block would corrupt).
  ASSERT_TRUE(r.AddSequence(2, prompt).ok());
  std::vector<float> prompt_logits;
  ASSERT_TRUE(
      r.Run({{2, static_cast<int32_t>(prompt.size()) - r.num_computed(2),
              LogitsMode::kLast}},
            &prompt_logits)
          .ok());
  ASSERT_TRUE(r.AppendToken(2, plain_tokens[0]).ok());
  std::vector<int32_t> draft = {plain_tokens[1], plain_tokens[2]};
  for (int i = 0; i < 5; ++i)
    draft.push_back((plain_tokens[3] + 1 + i) % vocab);
  ASSERT_TRUE(r.AppendDraft(2, draft).ok());
  EXPECT_EQ(r.AppendToken(2, 0).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> rows;
  ASSERT_TRUE(r.Run({{2, 8, LogitsMode::kAll}}, &rows).ok());
  ASSERT_EQ(rows.size(), 8u * vocab);
  for (int j = 0; j < 3; ++j) {
    EXPECT_TRUE(std::equal(plain_rows[j].begin(), plain_rows[j].end(),
                           rows.begin() + j * vocab))
        << "kept position " << j;
  }
  ASSERT_TRUE(r.ResolveDraft(2, 2).ok());
  EXPECT_EQ(r.tokens(2).size(), prompt.size() + 3);
  EXPECT_EQ(r.num_computed(2), static_cast<int32_t>(prompt.size()) + 3);
  // The token after the kept ones overwrites the wrong draft's slots.
  for (int i = 3; i < 6; ++i) {
    std::vector<float> logits;
    ASSERT_TRUE(r.Decode({2}, {plain_tokens[i]}, &logits).ok());
    EXPECT_EQ(logits, plain_rows[i])
        << "decode step " << i << " after rollback";
  }
  // Every cached block holds right tokens: a third sequence of plain
  // tokens reuses them and gets the plain logits.
  r.Release(2);
  std::vector<int32_t> third = prompt;
  third.insert(third.end(), plain_tokens.begin(), plain_tokens.end() - 1);
  ASSERT_TRUE(r.AddSequence(3, third).ok());
  EXPECT_GT(r.num_computed(3), static_cast<int32_t>(prompt.size()));
  std::vector<float> last;
  ASSERT_TRUE(r.Run({{3, static_cast<int32_t>(third.size()) - r.num_computed(3),
                      LogitsMode::kLast}},
                    &last)
                  .ok());
  EXPECT_EQ(last, plain_rows[4]);
  EXPECT_TRUE(r.blocks().CheckInvariants().ok());
}

TEST_F(SpeculativeDecodingTest,
       GreedyOutputEqualsPlainDecodingWithEachDrafter) {
  const std::vector<EngineRequest> requests = Requests();
  auto plain = MakeEngine(Method::kNone, nullptr);
  const std::vector<Result> expected = RunAll(*plain, requests);
  struct Case {
    const char* name;
    Method method;
    const model::Model* draft;
  };
  for (const Case& c : {Case{"ngram", Method::kNgram, nullptr},
                        Case{"self draft", Method::kDraftModel, target_},
                        Case{"random draft", Method::kDraftModel, other_}}) {
    SCOPED_TRACE(c.name);
    // Small blocks and a tight token budget: drafts cross block
    // boundaries, get cut by the budget, and sequences get preempted.
    auto engine = MakeEngine(c.method, c.draft, 48, 24);
    const std::vector<Result> got = RunAll(*engine, requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
      EXPECT_EQ(got[i].text, expected[i].text) << "request " << i;
      EXPECT_EQ(got[i].finish, RequestFinish::kLength);
    }
    const EngineStats s = engine->stats();
    EXPECT_GT(s.spec_drafted_tokens, 0);
    if (c.draft == target_) {
      // The target as its own draft: every draft is the target's choice.
      EXPECT_EQ(s.spec_accepted_tokens, s.spec_drafted_tokens);
    } else if (c.draft == other_) {
      // An unrelated random model: nearly nothing accepted, output intact.
      EXPECT_LT(s.spec_accepted_tokens, s.spec_drafted_tokens / 5);
    } else {
      EXPECT_GT(s.spec_accepted_tokens, 0);
      EXPECT_LT(s.spec_accepted_tokens, s.spec_drafted_tokens);
    }
    EXPECT_EQ(engine->runner().blocks().num_used_blocks(), 0);
    EXPECT_TRUE(engine->runner().blocks().CheckInvariants().ok());
  }
}

TEST_F(SpeculativeDecodingTest, MixedBatchesAndOptOutsMatchPlainDecoding) {
  std::vector<EngineRequest> requests = Requests();
  for (size_t i = 0; i < requests.size(); i += 2) {
    requests[i].sampling.disable_speculation = true;
  }
  // A seeded sampled request rides along: with n-gram drafts (a
  // deterministic proposal) its tokens are plain sampling's too.
  EngineRequest sampled =
      Greedy(RepetitivePrompt(target_->config().vocab_size, 9, 30), 30);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 42;
  requests.push_back(sampled);
  const std::vector<Result> expected =
      RunAll(*MakeEngine(Method::kNone, nullptr), requests);
  auto engine = MakeEngine(Method::kNgram, nullptr, 256, 64);
  const std::vector<Result> got = RunAll(*engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
  }
  EXPECT_GT(engine->stats().spec_accepted_tokens, 0);
  // Opted out alone: nothing drafted.
  auto alone = MakeEngine(Method::kNgram, nullptr);
  RunAll(*alone, {requests[0]});
  EXPECT_EQ(alone->stats().spec_drafted_tokens, 0);
  // A batch as large as disable_by_batch_size drafts nothing either; one
  // below it does.
  for (const int32_t limit : {3, 4}) {
    EngineOptions o;
    o.runner.block_size = 4;
    o.runner.num_blocks = 256;
    o.speculative.method = Method::kNgram;
    o.speculative.disable_by_batch_size = limit;
    auto limited = LlmEngine::Create(*target_, o);
    ASSERT_TRUE(limited.ok());
    std::vector<EngineRequest> three = Requests();
    three.resize(3);
    const std::vector<Result> got = RunAll(**limited, three);
    if (limit == 3) {
      // Drafting starts once the batch shrinks below 3.
      EXPECT_LT((*limited)->stats().spec_drafted_tokens,
                engine->stats().spec_drafted_tokens / 4);
    } else {
      EXPECT_GT((*limited)->stats().spec_drafted_tokens, 0);
    }
    for (size_t i = 0; i < three.size(); ++i) {
      EXPECT_EQ(got[i].tokens, expected[i].tokens);
    }
  }
}

TEST_F(SpeculativeDecodingTest, AResumedStreamContinuesWithTheSameTokens) {
  // A migrated stream resumes on another decode worker with its tokens so
  // far (EngineRequest::generated); speculating there continues it exactly.
  const EngineRequest request = Requests()[3];
  const Result whole =
      RunAll(*MakeEngine(Method::kNone, nullptr), {request})[0];
  for (const Method method : {Method::kNgram, Method::kDraftModel}) {
    for (size_t cut : {size_t{1}, size_t{17}}) {
      EngineRequest resumed = request;
      resumed.generated.assign(whole.tokens.begin(),
                               whole.tokens.begin() + cut);
      auto engine = MakeEngine(method, target_);
      const Result rest = RunAll(*engine, {resumed})[0];
      EXPECT_EQ(rest.tokens, std::vector<int32_t>(whole.tokens.begin() + cut,
                                                  whole.tokens.end()))
          << "cut at " << cut;
    }
  }
}

// Two-sample chi-square statistic of homogeneity over the categories seen,
// those with fewer than 20 expected in a pooled "other" bin (fewer, fuller
// bins: more power against a skewed acceptance).
double ChiSquare(const std::map<int32_t, int>& a,
                 const std::map<int32_t, int>& b, int* dof) {
  std::map<int32_t, std::pair<int, int>> joint;
  for (auto [k, v] : a) joint[k].first += v;
  for (auto [k, v] : b) joint[k].second += v;
  double na = 0, nb = 0;
  for (auto& [k, v] : joint) {
    na += v.first;
    nb += v.second;
  }
  std::vector<std::pair<double, double>> bins;
  std::pair<double, double> other = {0, 0};
  for (auto& [k, v] : joint) {
    if ((v.first + v.second) * std::min(na, nb) / (na + nb) < 20) {
      other.first += v.first;
      other.second += v.second;
    } else {
      bins.push_back({double(v.first), double(v.second)});
    }
  }
  if (other.first + other.second > 0) bins.push_back(other);
  double chi = 0;
  for (auto [oa, ob] : bins) {
    const double total = oa + ob;
    const double ea = total * na / (na + nb), eb = total * nb / (na + nb);
    chi += (oa - ea) * (oa - ea) / ea + (ob - eb) * (ob - eb) / eb;
  }
  *dof = static_cast<int>(bins.size()) - 1;
  return chi;
}

// Upper 0.1% point of chi-square with `dof` degrees of freedom
// (Wilson-Hilferty).
double ChiSquareCritical(int dof) {
  const double z = 3.09;
  const double k = dof;
  const double t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

TEST_F(SpeculativeDecodingTest, SampledDraftsKeepTheTargetsDistribution) {
  // Another random model proposes from its own distribution; the rejection
  // rule must leave the target's. Tokens at generation steps 1 and 2 (the
  // first verified ones; step 0 comes from the prompt pass) over 4000 seeds,
  // speculative against plain. Checked to fail when rejected drafts are
  // redrawn from p instead of max(0, p - q), and when every draft is
  // accepted.
  const int kSeeds = 4000;
  const std::vector<int32_t> prompt =
      RepetitivePrompt(target_->config().vocab_size, 5, 12);
  auto requests = [&](uint64_t seed_base) {
    std::vector<EngineRequest> out;
    for (int s = 0; s < kSeeds; ++s) {
      EngineRequest r = Greedy(prompt, 4);
      r.sampling.temperature = 3.0f;  // flat enough for ~40 categories
      r.sampling.seed = seed_base + s;
      out.push_back(r);
    }
    return out;
  };
  auto histograms = [&](LlmEngine& engine, uint64_t seed_base) {
    std::vector<std::map<int32_t, int>> h(2);
    for (const Result& r : RunAll(engine, requests(seed_base))) {
      EXPECT_EQ(r.tokens.size(), 4u);
      if (r.tokens.size() < 4) continue;
      ++h[0][r.tokens[1]];
      ++h[1][r.tokens[2]];
    }
    return h;
  };
  auto plain_engine = MakeEngine(Method::kNone, nullptr, 4096);
  auto spec_engine = MakeEngine(Method::kDraftModel, similar_, 4096, 512, 2);
  // Different seeds on each side: the two samples are independent.
  const auto plain = histograms(*plain_engine, 1);
  const auto spec = histograms(*spec_engine, 1000000);
  const EngineStats s = spec_engine->stats();
  // Two tokens drafted after the first at least once per request.
  ASSERT_GE(s.spec_drafted_tokens, 2 * kSeeds);
  // Both rule branches ran: drafts accepted and rejected.
  EXPECT_GT(s.spec_accepted_tokens, s.spec_drafted_tokens / 20);
  EXPECT_LT(s.spec_accepted_tokens, s.spec_drafted_tokens * 19 / 20);
  for (int step = 0; step < 2; ++step) {
    int dof = 0;
    const double chi = ChiSquare(plain[step], spec[step], &dof);
    ASSERT_GE(dof, 3) << "too few distinct tokens to test anything";
    EXPECT_LT(chi, ChiSquareCritical(dof))
        << "generation step " << step + 1 << ": chi-square " << chi << " with "
        << dof << " degrees of freedom";
  }
  // Seeded runs are reproducible.
  auto again = MakeEngine(Method::kDraftModel, similar_, 4096, 512, 2);
  std::vector<EngineRequest> few = requests(77);
  few.resize(20);
  auto first = RunAll(*again, few);
  auto second =
      RunAll(*MakeEngine(Method::kDraftModel, similar_, 4096, 512, 2), few);
  for (size_t i = 0; i < few.size(); ++i) {
    EXPECT_EQ(first[i].tokens, second[i].tokens);
  }
}

TEST_F(SpeculativeDecodingTest, RefusesADraftModelWithAnotherVocabulary) {
  model::TinyModelOptions o;
  o.num_layers = 1;
  // Same generator, same vocabulary: accepted. (A different vocabulary
  // needs a different tokenizer, which the tiny generator does not make;
  // DraftModelDrafter::Create is checked directly.)
  std::unique_ptr<model::Model> same =
      OpenTinyModel(o, "spec_other_vocab.gguf");
  ASSERT_NE(same, nullptr);
  EXPECT_TRUE(DraftModelDrafter::Create(*same, target_->config().vocab_size,
                                        ModelRunnerOptions{})
                  .ok());
  auto refused = DraftModelDrafter::Create(
      *same, target_->config().vocab_size + 1, ModelRunnerOptions{});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EngineOptions bad;
  bad.speculative.method = Method::kDraftModel;  // no draft model
  EXPECT_EQ(LlmEngine::Create(*target_, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The default model (SmolLM2-135M-Instruct) with a prompt it answers by
// copying: greedy speculative output equals plain output with each drafter.
TEST(SpeculativeDefaultModelTest, GreedyOutputEqualsPlainDecoding) {
  const std::string path = model::FindDefaultModel();
  if (path.empty()) GTEST_SKIP() << "default model not found";
  auto m = model::Model::Open(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const model::Model& model = **m;
  const std::string text =
      "<|im_start|>user\nFix the spelling mistakes in this paragraph and "
      "return the corrected paragraph.\n\nThe quick brown fox jumpd over the "
      "lazy dog. Every morning, the farmer walks to the barn, feeds the "
      "chickens, and colects the eggs.<|im_end|>\n<|im_start|>assistant\n";
  EngineRequest request;
  request.prompt = model.tokenizer().Encode(text, /*add_special=*/false,
                                            /*parse_special=*/true);
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 48;
  auto run = [&](Method method, const model::Model* draft) {
    EngineOptions o;
    o.runner.num_threads = 1;
    o.runner.kv_cache_bytes = 32 << 20;
    o.speculative.method = method;
    o.speculative.draft_model = draft;
    o.speculative.draft_kv_cache_bytes = 16 << 20;
    auto e = LlmEngine::Create(model, o);
    EXPECT_TRUE(e.ok()) << e.status();
    Result r = RunAll(**e, {request})[0];
    EngineStats s = (*e)->stats();
    return std::make_pair(r, s);
  };
  const auto [plain, unused] = run(Method::kNone, nullptr);
  ASSERT_GE(plain.tokens.size(), 20u);
  const auto [ngram, ngram_stats] = run(Method::kNgram, nullptr);
  EXPECT_EQ(ngram.tokens, plain.tokens);
  EXPECT_EQ(ngram.text, plain.text);
  EXPECT_GT(ngram_stats.spec_accepted_tokens, 10);
  const auto [self, self_stats] = run(Method::kDraftModel, &model);
  EXPECT_EQ(self.tokens, plain.tokens);
  EXPECT_EQ(self_stats.spec_accepted_tokens, self_stats.spec_drafted_tokens);
  EXPECT_GT(self_stats.spec_drafted_tokens, 10);
}

}  // namespace
}  // namespace pdserve::engine

namespace pdserve::engine {
namespace {

TEST(SpeculativeSlidingWindowTest, GreedyOutputEqualsPlainDecoding) {
  // Drafts roll back across blocks freed out of the window: the rollback
  // must not lose a block a kept position still attends.
  model::TinyModelOptions o;
  o.num_layers = 2;
  o.sliding_window = 10;
  std::unique_ptr<model::Model> m = OpenTinyModel(o, "spec_window.gguf");
  ASSERT_NE(m, nullptr);
  auto run = [&](Method method) {
    EngineOptions e;
    e.runner.block_size = 4;
    e.runner.num_blocks = 128;
    e.speculative.method = method;
    e.speculative.num_tokens = 6;
    auto engine = LlmEngine::Create(*m, e);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 3; ++i) {
      requests.push_back(
          Greedy(RepetitivePrompt(m->config().vocab_size, i, 30), 60));
    }
    auto results = RunAll(**engine, requests);
    return std::make_pair(results, (*engine)->stats());
  };
  const auto [plain, unused] = run(Method::kNone);
  const auto [spec, stats] = run(Method::kNgram);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "request " << i;
  }
  EXPECT_GT(stats.spec_accepted_tokens, 0);
  EXPECT_LT(stats.spec_accepted_tokens, stats.spec_drafted_tokens);
}

}  // namespace
}  // namespace pdserve::engine
