// The engine against llama.cpp, the reference implementation, on the same
// GGUF files (engine/testdata/llamacpp_reference.txt, produced by
// tools/gen_engine_goldens.py):
//  - tiny random-weight models in every supported block format and in the
//    llama, llama3 (rope_freqs) and qwen2 variants: next-token logits within
//    a small tolerance, then greedy tokens identical;
//  - the default model (when PDSERVE_DEFAULT_MODEL is set): prompt text to
//    token ids (raw and through the chat template) and greedy continuations,
//    all identical, with every case in one engine at once (so through
//    batched prefill and decode).
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "engine/llm_engine.h"
#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "kernels/matmul.h"
#include "model/default_model.h"
#include "model/model.h"
#include "model/tiny_model.h"

namespace pdserve::engine {
namespace {

struct ReferenceCase {
  std::string name;
  std::string model;  // "default" or "preset <name>"
  std::string prompt_text;
  std::string chat_user;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> greedy_ids;
  std::vector<float> logits;
  // llama.cpp's best-minus-second-best logit at each greedy step.
  std::vector<float> top2_margins;
};

std::vector<ReferenceCase> LoadCases() {
  const std::string path = std::string(std::getenv("TEST_SRCDIR")) +
                           "/pdserve/engine/testdata/llamacpp_reference.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<ReferenceCase> cases;
  std::string line;
  ReferenceCase c;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    std::string rest;
    std::getline(fields, rest);
    if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
    std::istringstream values(rest);
    if (key == "case") {
      c = ReferenceCase();
      c.name = rest;
    } else if (key == "model") {
      c.model = rest;
    } else if (key == "prompt_hex") {
      c.prompt_text = absl::HexStringToBytes(rest);
    } else if (key == "chat_user_hex") {
      c.chat_user = absl::HexStringToBytes(rest);
    } else if (key == "prompt_ids") {
      for (int32_t v; values >> v;) c.prompt_ids.push_back(v);
    } else if (key == "greedy_ids") {
      for (int32_t v; values >> v;) c.greedy_ids.push_back(v);
    } else if (key == "logits") {
      for (float v; values >> v;) c.logits.push_back(v);
    } else if (key == "top2_margins") {
      for (float v; values >> v;) c.top2_margins.push_back(v);
    } else if (key == "end") {
      cases.push_back(c);
    }
  }
  return cases;
}

// Greedy generation of every request together in one engine.
std::vector<std::vector<int32_t>> GreedyAll(
    const model::Model& m, const std::vector<const ReferenceCase*>& cases,
    v1::KvDtype kv_dtype = v1::KV_DTYPE_F16,
    kernels::PackedArithmetic arithmetic = kernels::PackedArithmetic::kGgml) {
  EngineOptions o;
  o.runner.kv_cache_bytes = int64_t{64} << 20;
  o.runner.kv_dtype = kv_dtype;
  o.runner.matmul_arithmetic = arithmetic;
  auto engine = LlmEngine::Create(m, o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<int32_t>> out(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EngineRequest r;
    r.prompt = cases[i]->prompt_ids;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = cases[i]->greedy_ids.size();
    r.on_output = [&out, i](const RequestOutput& o) {
      out[i].insert(out[i].end(), o.token_ids.begin(), o.token_ids.end());
    };
    EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
  }
  EXPECT_TRUE((*engine)->RunUntilIdle().ok());
  return out;
}

TEST(ReferenceTest, TinyModelsMatchLlamaCppLogitsAndGreedyTokens) {
  std::vector<ReferenceCase> cases = LoadCases();
  int tiny = 0;
  for (const ReferenceCase& c : cases) {
    if (c.model.rfind("preset ", 0) != 0) continue;
    ++tiny;
    SCOPED_TRACE(c.name);
    auto options = model::TinyModelPreset(c.model.substr(7));
    ASSERT_TRUE(options.ok()) << options.status();
    const std::string path =
        std::string(std::getenv("TEST_TMPDIR")) + "/" + c.name + ".gguf";
    ASSERT_TRUE(model::WriteTinyModel(*options, path).ok());
    auto m = model::Model::Open(path);
    ASSERT_TRUE(m.ok()) << m.status();

    ModelRunnerOptions ro;
    ro.num_blocks = 32;
    auto runner = ModelRunner::Create(**m, ro);
    ASSERT_TRUE(runner.ok());
    auto pre = (*runner)->Prefill({{1, c.prompt_ids}});
    ASSERT_TRUE(pre.ok()) << pre.status();
    const std::vector<float>& ours = (*pre)[0].logits;
    ASSERT_EQ(ours.size(), c.logits.size());
    // Tolerance: the two engines differ only in float summation order
    // (SIMD lanes in ggml, fixed partial sums here), so logits agree to
    // a few 1e-4 of their spread; a wrong formula is off by whole units.
    float lo = c.logits[0], hi = c.logits[0], max_diff = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      lo = std::min(lo, c.logits[i]);
      hi = std::max(hi, c.logits[i]);
      max_diff = std::max(max_diff, std::abs(ours[i] - c.logits[i]));
    }
    // The exception: llama.cpp runs this model's Q4_K matrices through its
    // repacked (CPU_REPACK, interleaved 8x8) kernels, which sum in another
    // order; with repacking off (use_extra_bufts = false) llama.cpp's own
    // logits move from its default ones by about as much. Our K-quant dot
    // products equal ggml_vec_dot_*_q8_K bit for bit
    // (tools/check_ggml_dots.py). Greedy tokens below must still agree.
    const float tolerance = c.model == "preset qwen2-q4_k" ? 1e-2f : 2e-3f;
    EXPECT_LT(max_diff, tolerance * (hi - lo)) << "spread " << hi - lo;
    std::printf("%-22s max |logit - llama.cpp| = %.3g (%.2g of the spread)\n",
                c.name.c_str(), max_diff, max_diff / (hi - lo));

    auto greedy = GreedyAll(**m, {&c});
    EXPECT_EQ(greedy[0], c.greedy_ids);
  }
  EXPECT_GE(tiny, 10) << "reference file has too few tiny-model cases";
}

// The default model, opened once for the tests that use it; null when
// there is none (model::FindDefaultModel; a set but unopenable
// PDSERVE_DEFAULT_MODEL fails).
const model::Model* DefaultModel() {
  static const model::Model* const kModel = []() -> const model::Model* {
    const std::string path = model::FindDefaultModel();
    if (path.empty()) return nullptr;
    auto m = model::Model::Open(path);
    if (!m.ok()) {
      ADD_FAILURE() << m.status();
      return nullptr;
    }
    return m->release();
  }();
  return kModel;
}

// The cases of `all` that run on the default model.
std::vector<const ReferenceCase*> DefaultModelCases(
    const std::vector<ReferenceCase>& all) {
  std::vector<const ReferenceCase*> cases;
  for (const ReferenceCase& c : all) {
    if (c.model == "default") cases.push_back(&c);
  }
  return cases;
}

TEST(ReferenceTest, DefaultModelMatchesLlamaCppTokenForToken) {
  const model::Model* m = DefaultModel();
  if (m == nullptr) GTEST_SKIP() << model::kNoDefaultModel;
  const std::vector<ReferenceCase> all = LoadCases();
  const std::vector<const ReferenceCase*> cases = DefaultModelCases(all);
  ASSERT_GE(cases.size(), 8u);
  for (const ReferenceCase* c : cases) {
    SCOPED_TRACE(c->name);
    if (!c->prompt_text.empty()) {
      EXPECT_EQ(m->EncodePrompt(c->prompt_text), c->prompt_ids);
    }
    if (!c->chat_user.empty()) {
      auto ids = m->EncodeChat({{"user", c->chat_user}});
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, c->prompt_ids);
    }
  }
  // Greedy continuations: identical to llama.cpp's, token for token. This
  // holds because every operation follows ggml's arithmetic (see
  // cpu_backend.h); the model has many near-ties (llama.cpp's top two
  // logits within 0.1 of each other at some step of most prompts), so any
  // difference in rounding shows up here. On failure the message gives
  // llama.cpp's margin at the first differing token.
  auto greedy = GreedyAll(*m, cases);
  int identical = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ReferenceCase& c = *cases[i];
    const std::vector<int32_t>& ours = greedy[i];
    ASSERT_EQ(c.top2_margins.size(), c.greedy_ids.size()) << c.name;
    size_t k = 0;
    while (k < ours.size() && k < c.greedy_ids.size() &&
           ours[k] == c.greedy_ids[k]) {
      ++k;
    }
    if (k == c.greedy_ids.size() && ours.size() == k) {
      ++identical;
      std::printf("%-8s identical to llama.cpp (%zu tokens)\n", c.name.c_str(),
                  k);
      continue;
    }
    ASSERT_LT(k, c.greedy_ids.size()) << c.name << ": we generated more";
    ADD_FAILURE() << c.name << " differs from llama.cpp from token " << k
                  << " of " << c.greedy_ids.size()
                  << " (llama.cpp's top-2 logit margin there: "
                  << c.top2_margins[k] << ")";
  }
  std::printf("%d of %zu continuations identical to llama.cpp\n", identical,
              cases.size());
}

// For each case, how many of llama.cpp's greedy tokens `greedy` repeats
// before the first difference (printed); the sums over all cases.
std::pair<size_t, size_t> TokensBeforeTheFirstDifference(
    const std::vector<const ReferenceCase*>& cases,
    const std::vector<std::vector<int32_t>>& greedy, const char* what) {
  size_t agreed = 0, total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t>& want = cases[i]->greedy_ids;
    size_t k = 0;
    while (k < greedy[i].size() && k < want.size() && greedy[i][k] == want[k]) {
      ++k;
    }
    std::printf("%-8s %s: first %zu of %zu tokens as llama.cpp\n",
                cases[i]->name.c_str(), what, k, want.size());
    agreed += k;
    total += want.size();
  }
  std::printf("%s: %zu of %zu tokens before the first difference\n", what,
              agreed, total);
  return {agreed, total};
}

// The FP8 KV cache changes the numbers (each K and V value rounded to 3
// mantissa bits; this model's K reach about 20 and V about 5, well inside
// E4M3's 448), so token-for-token agreement with llama.cpp's fp16 cache is
// not expected all the way; the continuations must still follow llama.cpp's
// for a good part.
TEST(ReferenceTest, DefaultModelWithFp8KvCacheStaysCloseToLlamaCpp) {
  const model::Model* m = DefaultModel();
  if (m == nullptr) GTEST_SKIP() << model::kNoDefaultModel;
  const std::vector<ReferenceCase> all = LoadCases();
  const std::vector<const ReferenceCase*> cases = DefaultModelCases(all);
  const auto greedy = GreedyAll(*m, cases, v1::KV_DTYPE_FP8_E4M3);
  const auto [agreed, total] =
      TokensBeforeTheFirstDifference(cases, greedy, "fp8 KV");
  // Measured: 253 of 528 (deterministic: every kernel is bit-exact across
  // CPUs and thread counts); two prompts differ from their first token, a
  // near-tie. A broken fp8 path agrees on almost nothing.
  EXPECT_GE(agreed * 10, total * 4);
}

// Block sums (kernels::PackedArithmetic::kBlockSums) round each quantized
// product once per block instead of in ggml's eight lanes: logits move by
// a few ulps, and greedy tokens part from llama.cpp's at the near-ties.
// Where the CPU has no packed kernels (no AVX-512 VNNI) the products keep
// ggml's order and everything agrees.
TEST(ReferenceTest, DefaultModelInBlockSumsStaysCloseToLlamaCpp) {
  const model::Model* m = DefaultModel();
  if (m == nullptr) GTEST_SKIP() << model::kNoDefaultModel;
  const std::vector<ReferenceCase> all = LoadCases();
  const std::vector<const ReferenceCase*> cases = DefaultModelCases(all);
  const auto greedy = GreedyAll(*m, cases, v1::KV_DTYPE_F16,
                                kernels::PackedArithmetic::kBlockSums);
  const auto [agreed, total] =
      TokensBeforeTheFirstDifference(cases, greedy, "block sums");
  // Measured on AVX-512 VNNI: 279 of 528, as far as the fp8 cache gets
  // (two prompts part at their first token, three agree throughout). A
  // kernel that summed wrongly would agree on almost nothing.
  EXPECT_GE(agreed * 10, total * 4);
}

TEST(ReferenceTest, DefaultModelKnowsTheCapitalOfFrance) {
  const model::Model* m = DefaultModel();
  if (m == nullptr) GTEST_SKIP() << model::kNoDefaultModel;
  EngineOptions o;
  o.runner.kv_cache_bytes = int64_t{16} << 20;
  auto engine = LlmEngine::Create(*m, o);
  ASSERT_TRUE(engine.ok());
  EngineRequest r;
  r.prompt = m->EncodePrompt("The capital of France is");
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 8;
  std::string text;
  r.on_output = [&](const RequestOutput& out) { text += out.text; };
  ASSERT_TRUE((*engine)->AddRequest(std::move(r)).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_NE(text.find(" Paris"), std::string::npos) << text;
}

}  // namespace
}  // namespace pdserve::engine
