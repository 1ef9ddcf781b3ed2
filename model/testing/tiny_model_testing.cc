#include "model/testing/tiny_model_testing.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "model/testing/gguf_test_util.h"

namespace pdserve::model::testing {

std::unique_ptr<Model> OpenTinyModel(const TinyModelOptions& options,
                                     absl::string_view file_name) {
  const std::string path = gguf_testing::TempPath(file_name);
  const absl::Status written = WriteTinyModel(options, path);
  EXPECT_TRUE(written.ok()) << written;
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Open(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

}  // namespace pdserve::model::testing
