#include "engine/kv_cache_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<KvCachePool>> KvCachePool::Create(
    const v1::KvLayout& layout) {
  PD_ASSIGN_OR_RETURN(kv_layout::KvGeometry geometry,
                      kv_layout::KvGeometry::FromProto(layout));
  if (layout.num_blocks() == 0) {
    return absl::InvalidArgumentError("KV cache pool with 0 blocks");
  }
  const uint64_t size = geometry.pool_bytes();
  // Anonymous mmap: page-aligned, zero-filled, and pages are committed only
  // when touched.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a ", size,
                     "-byte KV cache pool: ", std::strerror(errno)));
  }
  return std::unique_ptr<KvCachePool>(
      new KvCachePool(std::move(geometry), static_cast<uint8_t*>(p), size));
}

KvCachePool::~KvCachePool() { munmap(base_, size_); }

}  // namespace pdserve::engine
