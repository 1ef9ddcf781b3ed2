#include "kv_transfer/extents.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pdserve::kv_transfer {

absl::Status ValidateExtents(absl::Span<const Extent> extents,
                             uint64_t local_length, uint64_t remote_length) {
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    if (e.length == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("extent ", i, " is empty"));
    }
    uint64_t local_end = 0;
    uint64_t remote_end = 0;
    if (__builtin_add_overflow(e.local_offset, e.length, &local_end) ||
        __builtin_add_overflow(e.remote_offset, e.length, &remote_end) ||
        local_end > local_length || remote_end > remote_length) {
      return absl::OutOfRangeError(absl::StrCat(
          "extent ", i, " (local ", e.local_offset, ", remote ",
          e.remote_offset, ", ", e.length, " bytes) exceeds the regions (",
          local_length, " local, ", remote_length, " remote bytes)"));
    }
  }
  return absl::OkStatus();
}

std::vector<Extent> CoalesceExtents(absl::Span<const Extent> extents) {
  std::vector<Extent> sorted(extents.begin(), extents.end());
  std::sort(sorted.begin(), sorted.end(), [](const Extent& a, const Extent& b) {
    return a.local_offset < b.local_offset;
  });
  std::vector<Extent> merged;
  merged.reserve(sorted.size());
  for (const Extent& e : sorted) {
    if (!merged.empty()) {
      Extent& last = merged.back();
      if (last.local_offset + last.length == e.local_offset &&
          last.remote_offset + last.length == e.remote_offset) {
        last.length += e.length;
        continue;
      }
    }
    merged.push_back(e);
  }
  return merged;
}

uint64_t TotalBytes(absl::Span<const Extent> extents) {
  uint64_t total = 0;
  for (const Extent& e : extents) total += e.length;
  return total;
}

}  // namespace pdserve::kv_transfer
