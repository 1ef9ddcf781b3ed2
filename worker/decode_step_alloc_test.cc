// The allocation-free decode step (engine/decode_alloc_test.cc) stays
// allocation-free with metrics on: a warm decode step together with what
// a decode worker records for it (DecodeWorker::EngineLoop per step,
// OnOutput per token, through the handles of worker_metrics.h) allocates
// nothing. Counted with a replaced global operator new
// (common/allocation_counter.h), so this test has a binary of its own.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/allocation_counter.h"
#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"
#include "model/model.h"
#include "model/tiny_model.h"
#include "worker/worker_metrics.h"

namespace pdserve::worker {
namespace {

TEST(DecodeStepAllocationTest, RecordingMetricsAllocatesNothing) {
  if (!AllocationCountingIsLive()) {
    GTEST_SKIP() << "operator new is not ours to count in this build "
                    "(AddressSanitizer); the default build runs this test";
  }
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") +
                           "/decode_step_alloc_test.gguf";
  absl::StatusOr<model::TinyModelOptions> preset =
      model::TinyModelPreset("llama-q4_1");
  ASSERT_TRUE(preset.ok());
  ASSERT_TRUE(model::WriteTinyModel(*preset, path).ok());
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Open(path);
  ASSERT_TRUE(m.ok()) << m.status();
  engine::ModelRunnerOptions o;
  o.num_threads = 2;
  absl::StatusOr<std::unique_ptr<engine::ModelRunner>> runner =
      engine::ModelRunner::Create(**m, o);
  ASSERT_TRUE(runner.ok()) << runner.status();

  metrics::Registry registry;
  WorkerMetricsOptions options;
  options.model = "tiny";
  options.role = "decode";
  options.worker_id = "decode-0";
  std::unique_ptr<WorkerMetrics> recorded =
      WorkerMetrics::Create(&registry, options).value();

  const std::vector<engine::SeqId> ids = {1, 2, 3};
  for (engine::SeqId id : ids) {
    const std::vector<int32_t> prompt(20, static_cast<int32_t>(id) + 3);
    ASSERT_TRUE((*runner)->Prefill({{id, prompt}}).ok());
  }
  const std::vector<int32_t> next = {5, 6, 7};
  std::vector<float> logits;
  absl::Time last = absl::Now();
  for (int step = 0; step < 40; ++step) {
    const int64_t before = AllocationCount();
    ASSERT_TRUE((*runner)->Decode(ids, next, &logits).ok());
    const absl::Time now = absl::Now();
    recorded->step_duration->Observe(absl::ToDoubleSeconds(now - last));
    recorded->batch_sequences->Observe(ids.size());
    recorded->prompt_tokens_computed->Inc(0);
    for (size_t i = 0; i < ids.size(); ++i) {
      recorded->inter_token_latency->Observe(absl::ToDoubleSeconds(now - last));
      recorded->generated_tokens->Inc(1);
    }
    last = now;
    const int64_t allocations = AllocationCount() - before;
    if (step > 0) {
      EXPECT_EQ(allocations, 0) << "decode step " << step;
    }
  }
  // What was recorded is there to scrape.
  EXPECT_NE(metrics::RenderText(registry).find(
                "pdserve_worker_generated_tokens_total{model=\"tiny\","
                "role=\"decode\",worker_id=\"decode-0\"} 120"),
            std::string::npos);
}

}  // namespace
}  // namespace pdserve::worker
