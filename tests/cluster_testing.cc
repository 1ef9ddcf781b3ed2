#include "tests/cluster_testing.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "metrics/scrape_client.h"
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

namespace {

// A random llama model of these sizes under the test's temporary folder
// (Q4_1 matrices, the tiny tokenizer); its path.
std::string WriteRandomModel(const std::string& file, int32_t layers,
                             int32_t hidden, int32_t ffn, int32_t heads,
                             int32_t kv_heads, int32_t context) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", file);
  model::TinyModelOptions options;
  options.num_layers = layers;
  options.hidden_size = hidden;
  options.ffn_size = ffn;
  options.num_heads = heads;
  options.num_kv_heads = kv_heads;
  options.context_length = context;
  const absl::Status written = model::WriteTinyModel(options, path);
  EXPECT_TRUE(written.ok()) << written;
  return path;
}

}  // namespace

std::string SlowTinyModelPath() {
  static const std::string path =
      WriteRandomModel("fault-model.gguf", /*layers=*/6, /*hidden=*/512,
                       /*ffn=*/1024, /*heads=*/8, /*kv_heads=*/4,
                       /*context=*/1024);
  return path;
}

std::string HeavyTinyModelPath() {
  static const std::string path =
      WriteRandomModel("heavy-model.gguf", /*layers=*/8, /*hidden=*/1024,
                       /*ffn=*/2816, /*heads=*/16, /*kv_heads=*/4,
                       /*context=*/4096);
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

absl::StatusOr<double> ScrapeSum(const std::string& address,
                                 const std::string& family,
                                 const metrics::Labels& labels) {
  absl::StatusOr<metrics::ParsedMetrics> scraped =
      metrics::ScrapeMetrics(address, absl::Seconds(5));
  if (!scraped.ok()) return scraped.status();
  const metrics::ParsedFamily* found = scraped->Find(family);
  double sum = 0;
  bool matched = false;
  for (const metrics::ParsedSample& sample :
       found != nullptr ? found->samples
                        : std::vector<metrics::ParsedSample>()) {
    bool all = true;
    for (const auto& [name, value] : labels) {
      auto it = sample.labels.find(name);
      all &= it != sample.labels.end() && it->second == value;
    }
    if (!all) continue;
    sum += sample.value;
    matched = true;
  }
  if (!matched) {
    return absl::NotFoundError(
        absl::StrCat("no sample of ", family, " at ", address));
  }
  return sum;
}

}  // namespace pdserve::testing
