#include "planner/capacity_profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace pdserve::planner {
namespace {

using ::testing::HasSubstr;

constexpr char kCommitted[] = "planner/profiles/smollm2-135m-q4_1-cpu1.json";

// A small profile whose numbers are easy to check by hand.
std::string Profile(const std::string& prefill_points,
                    const std::string& itl = "[[0.01, 0.02], [0.05, 0.10]]") {
  return R"({"version": 1, "cost_unit": "gpus",
    "prefill": {"cost": 2, "load_time_s": 40, "points": )" +
         prefill_points + R"(},
    "decode": {"cost": 1, "max_batch": 16, "kv_capacity_tokens": 8000,
               "batch_sizes": [1, 9], "context_tokens": [100, 1100],
               "itl_s": )" +
         itl + "}}";
}

const char kPoints[] =
    R"([{"prompt_tokens": 100, "tokens_per_s": 1000, "ttft_s": 0.15},
        {"prompt_tokens": 1000, "tokens_per_s": 500, "ttft_s": 2.1}])";

TEST(CapacityProfileTest, InterpolatesAndExtrapolatesTimes) {
  auto p = CapacityProfile::Parse(Profile(kPoints));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cost_unit(), "gpus");
  EXPECT_EQ(p->prefill_cost(), 2);
  EXPECT_EQ(p->decode_cost(), 1);
  EXPECT_EQ(p->prefill_load_time_s(), 40);
  EXPECT_EQ(p->decode_load_time_s(), 0);
  // Busy seconds: 0.1 s at 100 tokens, 2 s at 1000; halfway between: 1.05.
  EXPECT_NEAR(p->PrefillSeconds(100), 0.1, 1e-12);
  EXPECT_NEAR(p->PrefillSeconds(550), 1.05, 1e-12);
  // Past the last point along the last segment (1.9 s per 900 tokens).
  EXPECT_NEAR(p->PrefillSeconds(1900), 3.9, 1e-12);
  // Below the first: the first point's throughput.
  EXPECT_NEAR(p->PrefillSeconds(50), 0.05, 1e-12);
  EXPECT_NEAR(p->PrefillTokensPerSecond(1000), 500, 1e-9);
  EXPECT_NEAR(p->LoneTtftSeconds(550), 1.125, 1e-12);
  EXPECT_NEAR(p->LoneTtftSeconds(10), 0.15, 1e-12);

  // Decode: bilinear in (batch, context).
  EXPECT_NEAR(p->DecodeStepSeconds(1, 100), 0.01, 1e-12);
  EXPECT_NEAR(p->DecodeStepSeconds(5, 100), 0.03, 1e-12);
  EXPECT_NEAR(p->DecodeStepSeconds(5, 600), 0.045, 1e-12);
  // Batch 17: the batch segment continued (0.05 + 8 * 0.005 at 100).
  EXPECT_NEAR(p->DecodeStepSeconds(17, 100), 0.09, 1e-12);
  // Context below the first point takes the first's time; a fractional
  // batch under 1 is one stream.
  EXPECT_NEAR(p->DecodeStepSeconds(0.3, 10), 0.01, 1e-12);
}

TEST(CapacityProfileTest, MaxBatchForItlHonoursStepTimeBatchAndKv) {
  auto p = CapacityProfile::Parse(Profile(kPoints));
  ASSERT_TRUE(p.ok()) << p.status();
  // At context 100 the step is 0.01 + 0.005 (b - 1): 0.03 s allows b = 5.
  EXPECT_NEAR(p->MaxBatchForItl(0.03, 100), 5, 1e-6);
  // Looser than max_batch's step: max_batch (16).
  EXPECT_NEAR(p->MaxBatchForItl(1.0, 100), 16, 1e-9);
  // The KV cache holds 8000 tokens: 8 streams of 1000.
  EXPECT_NEAR(p->MaxBatchForItl(1.0, 1000), 8, 1e-9);
  // One stream is already too slow: 0.
  EXPECT_EQ(p->MaxBatchForItl(0.005, 100), 0);
}

TEST(CapacityProfileTest, CommittedProfileLoadsWithItsMeasuredPoints) {
  auto p = CapacityProfile::Load(kCommitted);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cost_unit(), "cores");
  // One thread: a 128-token prompt in 0.32 s busy, 0.34 s TTFT; one
  // stream's step 12.3 ms at a short context (bench/results/README.md).
  EXPECT_NEAR(p->PrefillSeconds(128), 0.32, 1e-9);
  EXPECT_NEAR(p->LoneTtftSeconds(128), 0.34, 1e-9);
  EXPECT_NEAR(p->DecodeStepSeconds(1, 16), 0.0123, 1e-9);
  EXPECT_EQ(p->max_batch(), 64);
  // A 50 ms ITL target fits about 7 short streams per worker.
  EXPECT_NEAR(p->MaxBatchForItl(0.05, 16), 6.97, 0.01);
}

TEST(CapacityProfileTest, MeasuredProfileLoads) {
  // pdctl profile's output for the same workers (docs/planner.md).
  auto p = CapacityProfile::Load(
      "planner/profiles/smollm2-135m-q4_1-cpu1.measured.json");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cost_unit(), "cores");
  EXPECT_EQ(p->max_batch(), 64);
  EXPECT_EQ(p->prefill_points().size(), 4u);
  EXPECT_NE(p->source().find("pdctl profile"), std::string::npos);
}

void ExpectInvalid(const std::string& text, const std::string& message) {
  auto p = CapacityProfile::Parse(text);
  ASSERT_FALSE(p.ok()) << text;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr(message)) << text;
}

TEST(CapacityProfileTest, BadProfilesNameWhatIsWrong) {
  ExpectInvalid("not json", "not a JSON object");
  ExpectInvalid("[1, 2]", "not a JSON object");
  ExpectInvalid(R"({"prefill": {}})", "version must be 1");
  ExpectInvalid(R"({"version": 2})", "version must be 1");
  ExpectInvalid(R"({"version": 1})", "prefill must be an object");
  ExpectInvalid(Profile("[]"), "prefill.points must be a non-empty array");
  ExpectInvalid(Profile(R"([{"prompt_tokens": 100, "tokens_per_s": 1000}])"),
                "prefill.points[0].ttft_s must be a number");
  ExpectInvalid(
      Profile(R"([{"prompt_tokens": 100, "tokens_per_s": -5, "ttft_s": 0.1}])"),
      "prefill.points[0].tokens_per_s must be > 0");
  ExpectInvalid(
      Profile(R"([{"prompt_tokens": 100, "tokens_per_s": 1, "ttft_s": 1},
                  {"prompt_tokens": 100, "tokens_per_s": 1, "ttft_s": 1}])"),
      "prefill.points[1].prompt_tokens must be larger");
  ExpectInvalid(Profile(kPoints, "[[0.01, 0.02]]"),
                "decode.itl_s must be an array of 2 rows");
  ExpectInvalid(Profile(kPoints, "[[0.01, 0.02], [0.05]]"),
                "decode.itl_s[1] must hold 2 numbers");
  ExpectInvalid(Profile(kPoints, "[[0.01, 0.02], [0.05, \"x\"]]"),
                "decode.itl_s[1][1] must be a number > 0");
  ExpectInvalid(Profile(kPoints, "[[0.01, 0.02], [0.005, 0.1]]"),
                "decode.itl_s[1][0] is below the smaller batch's step time");
  std::string no_kv = Profile(kPoints);
  no_kv.replace(no_kv.find("\"kv_capacity_tokens\": 8000,"),
                sizeof("\"kv_capacity_tokens\": 8000,") - 1, "");
  ExpectInvalid(no_kv, "decode.kv_capacity_tokens must be a number");
  std::string batch2 = Profile(kPoints);
  batch2.replace(batch2.find("[1, 9]"), 6, "[2, 9]");
  ExpectInvalid(batch2, "decode.batch_sizes must start at 1");
}

TEST(CapacityProfileTest, MissingFileIsNotFoundAndBadFileNamesThePath) {
  auto missing = CapacityProfile::Load("/nonexistent/profile.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("/nonexistent/profile.json"));
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/bad_profile.json";
  FILE* f = fopen(path.c_str(), "w");
  fputs("{\"version\": 1}", f);
  fclose(f);
  auto bad = CapacityProfile::Load(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(path + ": capacity profile"));
}

}  // namespace
}  // namespace pdserve::planner
