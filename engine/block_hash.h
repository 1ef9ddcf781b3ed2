// The chain keys that name full KV blocks of a token sequence: the contract
// between a worker's prefix cache (KvBlockManager) and the router's
// KV-aware routing index, fixed by proto/membership.proto
// (PrefixCacheEvent):
//   key_0 = XXH3_64bits_withSeed(tokens of block 0, seed = 0)
//   key_i = XXH3_64bits_withSeed(tokens of block i, seed = key_{i-1})
// with a block's tokens hashed as consecutive little-endian uint32 ids. A
// library of its own so the router hashes prompts exactly as the workers do
// without linking the engine.
//
// Thread-safety: stateless functions.
#ifndef PDSERVE_ENGINE_BLOCK_HASH_H_
#define PDSERVE_ENGINE_BLOCK_HASH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace pdserve::engine {

// Chain key of one block given the previous block's key (0 for block 0).
uint64_t ChainKey(uint64_t prev_key, absl::Span<const int32_t> block_tokens);

// Chain keys of the full blocks of `tokens`; empty when block_size <= 0.
std::vector<uint64_t> ChainKeys(absl::Span<const int32_t> tokens,
                                int32_t block_size);

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_BLOCK_HASH_H_
