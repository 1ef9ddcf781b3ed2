#include "engine/kv_cache_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<KvCachePool>> KvCachePool::Create(
    const v1::KvLayout& layout, const KvPoolAllocator& allocator) {
  PD_ASSIGN_OR_RETURN(kv_layout::KvGeometry geometry,
                      kv_layout::KvGeometry::FromProto(layout));
  if (layout.num_blocks() == 0) {
    return absl::InvalidArgumentError("KV cache pool with 0 blocks");
  }
  const uint64_t size = geometry.pool_bytes();
  PD_ASSIGN_OR_RETURN(KvPoolMemory memory, allocator != nullptr
                                               ? allocator(size)
                                               : AnonymousMemory(size));
  if (memory.base == nullptr ||
      reinterpret_cast<uintptr_t>(memory.base) % ::getpagesize() != 0) {
    if (memory.release) memory.release();
    return absl::InternalError(
        "the KV pool allocator returned memory that is not page-aligned");
  }
  return std::unique_ptr<KvCachePool>(
      new KvCachePool(std::move(geometry), std::move(memory), size));
}

absl::StatusOr<KvPoolMemory> KvCachePool::AnonymousMemory(uint64_t bytes) {
  // Anonymous mmap: page-aligned, zero-filled, and pages are committed only
  // when touched.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a ", bytes,
                     "-byte KV cache pool: ", std::strerror(errno)));
  }
  return KvPoolMemory{.base = static_cast<uint8_t*>(p),
                      .release = [p, bytes] { munmap(p, bytes); }};
}

KvCachePool::~KvCachePool() {
  if (release_) release_();
}

}  // namespace pdserve::engine
