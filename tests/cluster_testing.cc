#include "tests/cluster_testing.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/default_model.h"
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

std::string SlowTinyModelPath() {
  static const std::string path = [] {
    const std::string p =
        absl::StrCat(::testing::TempDir(), "/fault-model.gguf");
    model::TinyModelOptions options;
    options.num_layers = 6;
    options.hidden_size = 512;
    options.ffn_size = 1024;
    options.num_heads = 8;
    options.num_kv_heads = 4;
    options.context_length = 1024;
    EXPECT_TRUE(model::WriteTinyModel(options, p).ok());
    return p;
  }();
  return path;
}

std::string HeavyTinyModelPath() {
  static const std::string path = [] {
    const std::string p =
        absl::StrCat(::testing::TempDir(), "/heavy-model.gguf");
    model::TinyModelOptions options;
    options.num_layers = 8;
    options.hidden_size = 1024;
    options.ffn_size = 2816;
    options.num_heads = 16;
    options.num_kv_heads = 4;
    options.context_length = 4096;
    EXPECT_TRUE(model::WriteTinyModel(options, p).ok());
    return p;
  }();
  return path;
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

std::string DefaultModelPathOrEmpty() { return model::FindDefaultModel(); }

std::vector<std::string> SmallWorkerArgs() {
  return {"--threads=1", "--kv_cache_mb=16"};
}

}  // namespace pdserve::testing
