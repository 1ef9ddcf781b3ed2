#include "tests/cluster_testing.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/tiny_model.h"

namespace pdserve::testing {

std::string BinDir() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/pdserve");
}

std::string MakeWorkDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  EXPECT_FALSE(error) << error.message();
  return dir;
}

std::string TinyModelPath() {
  static std::once_flag once;
  static std::string path;
  std::call_once(once, [] {
    path = absl::StrCat(::testing::TempDir(), "/tiny-cluster-model.gguf");
    model::TinyModelOptions options;
    options.num_layers = 2;
    const absl::Status written = model::WriteTinyModel(options, path);
    EXPECT_TRUE(written.ok()) << written;
  });
  return path;
}

std::string DefaultModelPathOrEmpty() {
  const char* path = std::getenv("PDSERVE_DEFAULT_MODEL");
  return path == nullptr ? "" : path;
}

std::vector<std::string> SmallWorkerArgs() {
  return {"--threads=1", "--kv_cache_mb=16"};
}

}  // namespace pdserve::testing
