#include "common/huge_page_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace pdserve::common {

absl::StatusOr<HugePageBuffer> HugePageBuffer::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative buffer size ", bytes));
  }
  const int64_t size =
      std::max<int64_t>(1, (bytes + kHugePageBytes - 1) / kHugePageBytes) *
      kHugePageBytes;
  // Map one huge page more than needed, then unmap what lies before the
  // first 2 MiB boundary and after the buffer: mmap itself only promises
  // 4 KiB alignment, and a huge page needs an aligned 2 MiB of one mapping.
  const size_t mapped = static_cast<size_t>(size + kHugePageBytes);
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "mmap of ", mapped, " bytes failed: ", std::strerror(errno)));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned =
      (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = aligned + size;
  if (start + mapped > end) {
    munmap(reinterpret_cast<void*>(end), start + mapped - end);
  }
  uint8_t* data = reinterpret_cast<uint8_t*>(aligned);
  const bool advised = madvise(data, size, MADV_HUGEPAGE) == 0;
  return HugePageBuffer(data, size, advised);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), advised_(other.advised_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = other.data_;
    size_ = other.size_;
    advised_ = other.advised_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

HugePageBuffer::~HugePageBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

int64_t HugePageBuffer::HugePageBytes() const {
  if (data_ == nullptr) return 0;
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t end = begin + size_;
  bool inside = false;  // the current mapping overlaps the buffer
  int64_t total = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    // A mapping's first line: "start-end perms offset dev inode [path]".
    const absl::string_view range =
        absl::string_view(line).substr(0, line.find(' '));
    const size_t dash = range.find('-');
    uint64_t lo = 0, hi = 0;
    if (dash != absl::string_view::npos &&
        absl::SimpleHexAtoi(range.substr(0, dash), &lo) &&
        absl::SimpleHexAtoi(range.substr(dash + 1), &hi)) {
      inside = lo < end && hi > begin;
      continue;
    }
    absl::string_view field = line;
    if (inside && absl::ConsumePrefix(&field, "AnonHugePages:")) {
      int64_t kb = 0;
      field = absl::StripAsciiWhitespace(absl::StripSuffix(field, "kB"));
      if (absl::SimpleAtoi(field, &kb)) total += kb * 1024;
    }
  }
  // A neighbouring mapping with the same flags may have been merged into
  // the buffer's; never report more than the buffer holds.
  return std::min<int64_t>(total, size_);
}

std::string TransparentHugePageMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (!std::getline(f, modes)) return "";
  // "always [madvise] never": the chosen one is bracketed.
  const size_t open = modes.find('[');
  const size_t close = modes.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return modes.substr(open + 1, close - open - 1);
}

}  // namespace pdserve::common
