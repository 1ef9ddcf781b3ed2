#include "model/testing/gguf_test_util.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::model::gguf_testing {

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "/gguf_test_", ::getpid(), "_",
                      name);
}

void ExpectError(const absl::Status& status,
                 std::vector<absl::string_view> words) {
  ASSERT_FALSE(status.ok());
  for (absl::string_view word : words) {
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(std::string(word)));
  }
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

}  // namespace pdserve::model::gguf_testing
