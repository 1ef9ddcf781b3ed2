// KvGeometry: byte arithmetic of a paged KV pool, and the compatibility check
// both sides of a KV transfer run before any byte moves.
//
// The memory order is the contract documented on v1::KvLayout in
// proto/common.proto (layout_version 1, layer-major). Every component that
// addresses KV bytes (engine pools, transfer backends, checksums) goes
// through this one implementation of it. It lives in a package of its own,
// below both the engine (whose KV pool is laid out by it) and kv_transfer
// (which moves and checks those bytes), so neither reaches into the other.
//
// Value type; immutable after construction; thread-safe.
#ifndef PDSERVE_KV_LAYOUT_KV_LAYOUT_H_
#define PDSERVE_KV_LAYOUT_KV_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace pdserve::kv_layout {

// The only memory order implemented.
inline constexpr uint32_t kKvLayoutVersion = 1;

// K or V half of a block.
enum class KvHalf : uint32_t { kKey = 0, kValue = 1 };

class KvGeometry {
 public:
  // INVALID_ARGUMENT for an unknown version or dtype, a zero dimension, or a
  // pool whose size overflows 64 bits. num_blocks may be 0 (a model's layout
  // rather than a pool's); offsets then are only meaningful per block.
  static absl::StatusOr<KvGeometry> FromProto(const v1::KvLayout& layout);

  const v1::KvLayout& layout() const { return layout_; }
  uint64_t dtype_bytes() const { return dtype_bytes_; }
  // One token of one layer, K or V.
  uint64_t token_bytes() const { return token_bytes_; }
  // One block of one layer, K and V.
  uint64_t block_bytes() const { return 2 * half_block_bytes_; }
  uint64_t layer_stride() const { return layer_stride_; }
  uint64_t pool_bytes() const { return layout_.num_layers() * layer_stride_; }
  // KV bytes one token occupies across all layers.
  uint64_t bytes_per_token_all_layers() const {
    return 2 * token_bytes_ * layout_.num_layers();
  }

  // Byte offset from the pool's start of `slot` in K or V of `block` in
  // `layer`. Arguments are not range-checked here (hot path); callers check
  // block ids when a request is admitted.
  uint64_t Offset(uint32_t layer, uint32_t block, KvHalf half,
                  uint32_t slot = 0) const {
    return layer * layer_stride_ + uint64_t{block} * 2 * half_block_bytes_ +
           static_cast<uint32_t>(half) * half_block_bytes_ +
           uint64_t{slot} * token_bytes_;
  }

 private:
  explicit KvGeometry(const v1::KvLayout& layout);

  v1::KvLayout layout_;
  uint64_t dtype_bytes_ = 0;
  uint64_t token_bytes_ = 0;
  uint64_t half_block_bytes_ = 0;
  uint64_t layer_stride_ = 0;
};

// Bytes per element of `dtype`; 0 for an unknown one.
uint64_t KvDtypeBytes(v1::KvDtype dtype);

// OK when KV written by a worker with layout `writer` can be read by one with
// layout `reader`: every field but num_blocks equal. Otherwise
// FAILED_PRECONDITION naming the first field that differs and both values.
absl::Status CheckKvLayoutsCompatible(const v1::KvLayout& writer,
                                      const v1::KvLayout& reader);

}  // namespace pdserve::kv_layout

#endif  // PDSERVE_KV_LAYOUT_KV_LAYOUT_H_
