// Memory for data a process streams in full over and over (the packed
// weight matrices every decode step reads): one anonymous mapping, aligned
// to and sized in 2 MiB, advised as transparent huge pages.
//
// Why: a decode step reads every weight once. On 4 KiB pages the default
// model's 94 MiB of packed weights are about 24 000 pages, several times
// what the second-level TLB holds, so the stream takes a page walk every
// 4 KiB; on 2 MiB pages it is 47 entries. Measured on the Zen 4 machine of
// bench/results: one-stream decode of the default model 186-191 -> 223-238
// tokens/s, a one-thread batch of 8 755 -> 830-856.
//
// The advice is a hint. Where the kernel's THP mode is "never" (or THP is
// not built in) the mapping gets 4 KiB pages and works the same, only
// slower; where it is "madvise" (Debian's default) or "always", the kernel
// backs the buffer with huge pages as it is first written, as far as it
// finds free 2 MiB frames. HugePageBytes() says how much it got.
#ifndef PDSERVE_COMMON_HUGE_PAGE_BUFFER_H_
#define PDSERVE_COMMON_HUGE_PAGE_BUFFER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pdserve::common {

// Ownership: owns its mapping (unmapped when destroyed); movable, not
// copyable. Thread-safety: as plain memory.
class HugePageBuffer {
 public:
  static constexpr int64_t kHugePageBytes = int64_t{2} << 20;

  // A zero-filled buffer of at least `bytes` (rounded up to 2 MiB, so that
  // its last page can be a huge one too), starting on a 2 MiB boundary.
  // Fails only when the address space or memory is exhausted.
  static absl::StatusOr<HugePageBuffer> Allocate(int64_t bytes);

  HugePageBuffer() = default;
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  ~HugePageBuffer();

  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

  // Whether the kernel took the huge-page advice (madvise succeeded). It
  // does so even in THP mode "never", where it has no effect.
  bool advised() const { return advised_; }

  // Bytes of the buffer the kernel has backed with huge pages now (the
  // AnonHugePages of /proc/self/smaps for the buffer's mapping); 0 where
  // that cannot be read. For logs and benchmarks: it reads a file.
  int64_t HugePageBytes() const;

 private:
  HugePageBuffer(uint8_t* data, int64_t size, bool advised)
      : data_(data), size_(size), advised_(advised) {}

  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  bool advised_ = false;
};

// The kernel's transparent huge page mode: "always", "madvise", "never",
// or "" where /sys/kernel/mm/transparent_hugepage/enabled is absent.
std::string TransparentHugePageMode();

}  // namespace pdserve::common

#endif  // PDSERVE_COMMON_HUGE_PAGE_BUFFER_H_
