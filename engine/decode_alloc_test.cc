// A decode step allocates no memory once the runner is warm, also where a
// token starts or completes a KV block: the step's bookkeeping, the forward
// pass's buffers and the attention threads' scratch are reused, token ids
// and block tables have room for the context from the start, and the
// prefix cache's map and event queue for every block of the pool (also
// after evictions and a cache clear). Counted with a replaced global
// operator new (common/allocation_counter.h), so this test has a binary of
// its own.
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/allocation_counter.h"
#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/tiny_model.h"

namespace pdserve::engine {
namespace {

std::unique_ptr<model::Model> TinyModel() {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      std::string(dir != nullptr ? dir : "/tmp") + "/decode_alloc_test.gguf";
  absl::StatusOr<model::TinyModelOptions> preset =
      model::TinyModelPreset("llama-q4_1");
  if (!preset.ok() || !model::WriteTinyModel(*preset, path).ok()) return {};
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Open(path);
  return m.ok() ? *std::move(m) : nullptr;
}

// Three sequences with 20-token prompts (ids 1-3) decode `steps` steps
// together; every step after the first (which sizes the buffers) must
// allocate nothing. `between_steps(step)` runs before each step, uncounted.
// Returns how many steps added a token that starts or fills a block.
int DecodeWithoutAllocating(ModelRunner& runner, int steps,
                            const std::function<void(int)>& between_steps) {
  const int32_t block = runner.blocks().block_size();
  const std::vector<SeqId> ids = {1, 2, 3};
  for (SeqId id : ids) {
    const std::vector<int32_t> prompt(20, static_cast<int32_t>(id) + 3);
    EXPECT_TRUE(runner.Prefill({{id, prompt}}).ok());
  }
  const std::vector<int32_t> next = {5, 6, 7};
  std::vector<float> logits;
  int block_boundaries = 0;
  for (int step = 0; step < steps; ++step) {
    const int32_t pos = 20 + step;  // position of the token this step adds
    between_steps(step);
    const int64_t before = AllocationCount();
    const absl::Status decoded = runner.Decode(ids, next, &logits);
    const int64_t allocations = AllocationCount() - before;
    EXPECT_TRUE(decoded.ok()) << decoded;
    if (!decoded.ok()) break;
    if (step == 0) continue;
    EXPECT_EQ(allocations, 0)
        << "decode step " << step << " (position " << pos << ") allocated";
    // A block starts at pos % block == 0 and fills at block - 1.
    if (pos % block == 0 || pos % block == block - 1) ++block_boundaries;
  }
  return block_boundaries;
}

TEST(DecodeAllocationTest, WarmStepsAllocateNothing) {
  if (!AllocationCountingIsLive()) {
    GTEST_SKIP() << "operator new is not ours to count in this build "
                    "(AddressSanitizer); the default build runs this test";
  }
  std::unique_ptr<model::Model> m = TinyModel();
  ASSERT_NE(m, nullptr);
  ModelRunnerOptions o;
  o.num_threads = 2;
  ASSERT_TRUE(o.enable_prefix_cache);  // its map and events are exercised
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      ModelRunner::Create(*m, o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  // 80 steps: five blocks fill and five start on the way.
  EXPECT_EQ(DecodeWithoutAllocating(**runner, 80, [](int) {}), 10);
}

// The same on a pool so small that blocks come from evicting cached ones,
// with the events taken and the cache cleared along the way.
TEST(DecodeAllocationTest, EvictionsAndACacheClearAllocateNothingEither) {
  if (!AllocationCountingIsLive()) {
    GTEST_SKIP() << "operator new is not ours to count in this build "
                    "(AddressSanitizer); the default build runs this test";
  }
  std::unique_ptr<model::Model> m = TinyModel();
  ASSERT_NE(m, nullptr);
  ModelRunnerOptions o;
  o.num_threads = 2;
  o.num_blocks = 20;
  absl::StatusOr<std::unique_ptr<ModelRunner>> created =
      ModelRunner::Create(*m, o);
  ASSERT_TRUE(created.ok()) << created.status();
  ModelRunner& runner = **created;
  // Two finished 40-token sequences leave 4 full blocks cached and
  // evictable, 16 unallocated. The three decoding sequences need 18 blocks
  // from position 80 on, so two come from evictions.
  for (SeqId id : {11, 12}) {
    const std::vector<int32_t> prompt(40, static_cast<int32_t>(id));
    ASSERT_TRUE(runner.Prefill({{id, prompt}}).ok());
    runner.Release(id);
  }
  ASSERT_EQ(runner.blocks().stats().cached_blocks, 4);
  uint64_t evictions_before_clear = 0;
  DecodeWithoutAllocating(runner, 70, [&](int step) {
    if (step == 30) runner.blocks().TakeEvents();
    if (step == 65) {
      evictions_before_clear = runner.blocks().stats().evictions;
      runner.blocks().ClearCache();
    }
  });
  EXPECT_EQ(evictions_before_clear, 2);
}

}  // namespace
}  // namespace pdserve::engine
