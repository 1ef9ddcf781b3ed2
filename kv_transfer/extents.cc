#include "kv_transfer/extents.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

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

absl::Status CopyExtents(uint8_t* remote_base, const uint8_t* local_base,
                         absl::Span<const Extent> extents,
                         absl::Time deadline) {
  // About 25-100 us of copying each: the deadline is noticed that soon.
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  for (const Extent& e : extents) {
    for (uint64_t done = 0; done < e.length; done += kPiece) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            "the write did not complete by its deadline");
      }
      std::memmove(remote_base + e.remote_offset + done,
                   local_base + e.local_offset + done,
                   std::min(kPiece, e.length - done));
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve::kv_transfer
