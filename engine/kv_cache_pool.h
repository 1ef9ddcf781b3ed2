// KvCachePool: the memory that holds a worker's paged KV cache.
//
// One contiguous allocation in the layer-major order of v1::KvLayout
// (proto/common.proto): all of layer 0's blocks, then layer 1's, and within a
// block its K half then its V half, each [block_size tokens][kv_heads]
// [head_dim]. Layer-major is what lets a prefill worker ship layer l's KV to
// a decode worker while layer l+1 computes: a layer's blocks are contiguous.
// The KvBlockManager decides which block ids a sequence owns; this class only
// turns (layer, block, slot) into addresses, through the same KvGeometry the
// KV-transfer backends use, so the bytes the engine writes are exactly the
// bytes a transfer reads.
//
// The memory is page-aligned and zeroed. By default the pool maps it
// itself (anonymous memory, registered with a KV transport as is); a decode
// worker passes an allocator instead, so the pool lives in memory its KV
// transport allocated (shared memory that a prefill worker on the same host
// stores into directly).
//
// Ownership: owns its memory (frees it through KvPoolMemory::release).
// Thread-safety: the addresses are fixed for the pool's lifetime;
// concurrent access to distinct blocks is safe, and who may touch which
// block is the block manager's business.
#ifndef PDSERVE_ENGINE_KV_CACHE_POOL_H_
#define PDSERVE_ENGINE_KV_CACHE_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kv_layout/kv_layout.h"
#include "proto/common.pb.h"

namespace pdserve::engine {

// Memory for a pool: page-aligned, zero-filled, at least the pool's size.
struct KvPoolMemory {
  uint8_t* base = nullptr;
  // Frees the memory; called once, when the pool goes.
  std::function<void()> release = nullptr;
};
// Provides `bytes` of pool memory.
using KvPoolAllocator =
    std::function<absl::StatusOr<KvPoolMemory>(uint64_t bytes)>;

class KvCachePool {
 public:
  // INVALID_ARGUMENT for a layout KvGeometry refuses or with num_blocks == 0;
  // RESOURCE_EXHAUSTED when the memory cannot be allocated. The memory comes
  // from `allocator`, or from AnonymousMemory when it is empty.
  static absl::StatusOr<std::unique_ptr<KvCachePool>> Create(
      const v1::KvLayout& layout, const KvPoolAllocator& allocator = nullptr);
  // Anonymous private memory: page-aligned, zero-filled, committed only
  // when touched.
  static absl::StatusOr<KvPoolMemory> AnonymousMemory(uint64_t bytes);
  ~KvCachePool();
  KvCachePool(const KvCachePool&) = delete;
  KvCachePool& operator=(const KvCachePool&) = delete;

  const kv_layout::KvGeometry& geometry() const { return geometry_; }
  const v1::KvLayout& layout() const { return geometry_.layout(); }
  uint8_t* base() const { return base_; }
  uint64_t size_bytes() const { return size_; }

  // Address of token `slot` of `block` in `layer`, K or V half.
  uint8_t* Slot(uint32_t layer, uint32_t block, kv_layout::KvHalf half,
                uint32_t slot) const {
    return base_ + geometry_.Offset(layer, block, half, slot);
  }

 private:
  KvCachePool(kv_layout::KvGeometry geometry, KvPoolMemory memory,
              uint64_t size)
      : geometry_(std::move(geometry)),
        base_(memory.base),
        size_(size),
        release_(std::move(memory.release)) {}

  const kv_layout::KvGeometry geometry_;
  uint8_t* const base_;
  const uint64_t size_;
  const std::function<void()> release_;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_KV_CACHE_POOL_H_
