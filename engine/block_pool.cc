#include "engine/block_pool.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(
    const BlockPoolOptions& options) {
  if (options.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BlockPool: num_blocks must be > 0, got ", options.num_blocks));
  }
  return std::unique_ptr<BlockPool>(new BlockPool(options.num_blocks));
}

BlockPool::BlockPool(int32_t num_blocks)
    : num_total_(num_blocks), ref_counts_(num_blocks, 0) {
  // An ascending array is already a valid min-heap.
  free_heap_.reserve(num_blocks);
  for (BlockId id = 0; id < num_blocks; ++id) free_heap_.push_back(id);
}

absl::StatusOr<std::vector<BlockId>> BlockPool::Allocate(int32_t n) {
  std::vector<BlockId> ids;
  if (n > 0) ids.reserve(n);
  PD_RETURN_IF_ERROR(AllocateInto(n, &ids));
  return ids;
}

absl::Status BlockPool::AllocateInto(int32_t n, std::vector<BlockId>* out) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPool::Allocate: n must be >= 0, got ", n));
  }
  absl::MutexLock lock(&mu_);
  const size_t num_free = free_heap_.size();
  if (static_cast<size_t>(n) > num_free) {
    return absl::ResourceExhaustedError(
        absl::StrCat("BlockPool::Allocate: requested ", n, " blocks, ",
                     num_free, " of ", num_total_, " free"));
  }
  for (int32_t i = 0; i < n; ++i) {
    std::pop_heap(free_heap_.begin(), free_heap_.end(), std::greater<>());
    const BlockId id = free_heap_.back();
    free_heap_.pop_back();
    ref_counts_[id] = 1;
    out->push_back(id);
  }
  return absl::OkStatus();
}

absl::Status BlockPool::Ref(BlockId id) {
  if (id < 0 || id >= num_total_) {
    return absl::OutOfRangeError(absl::StrCat("BlockPool::Ref: block ", id,
                                              " not in [0, ", num_total_, ")"));
  }
  absl::MutexLock lock(&mu_);
  int32_t& count = ref_counts_[id];
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("BlockPool::Ref: block ", id, " is free"));
  }
  if (count == std::numeric_limits<int32_t>::max()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("BlockPool::Ref: block ", id, " ref count overflow"));
  }
  ++count;
  return absl::OkStatus();
}

absl::Status BlockPool::Release(absl::Span<const BlockId> ids) {
  for (const BlockId id : ids) {
    if (id < 0 || id >= num_total_) {
      return absl::OutOfRangeError(absl::StrCat(
          "BlockPool::Release: block ", id, " not in [0, ", num_total_, ")"));
    }
  }
  // Count how many references each distinct id drops, so that a block listed
  // k times is checked against its count once. One id (an eviction during a
  // decode step) is its own sorted list: no copy, no allocation.
  std::vector<BlockId> sorted_copy;
  if (ids.size() > 1) {
    sorted_copy.assign(ids.begin(), ids.end());
    std::sort(sorted_copy.begin(), sorted_copy.end());
  }
  const absl::Span<const BlockId> sorted =
      ids.size() > 1 ? absl::MakeConstSpan(sorted_copy) : ids;

  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i + 1;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    const BlockId id = sorted[i];
    const size_t drops = j - i;
    if (drops > static_cast<size_t>(ref_counts_[id])) {
      return absl::FailedPreconditionError(
          absl::StrCat("BlockPool::Release: block ", id, " released ", drops,
                       " time(s) but has ", ref_counts_[id], " reference(s)",
                       ref_counts_[id] == 0 ? " (it is free)" : ""));
    }
    i = j;
  }
  for (const BlockId id : ids) {
    if (--ref_counts_[id] == 0) {
      free_heap_.push_back(id);
      std::push_heap(free_heap_.begin(), free_heap_.end(), std::greater<>());
    }
  }
  return absl::OkStatus();
}

int32_t BlockPool::num_free() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(free_heap_.size());
}

int32_t BlockPool::ref_count(BlockId id) const {
  if (id < 0 || id >= num_total_) return 0;
  absl::MutexLock lock(&mu_);
  return ref_counts_[id];
}

}  // namespace pdserve::engine
