// The ggml type table against ggml's own (ggml.c's type_traits), and its
// errors.
#include "kernels/ggml_type.h"

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::kernels {
namespace {

using ::testing::HasSubstr;

// Expects `result` to fail with a message containing every word in `words`.
template <typename T>
void ExpectError(const absl::StatusOr<T>& result,
                 std::vector<absl::string_view> words) {
  ASSERT_FALSE(result.ok()) << "expected an error containing '"
                            << (words.empty() ? "" : words[0]) << "'";
  for (absl::string_view word : words) {
    EXPECT_THAT(std::string(result.status().message()),
                HasSubstr(std::string(word)));
  }
}

struct ExpectedType {
  uint32_t id;
  const char* name;
  uint32_t block_size;
  uint32_t type_size;
};

constexpr ExpectedType kExpectedTypes[] = {
    {0, "f32", 1, 4},       {1, "f16", 1, 2},       {2, "q4_0", 32, 18},
    {3, "q4_1", 32, 20},    {6, "q5_0", 32, 22},    {7, "q5_1", 32, 24},
    {8, "q8_0", 32, 34},    {9, "q8_1", 32, 36},    {10, "q2_K", 256, 84},
    {11, "q3_K", 256, 110}, {12, "q4_K", 256, 144}, {13, "q5_K", 256, 176},
    {14, "q6_K", 256, 210}, {15, "q8_K", 256, 292}, {24, "i8", 1, 1},
    {25, "i16", 1, 2},      {26, "i32", 1, 4},      {27, "i64", 1, 8},
    {28, "f64", 1, 8},      {30, "bf16", 1, 2},
};

TEST(GgmlTypesTest, TableMatchesGgml) {
  ASSERT_EQ(AllGgmlTypes().size(), std::size(kExpectedTypes));
  for (const ExpectedType& e : kExpectedTypes) {
    SCOPED_TRACE(e.name);
    absl::StatusOr<GgmlType> type = GgmlTypeFromId(e.id);
    ASSERT_TRUE(type.ok()) << type.status();
    EXPECT_EQ(static_cast<uint32_t>(*type), e.id);
    absl::StatusOr<GgmlTypeInfo> info = GetGgmlTypeInfo(*type);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->name, e.name);
    EXPECT_EQ(info->block_size, e.block_size);
    EXPECT_EQ(info->type_size, e.type_size);
    EXPECT_EQ(GgmlTypeName(*type), e.name);
    absl::StatusOr<GgmlType> by_name = GgmlTypeFromName(e.name);
    ASSERT_TRUE(by_name.ok());
    EXPECT_EQ(*by_name, *type);
    absl::StatusOr<uint64_t> bytes = GgmlTypeBytes(*type, 3 * e.block_size);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(*bytes, 3u * e.type_size);
  }
}

TEST(GgmlTypesTest, ByteSizing) {
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kQ4_0, 64), 36u);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kQ4_1, 576), 18u * 20u);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kQ6_K, 512), 420u);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kF32, 3), 12u);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kF16, 0), 0u);
  ExpectError(GgmlTypeBytes(GgmlType::kQ4_K, 100),
              {"100", "not a multiple", "256"});
  ExpectError(GgmlTypeBytes(GgmlType::kQ8_0, 33), {"not a multiple", "32"});
  ExpectError(GgmlTypeBytes(GgmlType::kF64, uint64_t{1} << 62), {"overflow"});
  ExpectError(GgmlTypeBytes(static_cast<GgmlType>(99), 1), {"unknown", "99"});
}

TEST(GgmlTypesTest, UnknownIds) {
  ExpectError(GgmlTypeFromId(99), {"unknown ggml type id 99"});
  ExpectError(GgmlTypeFromId(16), {"unsupported", "iq2_xxs", "16"});
  ExpectError(GgmlTypeFromId(4), {"q4_2"});
  ExpectError(GgmlTypeFromName("q4_k"), {"unknown ggml type name"});
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(77)), "unknown(77)");
}

}  // namespace
}  // namespace pdserve::kernels
