#include "loadgen/workload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <set>

#include "loadgen/metrics.h"
#include "nlohmann/json.hpp"

namespace pdserve::loadgen {
namespace {

using ::testing::HasSubstr;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/" + name;
  std::ofstream(path) << text;
  return path;
}

void ExpectOrdinaryTokens(const BenchRequest& r, int32_t vocab) {
  for (uint32_t id : r.prompt) {
    ASSERT_GE(id, 256u);
    ASSERT_LT(id, uint32_t(vocab));
  }
}

TEST(WorkloadTest, FixedLengthsAreExactAndPromptsDiffer) {
  WorkloadOptions o;
  o.num_requests = 10;
  o.prompt_tokens = 33;
  o.output_tokens = 7;
  o.vocab_size = 1000;
  auto requests = MakeWorkload(o);
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 10u);
  std::set<std::vector<uint32_t>> distinct;
  for (const BenchRequest& r : *requests) {
    EXPECT_EQ(r.prompt.size(), 33u);
    EXPECT_EQ(r.output_tokens, 7);
    EXPECT_FALSE(r.arrival.has_value());
    ExpectOrdinaryTokens(r, 1000);
    distinct.insert(r.prompt);
  }
  EXPECT_EQ(distinct.size(), 10u);  // no accidental prefix-cache hits
}

TEST(WorkloadTest, OutputsMayHaveARangeOfTheirOwn) {
  // The long-prompt mix of bench/disagg_vs_colocated: prompts 1000-4000,
  // outputs 100-300.
  WorkloadOptions o;
  o.kind = WorkloadKind::kUniform;
  o.num_requests = 300;
  o.prompt_tokens = 2500;
  o.range_ratio = 0.6;
  o.output_tokens = 200;
  o.output_range_ratio = 0.5;
  auto w = MakeWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  int32_t shortest = INT32_MAX, longest = 0;
  for (const BenchRequest& r : *w) {
    EXPECT_GE(r.prompt.size(), 1000u);
    EXPECT_LE(r.prompt.size(), 4000u);
    EXPECT_GE(r.output_tokens, 100);
    EXPECT_LE(r.output_tokens, 300);
    shortest = std::min(shortest, r.output_tokens);
    longest = std::max(longest, r.output_tokens);
  }
  EXPECT_LT(shortest, 120);  // spread over the output range, not the prompts'
  EXPECT_GT(longest, 280);
  o.output_range_ratio = 1;
  EXPECT_FALSE(MakeWorkload(o).ok());
}

TEST(WorkloadTest, UniformLengthsStayInRangeAndRepeatWithTheSeed) {
  WorkloadOptions o;
  o.kind = WorkloadKind::kUniform;
  o.num_requests = 400;
  o.prompt_tokens = 100;
  o.output_tokens = 20;
  o.range_ratio = 0.5;
  auto a = MakeWorkload(o);
  auto b = MakeWorkload(o);
  o.seed = 1;
  auto c = MakeWorkload(o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::set<size_t> prompt_lengths;
  for (const BenchRequest& r : *a) {
    EXPECT_GE(r.prompt.size(), 50u);
    EXPECT_LE(r.prompt.size(), 150u);
    EXPECT_GE(r.output_tokens, 10);
    EXPECT_LE(r.output_tokens, 30);
    prompt_lengths.insert(r.prompt.size());
  }
  EXPECT_GT(prompt_lengths.size(), 50u);  // actually spread
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt, (*b)[i].prompt);
  }
  EXPECT_NE((*a)[0].prompt, (*c)[0].prompt);
}

TEST(WorkloadTest, SharedPrefixRequestsShareExactlyTheirSystemPrompt) {
  WorkloadOptions o;
  o.kind = WorkloadKind::kSharedPrefix;
  o.num_requests = 8;
  o.num_prefixes = 2;
  o.prefix_tokens = 64;
  o.prompt_tokens = 16;
  auto requests = MakeWorkload(o);
  ASSERT_TRUE(requests.ok()) << requests.status();
  auto prefix = [](const BenchRequest& r) {
    return std::vector<uint32_t>(r.prompt.begin(), r.prompt.begin() + 64);
  };
  for (const BenchRequest& r : *requests) ASSERT_EQ(r.prompt.size(), 80u);
  EXPECT_EQ(prefix((*requests)[0]), prefix((*requests)[2]));
  EXPECT_EQ(prefix((*requests)[1]), prefix((*requests)[7]));
  EXPECT_NE(prefix((*requests)[0]), prefix((*requests)[1]));
  EXPECT_NE((*requests)[0].prompt, (*requests)[2].prompt);
}

TEST(WorkloadTest, TraceReplaysLengthsArrivalsAndSharedBlocks) {
  WorkloadOptions o;
  o.kind = WorkloadKind::kTrace;
  o.trace_block_tokens = 4;
  o.trace_speedup = 2;
  o.num_requests = 0;
  o.trace_path = WriteFile(
      "t.jsonl",
      R"({"timestamp": 3000, "input_length": 10, "output_length": 5, "hash_ids": [7, 8, 9]}
{"timestamp": 1000, "input_length": 9, "output_length": 3, "hash_ids": [7, 8]}

{"timestamp": 2000, "input_length": 6, "output_length": 2}
)");
  auto requests = MakeWorkload(o);
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 3u);
  // Sorted by time, and replayed twice as fast.
  EXPECT_EQ(*(*requests)[0].arrival, absl::Milliseconds(500));
  EXPECT_EQ(*(*requests)[1].arrival, absl::Milliseconds(1000));
  EXPECT_EQ(*(*requests)[2].arrival, absl::Milliseconds(1500));
  const BenchRequest& early = (*requests)[0];
  const BenchRequest& late = (*requests)[2];
  EXPECT_EQ(early.prompt.size(), 9u);
  EXPECT_EQ(early.output_tokens, 3);
  EXPECT_EQ(late.prompt.size(), 10u);
  EXPECT_EQ((*requests)[1].prompt.size(), 6u);
  // Blocks 7 and 8 are the same 8 tokens in both; the rest differs.
  EXPECT_TRUE(std::equal(early.prompt.begin(), early.prompt.begin() + 8,
                         late.prompt.begin()));
  EXPECT_NE(early.prompt[8], late.prompt[8]);
}

TEST(WorkloadTest, BadTracesNameTheFileAndLine) {
  WorkloadOptions o;
  o.kind = WorkloadKind::kTrace;
  o.trace_path = WriteFile("bad.jsonl",
                           "{\"timestamp\": 0, \"input_length\": 4, "
                           "\"output_length\": 1}\nnot json\n");
  auto bad = MakeWorkload(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.jsonl:2"));

  o.trace_path = WriteFile("neg.jsonl",
                           "{\"timestamp\": 0, \"input_length\": -4, "
                           "\"output_length\": 1}\n");
  bad = MakeWorkload(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input_length"));

  o.trace_path = WriteFile("huge.jsonl",
                           "{\"timestamp\": 0, \"input_length\": 1e30, "
                           "\"output_length\": 1}\n");
  bad = MakeWorkload(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input_length"));

  o.trace_path = "/nonexistent/trace.jsonl";
  EXPECT_EQ(MakeWorkload(o).status().code(), absl::StatusCode::kNotFound);
}

TEST(WorkloadTest, BadOptionsAreRefused) {
  WorkloadOptions o;
  o.prompt_tokens = 0;
  EXPECT_FALSE(MakeWorkload(o).ok());
  o = {};
  o.vocab_size = 10;
  EXPECT_FALSE(MakeWorkload(o).ok());
  o = {};
  o.kind = WorkloadKind::kUniform;
  o.range_ratio = 1.5;
  EXPECT_FALSE(MakeWorkload(o).ok());
  EXPECT_FALSE(ParseWorkloadKind("sharegpt").ok());
  EXPECT_EQ(*ParseWorkloadKind("shared_prefix"), WorkloadKind::kSharedPrefix);
}

TEST(WorkloadTest, SyntheticChatTraceIsLongTailedAtItsRate) {
  SyntheticTraceOptions t;
  t.num_requests = 2000;
  t.rate = 4;
  WorkloadOptions o;
  o.kind = WorkloadKind::kTrace;
  o.num_requests = 0;
  o.trace_path = WriteFile("synthetic.jsonl", SyntheticChatTrace(t));
  auto requests = MakeWorkload(o);
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 2000u);
  std::vector<double> prompts, outputs;
  int shared_starts = 0;
  for (const BenchRequest& r : *requests) {
    prompts.push_back(r.prompt.size());
    outputs.push_back(r.output_tokens);
    EXPECT_LE(r.prompt.size(), size_t(t.max_prompt_tokens));
    EXPECT_GE(r.output_tokens, t.min_tokens);
    // Shared system prompts make equal first blocks.
    for (const BenchRequest& other : *requests) {
      if (&other == &r) break;
      if (r.prompt.size() >= 16 && other.prompt.size() >= 16 &&
          std::equal(r.prompt.begin(), r.prompt.begin() + 16,
                     other.prompt.begin())) {
        ++shared_starts;
        break;
      }
    }
  }
  // Log-normal: a median near the one asked for, a long right tail.
  EXPECT_NEAR(Percentile(prompts, 0.5), t.prompt_median,
              0.15 * t.prompt_median);
  EXPECT_GT(Percentile(prompts, 0.99), 4 * Percentile(prompts, 0.5));
  EXPECT_GT(Percentile(outputs, 0.99), 3 * Percentile(outputs, 0.5));
  EXPECT_GT(shared_starts, 600);
  EXPECT_LT(shared_starts, 1400);
  // 2000 requests at 4/s: about 500 s.
  EXPECT_NEAR(absl::ToDoubleSeconds(*requests->back().arrival), 500, 50);
}

}  // namespace
}  // namespace pdserve::loadgen
