#include "engine/block_hash.h"

#include <xxhash.h>

#include <bit>
#include <cstddef>

namespace pdserve::engine {

uint64_t ChainKey(uint64_t prev_key, absl::Span<const int32_t> block_tokens) {
  if constexpr (std::endian::native == std::endian::little) {
    // The in-memory ids already are the little-endian uint32s of the format.
    return XXH3_64bits_withSeed(
        block_tokens.data(), block_tokens.size() * sizeof(int32_t), prev_key);
  } else {
    std::vector<uint8_t> bytes(block_tokens.size() * 4);
    for (size_t i = 0; i < block_tokens.size(); ++i) {
      const uint32_t v = static_cast<uint32_t>(block_tokens[i]);
      for (int j = 0; j < 4; ++j) bytes[4 * i + j] = (v >> (8 * j)) & 0xff;
    }
    return XXH3_64bits_withSeed(bytes.data(), bytes.size(), prev_key);
  }
}

std::vector<uint64_t> ChainKeys(absl::Span<const int32_t> tokens,
                                int32_t block_size) {
  std::vector<uint64_t> keys;
  if (block_size <= 0) return keys;
  const size_t full_blocks = tokens.size() / block_size;
  keys.reserve(full_blocks);
  uint64_t key = 0;
  for (size_t i = 0; i < full_blocks; ++i) {
    key = ChainKey(key, tokens.subspan(i * block_size, block_size));
    keys.push_back(key);
  }
  return keys;
}

}  // namespace pdserve::engine
