#include "engine/block_hash.h"

#include <xxhash.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

using ::testing::IsEmpty;

// Tokens start, start + 1, ..., start + n - 1.
std::vector<int32_t> Range(int32_t start, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// The proto/membership.proto formula, written out independently: explicit
// little-endian bytes, seed = previous key.
std::vector<uint64_t> ReferenceKeys(const std::vector<int32_t>& tokens,
                                    int block_size) {
  std::vector<uint64_t> keys;
  uint64_t seed = 0;
  for (size_t start = 0; start + block_size <= tokens.size();
       start += block_size) {
    std::vector<unsigned char> bytes;
    for (int i = 0; i < block_size; ++i) {
      const uint32_t v = static_cast<uint32_t>(tokens[start + i]);
      bytes.push_back(v & 0xff);
      bytes.push_back((v >> 8) & 0xff);
      bytes.push_back((v >> 16) & 0xff);
      bytes.push_back(v >> 24);
    }
    seed = XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
    keys.push_back(seed);
  }
  return keys;
}

TEST(BlockHashTest, ChainKeysFollowTheProtoFormula) {
  const std::vector<int32_t> tokens = {1, -2, 70000, 3, 9, 9, 9, 9, 5, 6};
  const std::vector<uint64_t> expected = ReferenceKeys(tokens, 4);
  ASSERT_EQ(expected.size(), 2u);  // The trailing 2 tokens are no block.
  EXPECT_EQ(ChainKeys(tokens, 4), expected);
  EXPECT_THAT(ChainKeys(tokens, 0), IsEmpty());
  EXPECT_THAT(ChainKeys(Range(0, 3), 4), IsEmpty());
}

TEST(BlockHashTest, EachKeyChainsThePreviousOne) {
  const std::vector<int32_t> tokens = Range(7, 12);
  const std::vector<uint64_t> keys = ChainKeys(tokens, 4);
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0], ChainKey(0, absl::MakeConstSpan(tokens).subspan(0, 4)));
  EXPECT_EQ(keys[2],
            ChainKey(keys[1], absl::MakeConstSpan(tokens).subspan(8, 4)));
}

}  // namespace
}  // namespace pdserve::engine
