// A decode step allocates no memory once the runner is warm, also where a
// token starts or completes a KV block: the step's bookkeeping, the forward
// pass's buffers and the attention threads' scratch are reused, token ids
// and block tables have room for the context from the start, and the
// prefix cache's map and event queue for every block of the pool. Counted
// with a replaced global operator new, so this test has a binary of its own.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/tiny_model.h"

namespace {
std::atomic<int64_t> g_allocations{0};

void* Allocate(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
}  // namespace

// Every plain (not over-aligned) form, so that each new meets its own
// delete (AddressSanitizer checks the pairing).
void* operator new(std::size_t n) {
  if (void* p = Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return Allocate(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return Allocate(n);
}
// GCC takes free() on a replaced operator new's memory for a mismatch.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace pdserve::engine {
namespace {

TEST(DecodeAllocationTest, WarmStepsAllocateNothing) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      std::string(dir != nullptr ? dir : "/tmp") + "/decode_alloc_test.gguf";
  absl::StatusOr<model::TinyModelOptions> preset =
      model::TinyModelPreset("llama-q4_1");
  ASSERT_TRUE(preset.ok()) << preset.status();
  ASSERT_TRUE(model::WriteTinyModel(*preset, path).ok());
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Open(path);
  ASSERT_TRUE(m.ok()) << m.status();
  ModelRunnerOptions o;
  o.num_threads = 2;
  absl::StatusOr<std::unique_ptr<ModelRunner>> created =
      ModelRunner::Create(**m, o);
  ASSERT_TRUE(created.ok()) << created.status();
  ModelRunner& runner = **created;
  const int32_t block = o.block_size;

  ASSERT_TRUE(o.enable_prefix_cache);  // its map and events are exercised
  // Three sequences with 20-token prompts decode 80 steps together: five
  // blocks fill and five start on the way.
  const std::vector<SeqId> ids = {1, 2, 3};
  for (SeqId id : ids) {
    const std::vector<int32_t> prompt(20, static_cast<int32_t>(id) + 3);
    ASSERT_TRUE(runner.Prefill({{id, prompt}}).ok());
  }
  const std::vector<int32_t> next = {5, 6, 7};
  std::vector<float> logits;
  int block_boundaries = 0;
  for (int step = 0; step < 80; ++step) {
    const int32_t pos = 20 + step;  // position of the token this step adds
    const int64_t before = g_allocations.load();
    ASSERT_TRUE(runner.Decode(ids, next, &logits).ok());
    const int64_t allocations = g_allocations.load() - before;
    if (step == 0) continue;  // the first step sizes the buffers
    EXPECT_EQ(allocations, 0)
        << "decode step " << step << " (position " << pos << ") allocated";
    // A block starts at pos % block == 0 and fills at block - 1.
    if (pos % block == 0 || pos % block == block - 1) ++block_boundaries;
  }
  EXPECT_GE(block_boundaries, 8);  // the boundaries were crossed
}

}  // namespace
}  // namespace pdserve::engine
