#include "common/huge_page_buffer.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace pdserve::common {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The "THPeligible:" value of the /proc/self/smaps mapping holding p, or -1.
int ThpEligible(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    const std::vector<std::string> range = absl::StrSplit(words[0], '-');
    uint64_t lo = 0, hi = 0;
    if (range.size() == 2 && absl::SimpleHexAtoi(range[0], &lo) &&
        absl::SimpleHexAtoi(range[1], &hi)) {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return line.back() - '0';
    }
  }
  return -1;
}

TEST(HugePageBufferTest, AlignedZeroedAndRoundedToHugePages) {
  absl::StatusOr<HugePageBuffer> b = HugePageBuffer::Allocate(5 * kMiB + 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->size(), 6 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (2 * kMiB), 0u);
  for (int64_t i = 0; i < b->size(); i += 4096) ASSERT_EQ(b->data()[i], 0);
  std::memset(b->data(), 0x5A, b->size());
  EXPECT_EQ(b->data()[b->size() - 1], 0x5A);
  // Whatever the kernel backed with huge pages lies inside the buffer and
  // comes in whole huge pages.
  const int64_t huge = b->HugePageBytes();
  EXPECT_GE(huge, 0);
  EXPECT_LE(huge, b->size());
  EXPECT_EQ(huge % HugePageBuffer::kHugePageBytes, 0);
}

TEST(HugePageBufferTest, AdvisedAsHugePagesWhereTheKernelAllowsIt) {
  const std::string mode = TransparentHugePageMode();
  if (mode != "madvise" && mode != "always") {
    GTEST_SKIP() << "transparent huge pages are \"" << mode << "\" here";
  }
  absl::StatusOr<HugePageBuffer> b = HugePageBuffer::Allocate(4 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->advised());
  // In "madvise" mode only advised mappings are eligible: this fails when
  // the advice is missing or given to the wrong range.
  EXPECT_EQ(ThpEligible(b->data()), 1);
  EXPECT_EQ(ThpEligible(b->data() + b->size() - 1), 1);
}

TEST(HugePageBufferTest, MovesOwnership) {
  absl::StatusOr<HugePageBuffer> b = HugePageBuffer::Allocate(1);
  ASSERT_TRUE(b.ok()) << b.status();
  uint8_t* data = b->data();
  HugePageBuffer moved = std::move(*b);
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_EQ(b->size(), 0);
  EXPECT_EQ(moved.data(), data);
  moved.data()[moved.size() - 1] = 1;  // still mapped
  HugePageBuffer other;
  other = std::move(moved);
  EXPECT_EQ(other.data(), data);
  EXPECT_EQ(other.data()[other.size() - 1], 1);
}

TEST(HugePageBufferTest, RefusesNegativeSizes) {
  EXPECT_FALSE(HugePageBuffer::Allocate(-1).ok());
}

}  // namespace
}  // namespace pdserve::common
