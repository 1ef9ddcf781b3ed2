#include "bench/pipe_ceiling.h"

#include <map>
#include <memory>

#include "gtest/gtest.h"
#include "model/testing/tiny_model_testing.h"

namespace pdserve::bench {
namespace {

using kernels::GgmlType;
using kernels::PackedArithmetic;

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

// The model's products per token: seven per layer and the output head (the
// tied embedding).
double ExpectedMacs(const model::Model& m) {
  const model::ModelConfig& c = m.config();
  const double hidden = c.hidden_size, ffn = c.ffn_size;
  const double q = c.q_size(), kv = c.kv_size();
  return c.num_layers *
             (q * hidden + 2 * kv * hidden + hidden * q + 3 * ffn * hidden) +
         static_cast<double>(c.vocab_size) * hidden;
}

// Q4_1 layers and a Q8_0 head in block sums, except the down projection,
// whose rows (ffn_size wide) are too wide to pack: it keeps ggml's order.
TEST(MeasureProductsCeilingTest, CountsEachProductInItsKernelsMix) {
  model::TinyModelOptions options;
  options.matrix_type = GgmlType::kQ4_1;
  options.embedding_type = GgmlType::kQ8_0;
  options.ffn_size = 16384 + 32;
  std::unique_ptr<model::Model> m =
      model::testing::OpenTinyModel(options, "ceiling.gguf");
  ASSERT_NE(m, nullptr);
  const model::ModelConfig& config = m->config();
  common::ThreadPool pool(1);
  const ProductsCeiling c =
      MeasureProductsCeiling(m->weights(), PackedArithmetic::kBlockSums, pool);
  EXPECT_EQ(c.macs_per_token, ExpectedMacs(*m));
  const double hidden = config.hidden_size, ffn = config.ffn_size;
  const double down = config.num_layers * hidden * ffn;
  const std::map<PipeMix, double> expected = {
      {PipeMix::kBlockSumsWithMins,
       c.macs_per_token - down - config.vocab_size * hidden},
      {PipeMix::kGgmlLanesWithMins, down},
      {PipeMix::kBlockSums, config.vocab_size * hidden}};
  EXPECT_EQ(c.macs_by_mix, expected);
  if (!PipeCeilingSupported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  EXPECT_GT(c.tokens_per_s, 0);
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
