// The forward pass and the Prefill/Decode entry points on tiny random-weight
// models: every way of cutting the work (one token at a time, whole-prompt
// prefill, chunked prefill, several sequences in one batch, scattered block
// ids, other thread counts, prefix-cache hits) must give the same logits.
//
// They give bitwise-identical logits, not merely close ones: every token's
// activations are quantized on their own, every output element is one dot
// product computed in a fixed order, and attention for a (token, head) pair
// reads the same cached values in the same order whatever else is in the
// batch. So the tolerance here is zero, and any batching bug shows.
//
// One exception, by design: with llama.cpp prompt numerics (the default),
// prompt tokens sum attention products in llama.cpp's batched order and
// generated tokens in its single-token order, so a prompt fed one token at
// a time (as "generated" tokens) differs from a prefilled one by float
// rounding. Those comparisons allow kLlamaCppOrderTolerance of the logits'
// spread; every other comparison stays bitwise in both modes.
#include "engine/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/ggml_type.h"
#include "kernels/matmul.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/tiny_model.h"

namespace pdserve::engine {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::unique_ptr<model::Model> OpenTiny(const model::TinyModelOptions& o,
                                       const std::string& name) {
  const std::string path = TempPath(name);
  absl::Status written = model::WriteTinyModel(o, path);
  EXPECT_TRUE(written.ok()) << written;
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Open(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// Relative to the spread of the logits: summation-order differences in
// attention are ~1e-6 of it; a real error is orders of magnitude larger.
constexpr float kLlamaCppOrderTolerance = 1e-4f;

// Bitwise equal, or (when `exact` is false) equal within
// kLlamaCppOrderTolerance of want's spread.
void ExpectSameLogits(const std::vector<float>& got,
                      const std::vector<float>& want, bool exact,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (exact) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  float lo = want[0], hi = want[0], max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    lo = std::min(lo, want[i]);
    hi = std::max(hi, want[i]);
    max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
  }
  EXPECT_LE(max_diff, kLlamaCppOrderTolerance * (hi - lo)) << what;
}

std::unique_ptr<ModelRunner> MakeRunner(const model::Model& m,
                                        ModelRunnerOptions o = {}) {
  if (o.num_blocks == 0) o.num_blocks = 64;
  if (o.block_size == 16) o.block_size = 4;  // small blocks: more paging
  auto r = ModelRunner::Create(m, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

std::vector<int32_t> Prompt(int n, int salt, int vocab) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + salt * 101 + 5) % vocab;
  return p;
}

// Logits after each token, feeding the sequence one token at a time
// (a 1-token prefill, then decode steps).
std::vector<std::vector<float>> OneAtATime(const model::Model& m,
                                           const std::vector<int32_t>& seq,
                                           ModelRunnerOptions o = {}) {
  o.enable_prefix_cache = false;
  auto r = MakeRunner(m, o);
  std::vector<std::vector<float>> out;
  std::vector<int32_t> first = {seq[0]};
  auto pre = r->Prefill({{1, first}});
  EXPECT_TRUE(pre.ok()) << pre.status();
  out.push_back((*pre)[0].logits);
  for (size_t i = 1; i < seq.size(); ++i) {
    std::vector<float> logits;
    absl::Status s = r->Decode({1}, {seq[i]}, &logits);
    EXPECT_TRUE(s.ok()) << s;
    out.push_back(logits);
  }
  return out;
}

// Parameters: a tiny model preset, whether llama.cpp prompt numerics are
// on, and the packed matrices' arithmetic.
class ModelRunnerTest
    : public ::testing::TestWithParam<
          std::tuple<std::string, bool, kernels::PackedArithmetic>> {
 protected:
  bool llamacpp() const { return std::get<1>(GetParam()); }
  bool block_sums() const {
    return std::get<2>(GetParam()) == kernels::PackedArithmetic::kBlockSums;
  }
  // Prompt-vs-one-token-at-a-time comparisons are exact only without
  // llama.cpp prompt numerics.
  bool exact_vs_one_at_a_time() const { return !llamacpp(); }
  ModelRunnerOptions RunnerOptions() const {
    ModelRunnerOptions o;
    o.llamacpp_prompt_numerics = llamacpp();
    o.matmul_arithmetic = std::get<2>(GetParam());
    return o;
  }
  model::TinyModelOptions Options() const {
    auto o = model::TinyModelPreset(std::get<0>(GetParam()));
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : model::TinyModelOptions();
  }
};

TEST_P(ModelRunnerTest, EveryBatchingGivesTheSameLogitsAsOneTokenAtATime) {
  auto m = OpenTiny(Options(), "runner_equivalence.gguf");
  ASSERT_NE(m, nullptr);
  const int vocab = m->config().vocab_size;
  const std::vector<int32_t> a = Prompt(23, 1, vocab);
  const std::vector<int32_t> b = Prompt(9, 2, vocab);
  const auto ref_a = OneAtATime(*m, a, RunnerOptions());
  const auto ref_b = OneAtATime(*m, b, RunnerOptions());

  // Sanity: the logits are finite and not all equal (a dead model would
  // make every comparison pass).
  for (float v : ref_a.back()) ASSERT_TRUE(std::isfinite(v));
  EXPECT_NE(ref_a.back()[0], ref_a.back()[1]);

  const bool exact = exact_vs_one_at_a_time();
  // Whole-prompt prefill of two prompts in one call.
  std::vector<float> prefill_a, prefill_b;
  {
    auto r = MakeRunner(*m, RunnerOptions());
    auto out = r->Prefill({{1, a}, {2, b}});
    ASSERT_TRUE(out.ok()) << out.status();
    prefill_a = (*out)[0].logits;
    prefill_b = (*out)[1].logits;
    ExpectSameLogits(prefill_a, ref_a.back(), exact, "prefill a");
    ExpectSameLogits(prefill_b, ref_b.back(), exact, "prefill b");
  }
  // Chunked prefill: 5 tokens per pass, chunks of both prompts packed
  // (a 1-token chunk among them): bitwise equal to the whole prefill.
  {
    ModelRunnerOptions o = RunnerOptions();
    o.max_batch_tokens = 5;
    auto r = MakeRunner(*m, o);
    auto out = r->Prefill({{1, a}, {2, b}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].logits, prefill_a);
    EXPECT_EQ((*out)[1].logits, prefill_b);
  }
  // Logits for every prompt position in one pass, one thread.
  {
    ModelRunnerOptions o = RunnerOptions();
    o.num_threads = 1;
    auto r = MakeRunner(*m, o);
    ASSERT_TRUE(r->AddSequence(7, a).ok());
    std::vector<float> logits;
    ASSERT_TRUE(
        r->Run({{7, static_cast<int32_t>(a.size()), LogitsMode::kAll}}, &logits)
            .ok());
    ASSERT_EQ(logits.size(), a.size() * vocab);
    for (size_t i = 0; i < a.size(); ++i) {
      std::vector<float> row(logits.begin() + i * vocab,
                             logits.begin() + (i + 1) * vocab);
      ExpectSameLogits(row, ref_a[i], exact, "position " + std::to_string(i));
    }
    EXPECT_EQ(std::vector<float>(logits.end() - vocab, logits.end()),
              prefill_a);
  }
  // Decode steps of two sequences batched together, their blocks
  // interleaved in the pool (scattered block tables): decode arithmetic,
  // bitwise equal to one sequence alone in both modes.
  {
    auto r = MakeRunner(*m, RunnerOptions());
    std::vector<int32_t> a0 = {a[0]}, b0 = {b[0]};
    ASSERT_TRUE(r->Prefill({{1, a0}, {2, b0}}).ok());
    for (size_t i = 1; i < b.size(); ++i) {
      std::vector<float> logits;
      ASSERT_TRUE(r->Decode({1, 2}, {a[i], b[i]}, &logits).ok());
      EXPECT_EQ(std::vector<float>(logits.begin(), logits.begin() + vocab),
                ref_a[i]);
      EXPECT_EQ(std::vector<float>(logits.begin() + vocab, logits.end()),
                ref_b[i]);
    }
    auto table_a = r->blocks().CopyBlockTable(1);
    auto table_b = r->blocks().CopyBlockTable(2);
    EXPECT_EQ(table_b[1], table_a[1] + 1) << "blocks should interleave";
  }
}

TEST_P(ModelRunnerTest, PrefixCacheHitGivesTheSameLogitsAsAMiss) {
  auto m = OpenTiny(Options(), "runner_prefix.gguf");
  ASSERT_NE(m, nullptr);
  const int vocab = m->config().vocab_size;
  std::vector<int32_t> shared = Prompt(18, 3, vocab);
  std::vector<int32_t> first = shared, second = shared;
  first.push_back(11);
  second.push_back(12);
  second.push_back(13);

  auto r = MakeRunner(*m, RunnerOptions());  // block size 4
  auto out1 = r->Prefill({{1, first}});
  ASSERT_TRUE(out1.ok());
  EXPECT_EQ((*out1)[0].cached_tokens, 0);
  r->Release(1);
  auto out2 = r->Prefill({{2, second}});
  ASSERT_TRUE(out2.ok());
  EXPECT_EQ((*out2)[0].cached_tokens, 16);  // four full blocks of the 18
  // Bitwise equal to the same prompt prefilled from scratch.
  ModelRunnerOptions cold = RunnerOptions();
  cold.enable_prefix_cache = false;
  auto fresh = MakeRunner(*m, cold)->Prefill({{3, second}});
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*out2)[0].logits, (*fresh)[0].logits);
  ExpectSameLogits((*out2)[0].logits,
                   OneAtATime(*m, second, RunnerOptions()).back(),
                   exact_vs_one_at_a_time(), "prefix hit vs one at a time");
}

TEST_P(ModelRunnerTest, ResultsDoNotDependOnThreadCount) {
  auto m = OpenTiny(Options(), "runner_threads.gguf");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> a = Prompt(30, 4, m->config().vocab_size);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    ModelRunnerOptions o = RunnerOptions();
    o.num_threads = threads;
    auto r = MakeRunner(*m, o);
    auto out = r->Prefill({{1, a}});
    ASSERT_TRUE(out.ok());
    results.push_back((*out)[0].logits);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// Weights repacked at load (the packed AVX-512 kernels, where this CPU has
// them: one token for decode, two at a time for a prompt) against the GGUF
// layout's kernels: the same logits, bit for bit. (Without a packed kernel
// for this CPU or format both runners take the GGUF path.) In block sums,
// the packed matrices round differently: logits close to the GGUF layout's,
// and, where this CPU packs the model's matrices, not equal to them.
TEST_P(ModelRunnerTest, PackedWeightsGiveTheGgufLayoutsLogits) {
  auto m = OpenTiny(Options(), "runner_packed.gguf");
  ASSERT_NE(m, nullptr);
  const int vocab = m->config().vocab_size;
  const std::vector<int32_t> prompt = Prompt(29, 6, vocab);
  std::vector<std::vector<float>> results[2];
  for (const bool pack : {true, false}) {
    ModelRunnerOptions o = RunnerOptions();
    o.pack_weights = pack;
    auto r = MakeRunner(*m, o);
    auto out = r->Prefill({{1, prompt}});
    ASSERT_TRUE(out.ok()) << out.status();
    results[pack].push_back((*out)[0].logits);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> logits;
      ASSERT_TRUE(r->Decode({1}, {(step * 7 + 3) % vocab}, &logits).ok());
      results[pack].push_back(logits);
    }
  }
  ASSERT_EQ(results[true].size(), 4u);
  for (size_t i = 0; i < results[true].size(); ++i) {
    const std::string what =
        i == 0 ? "the prompt" : "decode step " + std::to_string(i);
    if (!block_sums()) {
      EXPECT_EQ(results[true][i], results[false][i]) << what;
      continue;
    }
    ExpectSameLogits(results[true][i], results[false][i], /*exact=*/false,
                     what);
    // Where the CPU packs Q4_1 (AVX-512 VNNI), llama-q4_1's logits move.
    // (Q4_K has no packed form; qwen2-q8_0's matrices do change in their
    // last bits, but its layers add outputs far smaller than its residual
    // stream, which rounds the differences away: 0 of 274 logits moved.)
    const uint8_t zeros[16 * 20] = {};
    if (std::get<0>(GetParam()) == "llama-q4_1" &&
        kernels::PackedMatrix::Pack(kernels::GgmlType::kQ4_1, zeros, 16, 32) !=
            nullptr) {
      EXPECT_NE(results[true][i], results[false][i])
          << what << ": block sums changed nothing";
    }
  }
}

// One model per architecture variant, in different block formats.
// An FP8 KV cache: twice the blocks in the same bytes, logits close to the
// fp16 cache's but not equal (the cache really holds rounded values), and
// the same logits whether the prompt is prefilled or fed token by token
// (values are rounded once, when stored).
TEST_P(ModelRunnerTest, Fp8KvCacheHoldsTwiceTheTokensAndStaysClose) {
  auto m = OpenTiny(Options(), "runner_fp8.gguf");
  ASSERT_NE(m, nullptr);
  ModelRunnerOptions fp16 = RunnerOptions();
  fp16.kv_cache_bytes = int64_t{1} << 20;
  ModelRunnerOptions fp8 = fp16;
  fp8.kv_dtype = v1::KV_DTYPE_FP8_E4M3;
  {
    auto a = ModelRunner::Create(*m, fp16);
    auto b = ModelRunner::Create(*m, fp8);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*b)->blocks().stats().total_blocks,
              2 * (*a)->blocks().stats().total_blocks);
  }
  const int vocab = m->config().vocab_size;
  const std::vector<int32_t> seq = Prompt(24, 3, vocab);
  const auto want = OneAtATime(*m, seq, fp16);
  const auto got = OneAtATime(*m, seq, fp8);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  bool any_different = false;
  int same_argmax = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    float lo = want[i][0], hi = want[i][0], diff = 0;
    for (int v = 0; v < vocab; ++v) {
      lo = std::min(lo, want[i][v]);
      hi = std::max(hi, want[i][v]);
      diff = std::max(diff, std::abs(got[i][v] - want[i][v]));
    }
    worst = std::max<double>(worst, diff / (hi - lo));
    any_different |= got[i] != want[i];
    same_argmax +=
        std::max_element(got[i].begin(), got[i].end()) - got[i].begin() ==
        std::max_element(want[i].begin(), want[i].end()) - want[i].begin();
  }
  std::printf(
      "fp8 KV: worst logit difference %.4f of the logit range, "
      "argmax equal at %d of %zu steps\n",
      worst, same_argmax, want.size());
  EXPECT_TRUE(any_different) << "the fp8 cache changed nothing";
  // Random tiny weights make logits touchy (0.07-0.18 of the range seen);
  // the real model's agreement is checked in reference_test.
  EXPECT_LE(worst, 0.3);
  EXPECT_GE(same_argmax, static_cast<int>(want.size()) * 2 / 3);
  // Prefilled at once: the same as token by token (exact where prompt
  // numerics do not switch the f16 order).
  auto r = MakeRunner(*m, fp8);
  ASSERT_NE(r, nullptr);
  auto out = r->Prefill({{7, seq}});
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectSameLogits((*out)[0].logits, got.back(), exact_vs_one_at_a_time(),
                   "fp8 prefill vs one at a time");
}

std::string RunnerTestName(
    const ::testing::TestParamInfo<
        std::tuple<std::string, bool, kernels::PackedArithmetic>>& p) {
  std::string name = std::get<0>(p.param);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name + (std::get<1>(p.param) ? "_llamacpp" : "_invariant") +
         (std::get<2>(p.param) == kernels::PackedArithmetic::kBlockSums
              ? "_block_sums"
              : "");
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelRunnerTest,
    ::testing::Combine(::testing::Values("llama-q4_1", "qwen2-q8_0",
                                         "llama3-q4_k"),
                       ::testing::Bool(),
                       ::testing::Values(kernels::PackedArithmetic::kGgml)),
    RunnerTestName);

// Block sums keep every invariance ggml's order has (batching, chunking,
// threads, the prefix cache, KV in fp8): the same tests, in that arithmetic.
INSTANTIATE_TEST_SUITE_P(
    BlockSums, ModelRunnerTest,
    ::testing::Combine(
        ::testing::Values("llama-q4_1", "qwen2-q8_0", "llama3-q4_k"),
        ::testing::Bool(),
        ::testing::Values(kernels::PackedArithmetic::kBlockSums)),
    RunnerTestName);

// Disaggregation at the engine level: the prompt's KV computed by one runner
// (a prefill worker), copied byte for byte into the blocks another runner
// reserved (a decode worker, here with part of the prompt already in its
// prefix cache), then decoded there: the same logits and tokens as one
// runner doing everything.
TEST(ModelRunnerTransferTest, KvFromAnotherRunnerDecodesIdentically) {
  auto m = OpenTiny({}, "runner_transfer.gguf");
  ASSERT_NE(m, nullptr);
  const int vocab = m->config().vocab_size;
  const std::vector<int32_t> prompt = Prompt(21, 8, vocab);
  auto argmax = [](const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) -
                                v.begin());
  };
  constexpr int kSteps = 10;

  // Reference: one runner, prefill then greedy decode.
  std::vector<std::vector<float>> want;
  {
    auto r = MakeRunner(*m);
    auto out = r->Prefill({{1, prompt}});
    ASSERT_TRUE(out.ok());
    want.push_back((*out)[0].logits);
    for (int i = 0; i < kSteps; ++i) {
      std::vector<float> logits;
      ASSERT_TRUE(r->Decode({1}, {argmax(want.back())}, &logits).ok());
      want.push_back(logits);
    }
  }

  auto prefill = MakeRunner(*m);
  auto decode = MakeRunner(*m);
  // The decode side already holds the first 8 prompt tokens (2 blocks).
  std::vector<int32_t> shared(prompt.begin(), prompt.begin() + 9);
  ASSERT_TRUE(decode->Prefill({{50, shared}}).ok());
  decode->Release(50);

  auto target = decode->ReserveForTransfer(7, prompt);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->cached_tokens, 8);
  // Nothing may compute a sequence whose KV is still on its way.
  std::vector<float> unused;
  EXPECT_EQ(decode->Decode({7}, {1}, &unused).code(),
            absl::StatusCode::kFailedPrecondition);

  auto out = prefill->Prefill({{1, prompt}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].logits, want[0]);
  const std::vector<BlockId> source = prefill->blocks().CopyBlockTable(1);
  KvCachePool& from = prefill->backend().kv_pool();
  KvCachePool& to = decode->backend().kv_pool();
  const uint32_t bs = from.layout().block_size_tokens();
  const uint64_t token_bytes = from.geometry().token_bytes();
  for (uint32_t layer = 0; layer < from.layout().num_layers(); ++layer) {
    for (int32_t p = target->cached_tokens;
         p < static_cast<int32_t>(prompt.size()); ++p) {
      for (auto half : {kv_layout::KvHalf::kKey, kv_layout::KvHalf::kValue}) {
        std::memcpy(to.Slot(layer, target->blocks[p / bs], half, p % bs),
                    from.Slot(layer, source[p / bs], half, p % bs),
                    token_bytes);
      }
    }
  }
  ASSERT_TRUE(decode->CompleteTransfer(7).ok());
  EXPECT_EQ(decode->CompleteTransfer(7).code(),
            absl::StatusCode::kFailedPrecondition);
  // The first decode step takes the token the prefill side sampled.
  std::vector<float> logits;
  ASSERT_TRUE(decode->Decode({7}, {argmax(want[0])}, &logits).ok());
  EXPECT_EQ(logits, want[1]);
  for (int i = 2; i <= kSteps; ++i) {
    ASSERT_TRUE(decode->Decode({7}, {argmax(logits)}, &logits).ok());
    EXPECT_EQ(logits, want[i]) << "step " << i;
  }
  // The transferred prompt is now in the decode side's prefix cache.
  EXPECT_EQ(decode->blocks().CountCachedPrefixBlocks(prompt), 5);
}

// The testing delay stands in for slower hardware: it adds at least the
// pass delay plus the token delay per token (a lower bound only: the sleep
// never ends early), and changes no logit.
TEST(ModelRunnerTestingDelayTest, AddsPassAndTokenDelayAndChangesNothing) {
  std::unique_ptr<model::Model> m =
      OpenTiny(model::TinyModelOptions(), "delay.gguf");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = Prompt(10, 3, m->config().vocab_size);
  ModelRunnerOptions delayed;
  delayed.testing_pass_delay = absl::Milliseconds(30);
  delayed.testing_token_delay = absl::Milliseconds(5);
  std::vector<float> plain_logits, delayed_logits;
  for (bool delay : {false, true}) {
    auto r = MakeRunner(*m, delay ? delayed : ModelRunnerOptions());
    ASSERT_NE(r, nullptr);
    const absl::Time start = absl::Now();
    auto out = r->Prefill({{1, prompt}});
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(out.ok()) << out.status();
    if (delay) {
      EXPECT_GE(took, absl::Milliseconds(30 + 10 * 5));
      delayed_logits = (*out)[0].logits;
    } else {
      plain_logits = (*out)[0].logits;
    }
  }
  EXPECT_EQ(delayed_logits, plain_logits);
}

TEST(ModelRunnerErrorsTest, RefusesBadInputCleanly) {
  auto m = OpenTiny({}, "runner_errors.gguf");
  ASSERT_NE(m, nullptr);
  ModelRunnerOptions o;
  o.num_blocks = 8;  // 32 tokens with 4-token blocks
  auto r = MakeRunner(*m, o);
  const int vocab = m->config().vocab_size;
  std::vector<int32_t> empty;
  EXPECT_EQ(r->Prefill({{1, empty}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad = {1, vocab};
  EXPECT_EQ(r->Prefill({{1, bad}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(m->config().context_length, 1);
  EXPECT_EQ(r->Prefill({{1, too_long}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Larger than the whole cache: can never run.
  std::vector<int32_t> huge = Prompt(33, 5, vocab);
  EXPECT_EQ(r->Prefill({{1, huge}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(r->HasSequence(1));
  EXPECT_EQ(r->blocks().num_free_blocks(), 8);
  // Fill the cache with two sequences; a third does not fit now, and
  // nothing stays allocated for it.
  std::vector<int32_t> fits_a = Prompt(16, 6, vocab);
  std::vector<int32_t> fits_b = Prompt(16, 7, vocab);
  ASSERT_TRUE(r->Prefill({{2, fits_a}, {3, fits_b}}).ok());
  std::vector<int32_t> more = Prompt(5, 8, vocab);
  EXPECT_EQ(r->Prefill({{4, more}}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(r->HasSequence(4));
  // A full cache refuses a decode step without changing the sequence.
  std::vector<float> logits;
  EXPECT_EQ(r->Decode({2}, {3}, &logits).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r->tokens(2).size(), 16u);
  r->Release(3);
  EXPECT_TRUE(r->Decode({2}, {3}, &logits).ok());
  EXPECT_TRUE(r->blocks().CheckInvariants().ok());
}

TEST(ModelLoadTest, RefusesBrokenModelFilesWithClearErrors) {
  const std::string path = TempPath("broken.gguf");
  ASSERT_TRUE(model::WriteTinyModel({}, path).ok());
  // Truncated.
  {
    std::string bytes;
    {
      FILE* f = fopen(path.c_str(), "rb");
      ASSERT_NE(f, nullptr);
      char buf[1 << 16];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
      fclose(f);
    }
    const std::string cut = TempPath("truncated.gguf");
    FILE* f = fopen(cut.c_str(), "wb");
    ASSERT_EQ(fwrite(bytes.data(), 1, bytes.size() / 2, f), bytes.size() / 2);
    fclose(f);
    auto m = model::Model::Open(cut);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(cut), std::string::npos) << m.status();
  }
  // A copy of the model without one tensor, and one with an architecture
  // we do not run.
  {
    auto src = model::GgufFile::Open(path);
    ASSERT_TRUE(src.ok());
    for (std::string variant : {"missing-tensor", "other-arch"}) {
      auto w = model::GgufWriter::Create();
      ASSERT_TRUE(w.ok());
      for (const auto& [key, value] : (*src)->metadata()) {
        if (key == "general.alignment") continue;
        if (variant == "other-arch" && key == "general.architecture") {
          ASSERT_TRUE((*w)->AddMetadata(key, "gptneox").ok());
          continue;
        }
        ASSERT_TRUE((*w)->AddMetadata(key, value).ok());
      }
      for (const model::GgufTensorInfo& t : (*src)->tensors()) {
        if (variant == "missing-tensor" && t.name == "blk.1.ffn_up.weight") {
          continue;
        }
        ASSERT_TRUE((*w)->AddTensor(t.name, t.dims, t.type,
                                    absl::MakeConstSpan(t.data, t.n_bytes))
                        .ok());
      }
      const std::string out = TempPath(variant + ".gguf");
      ASSERT_TRUE((*w)->WriteFile(out).ok());
      auto m = model::Model::Open(out);
      ASSERT_FALSE(m.ok()) << variant;
      const std::string expected =
          variant == "missing-tensor" ? "blk.1.ffn_up.weight" : "gptneox";
      EXPECT_NE(m.status().message().find(expected), std::string::npos)
          << m.status();
      EXPECT_NE(m.status().message().find(out), std::string::npos)
          << m.status();
    }
  }
  // Missing file.
  auto missing = model::Model::Open(TempPath("does-not-exist.gguf"));
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace pdserve::engine
