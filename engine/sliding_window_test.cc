// Sliding-window attention (a window the GGUF declares) and attention sinks
// (StreamingLLM, a runner option): logits against a reference that masks
// the same keys explicitly, blocks freed as a sequence outgrows its window,
// prefix-cache hits on a windowed model, and generation past the context
// with bounded KV.
//
// The reference is the same model without a declared window (the tiny
// model generator writes the same weights for the same seed), run with
// CpuBackendOptions::testing_attention_mask: it reads every key [0, pos]
// from the cache and masks the ones outside the window with -inf before the
// softmax, as llama.cpp does. The real path reads only the keys in the
// window (decode) or masks them (prompts) and frees blocks, so the two sum
// in different orders: logits agree within kTolerance of their spread.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/llm_engine.h"
#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/testing/tiny_model_testing.h"
#include "model/tiny_model.h"

namespace pdserve::engine {
namespace {

constexpr int32_t kBlockSize = 4;
// Not a multiple of the block size: windows start mid-block.
constexpr int32_t kWindow = 10;
// Summation-order differences are ~1e-6 of the spread; attending one key
// more or less moves logits by percents of it.
constexpr float kTolerance = 1e-4f;

using model::testing::OpenTinyModel;

model::TinyModelOptions TinyOptions(int32_t window, int32_t pattern = 0) {
  model::TinyModelOptions o;
  o.num_layers = 2;
  o.context_length = 128;
  o.sliding_window = window;
  o.sliding_window_pattern = pattern;
  o.seed = 7;
  return o;
}

std::unique_ptr<ModelRunner> MakeRunner(const model::Model& m,
                                        ModelRunnerOptions o) {
  o.block_size = kBlockSize;
  if (o.num_blocks == 0) o.num_blocks = 96;
  o.num_threads = 2;
  auto r = ModelRunner::Create(m, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

// Largest |got - want| over the spread of want.
float RelativeDiff(absl::Span<const float> got, absl::Span<const float> want) {
  float lo = want[0], hi = want[0], diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    lo = std::min(lo, want[i]);
    hi = std::max(hi, want[i]);
    diff = std::max(diff, std::abs(got[i] - want[i]));
  }
  return diff / (hi - lo);
}

int32_t ArgMax(absl::Span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) -
                              row.begin());
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(1 + (i * 37 + salt * 11) % 250);
  return p;
}

// Prefills `prompt` (chunked) and decodes greedily to `total` tokens; each
// logits row (the prompt's last, then one per step) goes to *rows.
std::vector<int32_t> Generate(ModelRunner& r, SeqId id,
                              const std::vector<int32_t>& prompt, int total,
                              std::vector<std::vector<float>>* rows = nullptr,
                              int32_t* cached = nullptr) {
  ModelRunner::PrefillInput in{id, prompt};
  auto out = r.Prefill({&in, 1});
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  if (cached != nullptr) *cached = (*out)[0].cached_tokens;
  std::vector<float> logits = (*out)[0].logits;
  std::vector<int32_t> tokens = prompt;
  while (static_cast<int>(tokens.size()) < total) {
    if (rows != nullptr) rows->push_back(logits);
    tokens.push_back(ArgMax(logits));
    const absl::Status s = r.Decode({&id, 1}, {&tokens.back(), 1}, &logits);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
  }
  return tokens;
}

// Every position's logits of `tokens` from the reference: the unwindowed
// model with the window's mask given explicitly, in one pass.
std::vector<float> ReferenceLogits(
    const model::Model& full, const std::vector<int32_t>& tokens,
    int32_t prompt_length,
    std::function<bool(int layer, int32_t query, int32_t key)> mask) {
  ModelRunnerOptions o;
  o.enable_prefix_cache = false;
  o.testing_attention_mask = std::move(mask);
  auto r = MakeRunner(full, o);
  EXPECT_TRUE(r->AddSequence(1, tokens, prompt_length).ok());
  std::vector<float> logits;
  const absl::Status s = r->Run(
      {{1, static_cast<int32_t>(tokens.size()), LogitsMode::kAll}}, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

class SlidingWindowTest : public ::testing::TestWithParam<int32_t> {};

// Pattern 0: every layer windowed. Pattern 2: layer 1 attends everything.
INSTANTIATE_TEST_SUITE_P(Patterns, SlidingWindowTest, ::testing::Values(0, 2));

TEST_P(SlidingWindowTest, LogitsEqualExplicitlyMaskedReference) {
  const int32_t pattern = GetParam();
  auto windowed = OpenTinyModel(TinyOptions(kWindow, pattern),
                                absl::StrCat("swa_", pattern, ".gguf"));
  auto full =
      OpenTinyModel(TinyOptions(0), absl::StrCat("full_", pattern, ".gguf"));
  ASSERT_NE(windowed, nullptr);
  ASSERT_NE(full, nullptr);
  ASSERT_EQ(windowed->config().sliding_window, kWindow);
  ASSERT_EQ(windowed->config().LayerWindow(1), pattern == 2 ? 0 : kWindow);
  ASSERT_EQ(full->config().sliding_window, 0);
  const int vocab = windowed->config().vocab_size;

  // Prompt of 3 windows, prefilled in chunks of 8, then 40 decode steps.
  const std::vector<int32_t> prompt = Prompt(30, 1);
  ModelRunnerOptions o;
  o.max_batch_tokens = 8;
  auto runner = MakeRunner(*windowed, o);
  std::vector<std::vector<float>> rows;
  const std::vector<int32_t> tokens = Generate(*runner, 1, prompt, 70, &rows);
  ASSERT_EQ(tokens.size(), 70u);
  const std::vector<float> want = ReferenceLogits(
      *full, tokens, prompt.size(), [pattern](int layer, int32_t q, int32_t k) {
        const bool windowed = pattern == 0 || layer % pattern != pattern - 1;
        return !windowed || q - k < kWindow;
      });
  ASSERT_EQ(want.size(), tokens.size() * vocab);
  auto want_row = [&](size_t pos) {
    return absl::MakeConstSpan(want).subspan(pos * vocab, vocab);
  };
  // rows[i] is position prompt.size() - 1 + i: the prompt's last, then
  // every decode step's.
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t pos = prompt.size() - 1 + i;
    EXPECT_LE(RelativeDiff(rows[i], want_row(pos)), kTolerance)
        << "position " << pos;
  }
  // Every position in one pass, as a prompt (the masked prompt path).
  auto one_pass = MakeRunner(*windowed, {.enable_prefix_cache = false});
  ASSERT_TRUE(one_pass->AddSequence(1, tokens, prompt.size()).ok());
  std::vector<float> all;
  ASSERT_TRUE(
      one_pass
          ->Run({{1, static_cast<int32_t>(tokens.size()), LogitsMode::kAll}},
                &all)
          .ok());
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    EXPECT_LE(RelativeDiff(absl::MakeConstSpan(all).subspan(pos * vocab, vocab),
                           want_row(pos)),
              kTolerance)
        << "position " << pos << " in one pass";
  }

  // Not vacuous: attending the whole context gives other logits.
  auto plain = MakeRunner(*full, {});
  ASSERT_TRUE(plain->AddSequence(1, tokens, prompt.size()).ok());
  std::vector<float> unmasked;
  ASSERT_TRUE(
      plain
          ->Run({{1, static_cast<int32_t>(tokens.size()), LogitsMode::kAll}},
                &unmasked)
          .ok());
  const size_t last = tokens.size() - 1;
  EXPECT_GT(
      RelativeDiff(absl::MakeConstSpan(unmasked).subspan(last * vocab, vocab),
                   want_row(last)),
      100 * kTolerance);
  ASSERT_TRUE(runner->blocks().CheckInvariants().ok());
}

// Blocks the window has passed are freed as the sequence grows: after each
// step exactly the blocks holding positions [next - window + 1, next) stay
// (next: the position the next step computes). With a layer attending the
// whole context, none is freed.
TEST_P(SlidingWindowTest, BlocksOutOfTheWindowAreFreed) {
  const int32_t pattern = GetParam();
  auto windowed = OpenTinyModel(TinyOptions(kWindow, pattern),
                                absl::StrCat("swa_blocks_", pattern, ".gguf"));
  ASSERT_NE(windowed, nullptr);
  for (const bool prefix_cache : {false, true}) {
    SCOPED_TRACE(prefix_cache ? "prefix cache" : "no prefix cache");
    ModelRunnerOptions o;
    o.enable_prefix_cache = prefix_cache;
    auto r = MakeRunner(*windowed, o);
    const std::vector<int32_t> prompt = Prompt(6, 2);
    ModelRunner::PrefillInput in{1, prompt};
    auto out = r->Prefill({&in, 1});
    ASSERT_TRUE(out.ok()) << out.status();
    std::vector<float> logits = (*out)[0].logits;
    int32_t max_used = 0;
    for (int32_t next = prompt.size() + 1; next <= 90; ++next) {
      const SeqId id = 1;
      const int32_t token = ArgMax(logits);
      ASSERT_TRUE(r->Decode({&id, 1}, {&token, 1}, &logits).ok());
      const int32_t first =
          pattern == 2 ? 0 : std::max(0, next - kWindow + 1) / kBlockSize;
      const int32_t expected = (next - 1) / kBlockSize - first + 1;
      // Evictable blocks (cached, freed) are not used.
      ASSERT_EQ(r->blocks().num_used_blocks(), expected) << "next " << next;
      max_used = std::max(max_used, r->blocks().num_used_blocks());
    }
    if (pattern == 0) {
      EXPECT_LE(max_used, (kWindow + kBlockSize - 1) / kBlockSize + 1);
    }
    if (prefix_cache && pattern == 0) {
      // The freed full blocks stay in the prefix cache, evictable.
      EXPECT_EQ(r->blocks().num_cached_blocks(), 90 / kBlockSize);
      EXPECT_GT(r->blocks().num_evictable_blocks(), 15);
    }
    ASSERT_TRUE(r->blocks().CheckInvariants().ok());
    r->Release(1);
    EXPECT_EQ(r->blocks().num_used_blocks(), 0);
    ASSERT_TRUE(r->blocks().CheckInvariants().ok());
  }
}

// The backend refuses a block table whose hole holds a key some new token
// attends, in any layer: a freed block is never read.
TEST(SlidingWindowBackendTest, RefusesAHoleAQueryAttends) {
  auto windowed = OpenTinyModel(TinyOptions(kWindow), "swa_holes.gguf");
  auto mixed = OpenTinyModel(TinyOptions(kWindow, 2), "swa_holes_mixed.gguf");
  ASSERT_NE(windowed, nullptr);
  ASSERT_NE(mixed, nullptr);
  auto forward = [](const model::Model& m, std::vector<BlockId> table) {
    auto r = MakeRunner(m, {});
    const std::vector<int32_t> token = {5};
    ForwardBatch batch;
    SequenceChunk chunk;
    chunk.tokens = token;
    chunk.start_pos = 20;  // attends positions [11, 20]
    chunk.block_table = table;
    batch.chunks.push_back(chunk);
    std::vector<float> logits;
    return r->backend().Forward(batch, &logits);
  };
  const BlockId h = kNoBlock;
  EXPECT_TRUE(forward(*windowed, {h, h, 2, 3, 4, 5}).ok());
  EXPECT_EQ(forward(*windowed, {h, h, h, 3, 4, 5}).code(),
            absl::StatusCode::kInvalidArgument);
  // Layer 1 of the mixed model attends everything.
  EXPECT_EQ(forward(*mixed, {h, 1, 2, 3, 4, 5}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A prefix-cache hit on a windowed model gives the tokens a cold run gives:
// when the prompt's leading blocks (freed out of the window) are still
// cached, and when they were evicted (a hit only ever takes a run of cached
// blocks from the first on, so it then takes none of them).
TEST(SlidingWindowPrefixCacheTest, HitGivesTheSameTokens) {
  auto windowed = OpenTinyModel(TinyOptions(kWindow), "swa_prefix.gguf");
  ASSERT_NE(windowed, nullptr);
  const std::vector<int32_t> prompt = Prompt(30, 3);
  auto cold = MakeRunner(*windowed, {.enable_prefix_cache = false});
  const std::vector<int32_t> want = Generate(*cold, 1, prompt, 60);

  ModelRunnerOptions o;
  o.num_blocks = 24;
  auto r = MakeRunner(*windowed, o);
  int32_t cached = -1;
  EXPECT_EQ(Generate(*r, 1, prompt, 60, nullptr, &cached), want);
  EXPECT_EQ(cached, 0);
  r->Release(1);
  // Hit: every prompt block but the last is cached (evictable).
  EXPECT_EQ(Generate(*r, 2, prompt, 60, nullptr, &cached), want);
  EXPECT_EQ(cached, 28);
  r->Release(2);
  ASSERT_TRUE(r->blocks().CheckInvariants().ok());
  // Another prompt whose window-bounded generation cycles through the whole
  // pool evicts the first prompt's blocks.
  Generate(*r, 3, Prompt(30, 9), 128);
  r->Release(3);
  EXPECT_LT(r->blocks().CountCachedPrefixBlocks(prompt), 7);
  EXPECT_EQ(Generate(*r, 4, prompt, 60, nullptr, &cached), want);
  EXPECT_LT(cached, 28);
  ASSERT_TRUE(r->blocks().CheckInvariants().ok());
}

// Attention sinks: a sequence generates 4x the model's context with KV
// bounded by the sinks and the recent window; without them the same runner
// stops at the context.
TEST(AttentionSinksTest, GeneratesPastTheContextInBoundedKv) {
  model::TinyModelOptions t = TinyOptions(0);
  t.context_length = 64;
  auto m = OpenTinyModel(t, "sinks.gguf");
  ASSERT_NE(m, nullptr);
  const int32_t context = 64, sinks = 4, window = 16;
  const int vocab = m->config().vocab_size;
  const int32_t bound = (sinks + window + kBlockSize - 1) / kBlockSize + 1;
  for (const bool prefix_cache : {false, true}) {
    SCOPED_TRACE(prefix_cache ? "prefix cache" : "no prefix cache");
    ModelRunnerOptions o;
    o.attention_sinks = sinks;
    o.sink_window = window;
    o.enable_prefix_cache = prefix_cache;
    // Fewer blocks than the context needs: only bounded KV can get far.
    o.num_blocks = 12;
    auto r = MakeRunner(*m, o);
    const std::vector<int32_t> prompt = Prompt(8, 4);
    ModelRunner::PrefillInput in{1, prompt};
    auto out = r->Prefill({&in, 1});
    ASSERT_TRUE(out.ok()) << out.status();
    std::vector<float> logits = (*out)[0].logits;
    int32_t max_used = 0;
    for (int32_t n = prompt.size(); n < 4 * context; ++n) {
      for (float x : logits) ASSERT_TRUE(std::isfinite(x)) << "at " << n;
      const int32_t token = ArgMax(logits);
      ASSERT_GE(token, 0);
      ASSERT_LT(token, vocab);
      const SeqId id = 1;
      const absl::Status s = r->Decode({&id, 1}, {&token, 1}, &logits);
      ASSERT_TRUE(s.ok()) << s << " at " << n;
      max_used = std::max(max_used, r->blocks().num_used_blocks());
      ASSERT_LE(r->blocks().num_used_blocks(), bound) << "at " << n;
    }
    EXPECT_EQ(r->tokens(1).size(), 4u * context);
    EXPECT_EQ(max_used, bound);
    ASSERT_TRUE(r->blocks().CheckInvariants().ok());
  }

  // The engine runs such a request to max_tokens past the context; without
  // sinks the same request ends at the context length.
  for (const bool with_sinks : {false, true}) {
    EngineOptions e;
    e.runner.block_size = kBlockSize;
    e.runner.num_blocks = 64;
    e.runner.num_threads = 2;
    if (with_sinks) {
      e.runner.attention_sinks = sinks;
      e.runner.sink_window = window;
    }
    auto engine = LlmEngine::Create(*m, e);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EngineRequest req;
    req.prompt = Prompt(8, 5);
    req.sampling.temperature = 0;
    req.sampling.ignore_eos = true;
    req.sampling.max_tokens = 4 * context - 8;
    int generated = 0;
    RequestFinish finish = RequestFinish::kNone;
    req.on_output = [&](const RequestOutput& out) {
      generated += out.token_ids.size();
      if (out.finish != RequestFinish::kNone) finish = out.finish;
    };
    ASSERT_TRUE((*engine)->AddRequest(std::move(req)).ok());
    ASSERT_TRUE((*engine)->RunUntilIdle().ok());
    EXPECT_EQ(finish, RequestFinish::kLength);
    EXPECT_EQ(generated, with_sinks ? 4 * context - 8 : context - 8);
    EXPECT_EQ((*engine)->runner().blocks().num_used_blocks(), 0);
  }
}

// Within the context, attention sinks give the logits of a reference that
// masks every key but the sinks and the recent window; past the point where
// that starts to matter they differ from full attention.
TEST(AttentionSinksTest, LogitsEqualExplicitlyMaskedReference) {
  auto m = OpenTinyModel(TinyOptions(0), "sinks_ref.gguf");
  ASSERT_NE(m, nullptr);
  const int32_t sinks = 3, window = 9;  // neither a multiple of the block
  const int vocab = m->config().vocab_size;
  ModelRunnerOptions o;
  o.attention_sinks = sinks;
  o.sink_window = window;
  o.max_batch_tokens = 8;
  auto r = MakeRunner(*m, o);
  const std::vector<int32_t> prompt = Prompt(20, 6);
  std::vector<std::vector<float>> rows;
  const std::vector<int32_t> tokens = Generate(*r, 1, prompt, 60, &rows);
  ASSERT_EQ(tokens.size(), 60u);
  // Sinks and window only apply to what the runner computes: also to the
  // prompt, so the reference masks every position the same way.
  const std::vector<float> want = ReferenceLogits(
      *m, tokens, prompt.size(),
      [](int, int32_t q, int32_t k) { return k < sinks || q - k < window; });
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t pos = prompt.size() - 1 + i;
    EXPECT_LE(RelativeDiff(rows[i], absl::MakeConstSpan(want).subspan(
                                        pos * vocab, vocab)),
              kTolerance)
        << "position " << pos;
  }
  EXPECT_LE(r->blocks().num_used_blocks(),
            (sinks + window + kBlockSize - 1) / kBlockSize + 1);
  auto plain = MakeRunner(*m, {});
  std::vector<std::vector<float>> plain_rows;
  Generate(*plain, 1, prompt, 22, &plain_rows);
  EXPECT_GT(RelativeDiff(plain_rows[0], rows[0]), 100 * kTolerance);
}

TEST(AttentionSinksTest, RefusesBadOptions) {
  auto m = OpenTinyModel(TinyOptions(0), "sinks_bad.gguf");
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(
      ModelRunner::Create(*m, {.attention_sinks = 4, .sink_window = 0}).ok());
  EXPECT_FALSE(ModelRunner::Create(*m, {.sink_window = -1}).ok());
}

}  // namespace
}  // namespace pdserve::engine
