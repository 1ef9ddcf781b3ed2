// GgufValue and GgufArray (model/gguf_types.h): types, conversions, arrays,
// nesting limits.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/gguf_types.h"
#include "model/testing/gguf_test_util.h"

namespace pdserve::model {
namespace {

using gguf_testing::ExpectError;

// ---------------------------------------------------------------------------
// GgufValue.

TEST(GgufValueTest, TypesAndConversions) {
  EXPECT_EQ(GgufValue(uint8_t{1}).type(), GgufValueType::kUint8);
  EXPECT_EQ(GgufValue(int8_t{-1}).type(), GgufValueType::kInt8);
  EXPECT_EQ(GgufValue(uint16_t{1}).type(), GgufValueType::kUint16);
  EXPECT_EQ(GgufValue(int16_t{1}).type(), GgufValueType::kInt16);
  EXPECT_EQ(GgufValue(1u).type(), GgufValueType::kUint32);
  EXPECT_EQ(GgufValue(1).type(), GgufValueType::kInt32);
  EXPECT_EQ(GgufValue(1.5f).type(), GgufValueType::kFloat32);
  EXPECT_EQ(GgufValue(true).type(), GgufValueType::kBool);
  EXPECT_EQ(GgufValue("x").type(), GgufValueType::kString);
  EXPECT_EQ(GgufValue(std::string("x")).type(), GgufValueType::kString);
  EXPECT_EQ(GgufValue(absl::string_view("x")).type(), GgufValueType::kString);
  EXPECT_EQ(GgufValue(uint64_t{1}).type(), GgufValueType::kUint64);
  EXPECT_EQ(GgufValue(int64_t{1}).type(), GgufValueType::kInt64);
  EXPECT_EQ(GgufValue(1.5).type(), GgufValueType::kFloat64);
  EXPECT_EQ(GgufValue::ArrayOf(std::vector<std::string>{"a"}).TypeString(),
            "array[string]");

  EXPECT_EQ(GgufValue(int8_t{-1}).AsUint64(), std::nullopt);
  EXPECT_EQ(GgufValue(int8_t{-1}).AsInt64(), -1);
  EXPECT_EQ(GgufValue(uint64_t{1} << 63).AsInt64(), std::nullopt);
  EXPECT_EQ(GgufValue(uint64_t{1} << 63).AsUint64(), uint64_t{1} << 63);
  EXPECT_EQ(GgufValue(true).AsUint64(), std::nullopt);
  EXPECT_EQ(GgufValue(1.5f).AsInt64(), std::nullopt);
  EXPECT_EQ(GgufValue(1.5f).AsDouble(), 1.5);
  EXPECT_EQ(GgufValue(7).AsDouble(), std::nullopt);

  EXPECT_EQ(GgufValue(uint8_t{200}).DebugString(), "200");
  EXPECT_EQ(GgufValue("a\"b").DebugString(), "\"a\\\"b\"");
  EXPECT_EQ(GgufValue::ArrayOf(std::vector<int32_t>{1, 2, 3}).DebugString(2),
            "[int32 x 3: 1, 2, ...]");
}

TEST(GgufValueTest, Arrays) {
  const GgufArray strings(std::vector<std::string>{"a", "bc"});
  EXPECT_EQ(strings.element_type(), GgufValueType::kString);
  EXPECT_EQ(strings.size(), 2u);
  EXPECT_EQ(strings.Depth(), 1);
  ASSERT_NE(strings.get_if<std::string>(), nullptr);
  EXPECT_EQ((*strings.get_if<std::string>())[1], "bc");
  EXPECT_EQ(strings.get_if<float>(), nullptr);
  EXPECT_EQ(strings.Get(1), GgufValue("bc"));

  const GgufArray empty;
  EXPECT_EQ(empty.element_type(), GgufValueType::kUint8);
  EXPECT_TRUE(empty.empty());

  const GgufArray bools(std::vector<bool>{true, false});
  EXPECT_EQ(bools.element_type(), GgufValueType::kBool);
  EXPECT_EQ(bools.Get(0), GgufValue(true));

  const GgufArray nested(std::vector<GgufArray>{
      strings, GgufArray(std::vector<GgufArray>{GgufArray()})});
  EXPECT_EQ(nested.element_type(), GgufValueType::kArray);
  EXPECT_EQ(nested.Depth(), 3);
  EXPECT_EQ(nested.Get(0), GgufValue(strings));
  EXPECT_EQ(GgufValue(nested).TypeString(), "array[array]");
  EXPECT_EQ(GgufValue(nested).DebugString(),
            "[array x 2: [string x 2: \"a\", \"bc\"], [array x 1: "
            "[uint8 x 0:]]]");
  EXPECT_FALSE(GgufValue(strings) == GgufValue(nested));
}

TEST(GgufValueTest, Validate) {
  EXPECT_TRUE(GgufValue::ArrayOf(std::vector<float>{1, 2}).Validate().ok());
  GgufArray deep(std::vector<uint8_t>{1});
  for (int i = 1; i < GgufValue::kMaxArrayDepth; ++i) {
    deep = GgufArray(std::vector<GgufArray>{deep});
  }
  EXPECT_EQ(deep.Depth(), GgufValue::kMaxArrayDepth);
  EXPECT_TRUE(GgufValue(deep).Validate().ok());
  deep = GgufArray(std::vector<GgufArray>{deep});
  ExpectError(GgufValue(deep).Validate(), {"nested 17 deep", "at most 16"});
}

}  // namespace
}  // namespace pdserve::model
