// Helpers shared by the GGUF tests (gguf_test, gguf_value_test,
// gguf_error_test). Test-only.
#ifndef PDSERVE_MODEL_TESTING_GGUF_TEST_UTIL_H_
#define PDSERVE_MODEL_TESTING_GGUF_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::model::gguf_testing {

// A path named after `name` in the test's temporary directory.
std::string TempPath(absl::string_view name);

// Expects `result` to fail with a message containing every word in `words`.
template <typename T>
void ExpectError(const absl::StatusOr<T>& result,
                 std::vector<absl::string_view> words) {
  ASSERT_FALSE(result.ok()) << "expected an error containing '"
                            << (words.empty() ? "" : words[0]) << "'";
  for (absl::string_view word : words) {
    EXPECT_THAT(std::string(result.status().message()),
                ::testing::HasSubstr(std::string(word)));
  }
}
void ExpectError(const absl::Status& status,
                 std::vector<absl::string_view> words);

// `n` bytes from a generator seeded with `seed`.
std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed);

}  // namespace pdserve::model::gguf_testing

#endif  // PDSERVE_MODEL_TESTING_GGUF_TEST_UTIL_H_
