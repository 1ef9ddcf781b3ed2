// pdctl profile's pure parts: prompts, the figures taken from arrival
// times, the grid's monotonicity and the JSON. The command against a real
// cluster is tests/profile_test.cc.
#include "cli/profile.h"

#include <gtest/gtest.h>

#include <set>

#include "planner/capacity_profile.h"

namespace pdserve::cli {
namespace {

TEST(ProfileTest, PromptsHaveExactLengthIdsInRangeAndDistinctLeadingTokens) {
  const TokenRange range = PromptTokenRange(49152);
  EXPECT_EQ(range.first, 256u);
  EXPECT_EQ(range.end, 49152u);
  const TokenRange small = PromptTokenRange(300);
  EXPECT_EQ(small.first, 150u);
  EXPECT_EQ(small.end, 300u);

  std::mt19937_64 rng(1);
  std::set<std::vector<uint32_t>> leading;
  for (uint64_t serial = 0; serial < 2000; ++serial) {
    const std::vector<uint32_t> p = MakePromptTokens(serial, 37, small, rng);
    ASSERT_EQ(p.size(), 37u);
    for (uint32_t id : p) {
      ASSERT_GE(id, small.first);
      ASSERT_LT(id, small.end);
    }
    // The first KV block (16 tokens) differs between any two serials.
    leading.insert(std::vector<uint32_t>(p.begin(), p.begin() + 16));
  }
  EXPECT_EQ(leading.size(), 2000u);
  EXPECT_EQ(MakePromptTokens(5, 1, small, rng).size(), 1u);
  EXPECT_TRUE(MakePromptTokens(5, 0, small, rng).empty());
}

TEST(ProfileTest, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({}), 0);
}

TEST(ProfileTest, BurstThroughputSubtractsTheLoneLatency) {
  // A lone 100-token prompt answers in 0.15 s (0.1 s of compute, 0.05 s of
  // pipeline); a burst of 5 in 0.55 s: 4 more prompts, 400 tokens, in
  // 0.4 s.
  absl::StatusOr<double> tps = BurstTokensPerSecond(100, 5, 0.15, 0.55);
  ASSERT_TRUE(tps.ok()) << tps.status();
  EXPECT_NEAR(*tps, 1000, 1e-6);
  // A burst answered no later than a lone prompt measures nothing.
  EXPECT_EQ(BurstTokensPerSecond(100, 5, 0.15, 0.15).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BurstTokensPerSecond(100, 1, 0.15, 0.5).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A stream that starts at `first`, then a token every `step` seconds.
TokenArrivals Stream(double first, double step, int tokens) {
  TokenArrivals a;
  for (int i = 0; i < tokens; ++i) {
    a.times_s.push_back(first + i * step);
    a.tokens.push_back(1);
  }
  return a;
}

TEST(ProfileTest, SteadyItlIgnoresTheRampWhereFewerStreamsRun) {
  // Three streams starting 0.5 s apart. While fewer than three run, steps
  // take 0.01 s; with all three, 0.03 s. A stream's tokens: 0.01 s gaps
  // until t = 1.0, then 0.03 s gaps.
  auto stream = [](double first, int tokens) {
    TokenArrivals a;
    double t = first;
    for (int i = 0; i < tokens; ++i) {
      a.times_s.push_back(t);
      a.tokens.push_back(1);
      t += t < 1.0 - 1e-9 ? 0.01 : 0.03;
    }
    return a;
  };
  const std::vector<TokenArrivals> streams = {stream(0.0, 130), stream(0.5, 80),
                                              stream(1.0, 30)};
  absl::StatusOr<SteadyItl> itl = SteadyStateItl(streams);
  ASSERT_TRUE(itl.ok()) << itl.status();
  EXPECT_NEAR(itl->itl_s, 0.03, 1e-9);
  EXPECT_NEAR(itl->window_start_s, 1.0, 1e-9);
  // Over every gap the ramp's 0.01 s gaps are the majority: the median
  // taken over all gaps would be wrong.
  std::vector<double> all;
  for (const TokenArrivals& s : streams) {
    for (size_t i = 1; i < s.times_s.size(); ++i) {
      all.push_back(s.times_s[i] - s.times_s[i - 1]);
    }
  }
  EXPECT_NEAR(Median(all), 0.01, 1e-6);
}

TEST(ProfileTest, SteadyItlSplitsAChunkOfSeveralTokens) {
  TokenArrivals a = Stream(0, 0.02, 12);
  // Two tokens arrive together at the end, 0.04 s after the one before.
  a.times_s.push_back(a.times_s.back() + 0.04);
  a.tokens.push_back(2);
  absl::StatusOr<SteadyItl> itl = SteadyStateItl({a});
  ASSERT_TRUE(itl.ok()) << itl.status();
  EXPECT_NEAR(itl->itl_s, 0.02, 1e-9);
  EXPECT_EQ(itl->gaps, 13);
}

TEST(ProfileTest, SteadyItlRefusesAWindowWithTooFewGaps) {
  // The second stream starts as the first ends: no window.
  absl::StatusOr<SteadyItl> itl =
      SteadyStateItl({Stream(0, 0.01, 20), Stream(0.19, 0.01, 20)});
  ASSERT_FALSE(itl.ok());
  EXPECT_EQ(itl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(itl.status().message().find("--decode_tokens"), std::string::npos)
      << itl.status();
  // Four streams need 12 gaps in the window: 3 steps of each.
  std::vector<TokenArrivals> four;
  for (int i = 0; i < 4; ++i) four.push_back(Stream(0.01 * i, 0.01, 5));
  EXPECT_FALSE(SteadyStateItl(four).ok());
  EXPECT_FALSE(SteadyStateItl({TokenArrivals()}).ok());
  EXPECT_FALSE(SteadyStateItl({}).ok());
}

TEST(ProfileTest, RunningMaximumAlongTheBatchAxisIsReported) {
  std::vector<std::vector<double>> itl = {
      {0.010, 0.020}, {0.009, 0.030}, {0.040, 0.025}};
  const std::vector<std::string> raised =
      EnforceNonDecreasingInBatch({1, 4, 16}, {16, 128}, &itl);
  EXPECT_EQ(itl, (std::vector<std::vector<double>>{
                     {0.010, 0.020}, {0.010, 0.030}, {0.040, 0.030}}));
  ASSERT_EQ(raised.size(), 2u);
  EXPECT_NE(raised[0].find("batch 4, context 16"), std::string::npos)
      << raised[0];
  EXPECT_NE(raised[1].find("batch 16, context 128"), std::string::npos)
      << raised[1];
}

TEST(ProfileTest, CpuDescriptionCountsThreads) {
  EXPECT_EQ(CpuDescription("processor\t: 0\nmodel name\t: Xeon X\n\n"
                           "processor\t: 1\nmodel name\t: Xeon X\n"),
            "Xeon X (2 threads)");
  EXPECT_EQ(CpuDescription(""), "unknown CPU");
}

TEST(ProfileTest, FlagsAndGrids) {
  EXPECT_EQ(LastIntFlag({"--threads=1", "--max_running=8", "--max_running=4"},
                        "max_running", 64),
            4);
  EXPECT_EQ(LastIntFlag({"--threads=1"}, "max_running", 64), 64);
  absl::StatusOr<std::vector<int>> grid = ParseGrid("g", {"128", "32", "32"});
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(*grid, (std::vector<int>{32, 128}));
  EXPECT_FALSE(ParseGrid("g", {}).ok());
  EXPECT_FALSE(ParseGrid("g", {"0"}).ok());
  EXPECT_FALSE(ParseGrid("g", {"x"}).ok());
}

TEST(ProfileTest, JsonParsesAsACapacityProfile) {
  ProfileResult r;
  r.model = "tiny \"q\"";
  r.hardware = "cpu";
  r.source = "pdctl profile test";
  r.cost_unit = "workers";
  r.prefill_load_time_s = 1.25;
  r.decode_load_time_s = 1.5;
  r.prefill = {{32, 900, 0.05}, {128, 1000, 0.15}};
  r.max_batch = 64;
  r.kv_capacity_tokens = 8192;
  r.batch_sizes = {1, 4};
  r.context_lengths = {16, 128};
  r.itl_s = {{0.003, 0.0031}, {0.012, 0.0125}};
  r.cells = {{1, 16, 0.003, 20, 0.1}};
  r.notes = {"a note"};
  absl::StatusOr<std::string> text = ValidatedProfileJson(r);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<planner::CapacityProfile> p =
      planner::CapacityProfile::Parse(*text);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->model(), "tiny \"q\"");
  EXPECT_EQ(p->max_batch(), 64);
  EXPECT_EQ(p->kv_capacity_tokens(), 8192);
  EXPECT_EQ(p->decode_load_time_s(), 1.5);
  EXPECT_NEAR(p->DecodeStepSeconds(4, 128), 0.0125, 1e-12);
  EXPECT_NEAR(p->LoneTtftSeconds(128), 0.15, 1e-12);
  EXPECT_NEAR(p->PrefillTokensPerSecond(32), 900, 1e-9);

  // A grid that breaks the parser's rule is caught before it is written.
  r.itl_s = {{0.003, 0.0031}, {0.002, 0.0125}};
  EXPECT_EQ(ValidatedProfileJson(r).status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace pdserve::cli
