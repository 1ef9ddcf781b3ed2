#include "kv_layout/kv_layout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::kv_layout {
namespace {

using ::testing::HasSubstr;

// SmolLM2-135M: 30 layers, 3 KV heads of 64, f16, 16-token blocks.
v1::KvLayout SmolLm2Layout(uint32_t num_blocks) {
  v1::KvLayout layout;
  layout.set_layout_version(1);
  layout.set_model_fingerprint("smollm2-135m-q4_1");
  layout.set_num_layers(30);
  layout.set_num_kv_heads(3);
  layout.set_head_dim(64);
  layout.set_dtype(v1::KV_DTYPE_F16);
  layout.set_block_size_tokens(16);
  layout.set_num_blocks(num_blocks);
  return layout;
}

TEST(KvGeometryTest, SizesMatchHandComputedValues) {
  absl::StatusOr<KvGeometry> g = KvGeometry::FromProto(SmolLm2Layout(100));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->dtype_bytes(), 2u);
  EXPECT_EQ(g->token_bytes(), 384u);                   // 3 * 64 * 2
  EXPECT_EQ(g->block_bytes(), 12288u);                 // 2 * 16 * 384
  EXPECT_EQ(g->layer_stride(), 1228800u);              // 100 * 12288
  EXPECT_EQ(g->pool_bytes(), 36864000u);               // 30 * 1228800
  EXPECT_EQ(g->bytes_per_token_all_layers(), 23040u);  // 2 * 384 * 30
}

TEST(KvGeometryTest, OffsetsFollowTheLayerMajorOrder) {
  const KvGeometry g = *KvGeometry::FromProto(SmolLm2Layout(100));
  EXPECT_EQ(g.Offset(0, 0, KvHalf::kKey), 0u);
  EXPECT_EQ(g.Offset(0, 0, KvHalf::kValue), 6144u);
  EXPECT_EQ(g.Offset(0, 1, KvHalf::kKey), 12288u);
  EXPECT_EQ(g.Offset(1, 0, KvHalf::kKey), 1228800u);
  // 2*1228800 + 5*12288 + 6144 + 3*384
  EXPECT_EQ(g.Offset(2, 5, KvHalf::kValue, 3), 2526336u);
  // The last byte of the pool is the last byte of V of the last block.
  EXPECT_EQ(g.Offset(29, 99, KvHalf::kValue, 15) + g.token_bytes(),
            g.pool_bytes());
}

TEST(KvGeometryTest, RejectsInvalidLayouts) {
  v1::KvLayout layout = SmolLm2Layout(10);
  layout.set_layout_version(2);
  EXPECT_THAT(std::string(KvGeometry::FromProto(layout).status().message()),
              HasSubstr("version 2"));
  layout = SmolLm2Layout(10);
  layout.set_dtype(v1::KV_DTYPE_UNSPECIFIED);
  EXPECT_EQ(KvGeometry::FromProto(layout).status().code(),
            absl::StatusCode::kInvalidArgument);
  layout = SmolLm2Layout(10);
  layout.set_head_dim(0);
  EXPECT_THAT(std::string(KvGeometry::FromProto(layout).status().message()),
              HasSubstr("head_dim=0"));
  layout = SmolLm2Layout(UINT32_MAX);
  layout.set_num_layers(UINT32_MAX);
  layout.set_head_dim(UINT32_MAX);
  layout.set_dtype(v1::KV_DTYPE_F32);
  EXPECT_THAT(std::string(KvGeometry::FromProto(layout).status().message()),
              HasSubstr("2^64"));
  // Overflow already in the bytes of one token.
  layout = SmolLm2Layout(1);
  layout.set_num_layers(1);
  layout.set_num_kv_heads(UINT32_MAX);
  layout.set_head_dim(UINT32_MAX);
  layout.set_dtype(v1::KV_DTYPE_F32);
  EXPECT_THAT(std::string(KvGeometry::FromProto(layout).status().message()),
              HasSubstr("2^64"));
}

TEST(KvLayoutCompatibilityTest, OnlyPoolCapacityMayDiffer) {
  EXPECT_TRUE(
      CheckKvLayoutsCompatible(SmolLm2Layout(64), SmolLm2Layout(4096)).ok());

  v1::KvLayout other = SmolLm2Layout(64);
  other.set_dtype(v1::KV_DTYPE_BF16);
  absl::Status status = CheckKvLayoutsCompatible(SmolLm2Layout(64), other);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("dtype: writer has KV_DTYPE_F16, reader has "
                        "KV_DTYPE_BF16"));

  other = SmolLm2Layout(64);
  other.set_model_fingerprint("llama-3.2-1b");
  EXPECT_THAT(
      std::string(CheckKvLayoutsCompatible(SmolLm2Layout(64), other).message()),
      HasSubstr("model_fingerprint"));

  other = SmolLm2Layout(64);
  other.set_block_size_tokens(32);
  EXPECT_THAT(
      std::string(CheckKvLayoutsCompatible(SmolLm2Layout(64), other).message()),
      HasSubstr("block_size_tokens: writer has 16, reader has 32"));
}

}  // namespace
}  // namespace pdserve::kv_layout
