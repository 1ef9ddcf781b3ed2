#include "bench/pipe_ceiling.h"

#include <cmath>

#include "gtest/gtest.h"
#include "model/testing/tiny_model_testing.h"

namespace pdserve::bench {
namespace {

using kernels::GgmlType;
using kernels::PackedArithmetic;

bool HasVnni() {
  return __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("avx512bw");
}

TEST(PackedKernelMixTest, NamesEachFormatsMixInEachArithmetic) {
  PipeMix mix;
  ASSERT_TRUE(PackedKernelMix(GgmlType::kQ4_1, PackedArithmetic::kGgml, &mix));
  EXPECT_EQ(mix, PipeMix::kGgmlLanesWithMins);
  ASSERT_TRUE(
      PackedKernelMix(GgmlType::kQ4_1, PackedArithmetic::kBlockSums, &mix));
  EXPECT_EQ(mix, PipeMix::kBlockSumsWithMins);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    ASSERT_TRUE(PackedKernelMix(type, PackedArithmetic::kGgml, &mix));
    EXPECT_EQ(mix, PipeMix::kGgmlLanes);
    ASSERT_TRUE(PackedKernelMix(type, PackedArithmetic::kBlockSums, &mix));
    EXPECT_EQ(mix, PipeMix::kBlockSums);
  }
  EXPECT_FALSE(PackedKernelMix(GgmlType::kQ4_K, PackedArithmetic::kGgml, &mix));
  EXPECT_FALSE(PackedKernelMix(GgmlType::kF16, PackedArithmetic::kGgml, &mix));
}

// Multiply-adds per block: every token of the kernel's pass (eight in block
// sums, two in ggml's order) over 16 rows of 32.
TEST(RunPipeMixTest, CountsThePassTokensMultiplyAdds) {
  if (!HasVnni()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  float sink[16];
  EXPECT_EQ(RunPipeMix(PipeMix::kBlockSumsWithMins, 10, sink),
            10 * 8 * 16 * 32);
  EXPECT_EQ(RunPipeMix(PipeMix::kGgmlLanesWithMins, 10, sink),
            10 * 2 * 16 * 32);
  for (float v : sink) EXPECT_TRUE(std::isfinite(v));
}

// The model's products per token: seven per layer and the output head (the
// tied embedding).
double ExpectedMacs(const model::Model& m) {
  const model::ModelConfig& c = m.config();
  const double hidden = c.hidden_size, ffn = c.ffn_size;
  const double q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  return c.num_layers *
             (q * hidden + 2 * kv * hidden + hidden * q + 3 * ffn * hidden) +
         static_cast<double>(c.vocab_size) * hidden;
}

TEST(MeasureProductsCeilingTest, CountsEveryProductAndTimesItsMix) {
  model::TinyModelOptions options;
  options.matrix_type = GgmlType::kQ4_1;
  options.embedding_type = GgmlType::kQ8_0;
  std::unique_ptr<model::Model> m =
      model::testing::OpenTinyModel(options, "ceiling.gguf");
  ASSERT_NE(m, nullptr);
  common::ThreadPool pool(1);
  const ProductsCeiling c =
      MeasureProductsCeiling(m->weights(), PackedArithmetic::kBlockSums, pool);
  EXPECT_EQ(c.macs_per_token, ExpectedMacs(*m));
  if (!HasVnni()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  EXPECT_GT(c.gmacs, 0);
  EXPECT_NEAR(c.tokens_per_s * c.macs_per_token / 1e9, c.gmacs, 1e-6 * c.gmacs);
}

TEST(MeasureProductsCeilingTest, NoCeilingWhereAFormatHasNoMix) {
  // K-quant layers (no VNNI kernel) and a Q8_0 output head (one).
  model::TinyModelOptions options = *model::TinyModelPreset("llama-q4_k");
  options.embedding_type = GgmlType::kQ8_0;
  std::unique_ptr<model::Model> m =
      model::testing::OpenTinyModel(options, "ceiling_q4_k.gguf");
  ASSERT_NE(m, nullptr);
  common::ThreadPool pool(1);
  const ProductsCeiling c =
      MeasureProductsCeiling(m->weights(), PackedArithmetic::kGgml, pool);
  EXPECT_EQ(c.macs_per_token, ExpectedMacs(*m));
  EXPECT_EQ(c.tokens_per_s, 0);
  EXPECT_EQ(c.gmacs, 0);
}

}  // namespace
}  // namespace pdserve::bench
