// The runner's schedules and the metrics' arithmetic, against a target in
// this process (the real targets are driven in tests/slo and
// tests/loadgen_cluster_test).
#include <gtest/gtest.h>

#include <cmath>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "loadgen/metrics.h"
#include "loadgen/runner.h"

namespace pdserve::loadgen {
namespace {

// Answers after `latency` with every token asked for; counts how many
// requests it held at once.
class SleepyTarget : public Target {
 public:
  explicit SleepyTarget(absl::Duration latency) : latency_(latency) {}
  RequestRecord Send(const BenchRequest& request, absl::Time run_start,
                     absl::Duration) override {
    RequestRecord r;
    r.index = request.index;
    r.sent_at = absl::Now() - run_start;
    {
      absl::MutexLock lock(&mu_);
      peak_ = std::max(peak_, ++now_);
    }
    absl::SleepFor(latency_);
    {
      absl::MutexLock lock(&mu_);
      --now_;
    }
    r.ttft = latency_ / 2;
    r.e2e = latency_;
    r.output_tokens = request.output_tokens;
    return r;
  }
  std::string Describe() const override { return "sleepy"; }
  int peak() {
    absl::MutexLock lock(&mu_);
    return peak_;
  }

 private:
  const absl::Duration latency_;
  absl::Mutex mu_;
  int now_ = 0, peak_ = 0;
};

std::vector<BenchRequest> Requests(int n) {
  std::vector<BenchRequest> requests(n);
  for (int i = 0; i < n; ++i) {
    requests[i].index = i;
    requests[i].output_tokens = 4;
  }
  return requests;
}

double MeanGap(const std::vector<absl::Duration>& t) {
  return absl::ToDoubleSeconds(t.back() - t.front()) / (t.size() - 1);
}

double GapCv2(const std::vector<absl::Duration>& t) {
  const double mean = MeanGap(t);
  double var = 0;
  for (size_t i = 1; i < t.size(); ++i) {
    const double g = absl::ToDoubleSeconds(t[i] - t[i - 1]) - mean;
    var += g * g;
  }
  var /= t.size() - 2;
  return var / (mean * mean);
}

TEST(ArrivalsTest, PoissonAndGammaHaveTheAskedRateAndBurstiness) {
  const auto poisson = ArrivalOffsets(20000, 8, 1.0, 1);
  EXPECT_EQ(poisson.front(), absl::ZeroDuration());
  EXPECT_NEAR(MeanGap(poisson), 1.0 / 8, 0.03 / 8);
  EXPECT_NEAR(GapCv2(poisson), 1.0, 0.1);  // exponential: CV^2 = 1
  // Gamma shape k: CV^2 = 1 / k.
  const auto bursty = ArrivalOffsets(20000, 8, 0.25, 1);
  EXPECT_NEAR(MeanGap(bursty), 1.0 / 8, 0.06 / 8);
  EXPECT_NEAR(GapCv2(bursty), 4.0, 0.6);
  const auto regular = ArrivalOffsets(20000, 8, 4, 1);
  EXPECT_NEAR(GapCv2(regular), 0.25, 0.05);
  // Same seed, same schedule; infinite rate: all at once.
  EXPECT_EQ(ArrivalOffsets(50, 8, 1, 9), ArrivalOffsets(50, 8, 1, 9));
  for (absl::Duration d :
       ArrivalOffsets(5, std::numeric_limits<double>::infinity(), 1, 0)) {
    EXPECT_EQ(d, absl::ZeroDuration());
  }
}

TEST(RunLoadTest, MaxConcurrencyIsAClosedLoopOfThatManyClients) {
  SleepyTarget target(absl::Milliseconds(40));
  LoadOptions options;
  options.max_concurrency = 3;
  std::vector<LoadOptions::Progress> seen;
  options.progress_interval = absl::Milliseconds(50);
  options.on_progress = [&](const LoadOptions::Progress& p) {
    seen.push_back(p);
  };
  const LoadResult result = RunLoad(target, Requests(12), options);
  EXPECT_EQ(target.peak(), 3);
  ASSERT_EQ(result.records.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(result.records[i].index, i);
  // Four waves of 40 ms.
  EXPECT_GE(result.duration, absl::Milliseconds(160));
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().finished, 12);
  EXPECT_EQ(seen.back().sent, 12);
}

TEST(RunLoadTest, TraceArrivalsAreKept) {
  SleepyTarget target(absl::Milliseconds(5));
  std::vector<BenchRequest> requests = Requests(3);
  requests[0].arrival = absl::ZeroDuration();
  requests[1].arrival = absl::Milliseconds(150);
  requests[2].arrival = absl::Milliseconds(300);
  const LoadResult result = RunLoad(target, requests, {});
  EXPECT_NEAR(absl::ToDoubleMilliseconds(result.records[1].sent_at), 150, 40);
  EXPECT_NEAR(absl::ToDoubleMilliseconds(result.records[2].sent_at), 300, 40);
  EXPECT_GE(result.duration, absl::Milliseconds(300));
}

TEST(MetricsTest, PercentilesInterpolateAsNumpyDoes) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = 2.5, 3.7, 3.97
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 0.9), 3.7, 1e-12);
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 0.99), 3.97, 1e-12);
  EXPECT_EQ(Percentile({}, 0.5), 0);
  const Distribution d = Describe({10, 20, 30});
  EXPECT_EQ(d.count, 3);
  EXPECT_DOUBLE_EQ(d.mean, 20);
  EXPECT_DOUBLE_EQ(d.max, 30);
}

RequestRecord Done(double ttft_ms, double e2e_ms, int tokens) {
  RequestRecord r;
  r.prompt_tokens = 10;
  r.output_tokens = tokens;
  r.ttft = absl::Milliseconds(ttft_ms);
  r.e2e = absl::Milliseconds(e2e_ms);
  return r;
}

TEST(MetricsTest, GoodputCountsOnlyRequestsMeetingBothTargets) {
  LoadResult result;
  result.duration = absl::Seconds(2);
  result.records = {
      Done(100, 1000, 10),  // TPOT 100: meets both
      Done(300, 1200, 10),  // TTFT 300: misses TTFT
      Done(100, 2800, 10),  // TPOT 300: misses TPOT
      Done(50, 50, 1),      // one token: TPOT 0
  };
  RequestRecord failed;
  failed.error_kind = "RESOURCE_EXHAUSTED";
  result.records.push_back(failed);
  result.records.push_back(failed);

  const LoadSummary s =
      Summarize(result, {.ttft_ms = 200, .tpot_ms = 150}, 3, 0);
  EXPECT_EQ(s.sent, 6);
  EXPECT_EQ(s.completed, 4);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.failures.at("RESOURCE_EXHAUSTED"), 2);
  EXPECT_EQ(s.met_slo, 2);
  EXPECT_DOUBLE_EQ(s.goodput, 1.0);
  EXPECT_DOUBLE_EQ(s.slo_attainment, 2.0 / 6);
  EXPECT_DOUBLE_EQ(s.request_throughput, 2.0);
  EXPECT_DOUBLE_EQ(s.output_token_throughput, 31 / 2.0);
  EXPECT_EQ(s.tpot_ms.count, 3);         // the one-token answer has none
  EXPECT_DOUBLE_EQ(s.tpot_ms.p50, 100);  // of 100, 100 and 300
  // No SLO: every completed request counts.
  EXPECT_EQ(Summarize(result, {}, 3, 0).met_slo, 4);

  const std::string text = FormatSummary(s);
  EXPECT_NE(text.find("RESOURCE_EXHAUSTED"), std::string::npos) << text;
  EXPECT_NE(text.find("goodput"), std::string::npos) << text;
  const nlohmann::json j = ToJson(s);
  EXPECT_EQ(j["failures"]["RESOURCE_EXHAUSTED"], 2);
  EXPECT_EQ(j["request_rate"], 3.0);
  EXPECT_EQ(ToJson(result.records).size(), 6u);
}

TEST(MetricsTest, TheLongestGapSloFailsAStreamThatStalledOnce) {
  // Same TTFT and TPOT; one stream stalls 400 ms once (a colocated worker
  // running a whole prefill chunk), the other never gaps over 60 ms.
  RequestRecord steady = Done(100, 1000, 10);
  steady.itl_ms = {50, 60, 55, 50, 45, 60, 40, 50, 40};
  RequestRecord stalled = Done(100, 1000, 10);
  stalled.itl_ms = {10, 10, 400, 10, 10, 10, 10, 20, 20};
  LoadResult result;
  result.duration = absl::Seconds(1);
  result.records = {steady, stalled};
  const LoadSummary s = Summarize(
      result, {.ttft_ms = 200, .tpot_ms = 150, .max_itl_ms = 100}, 2, 0);
  EXPECT_EQ(s.met_slo, 1);
  EXPECT_EQ(s.max_itl_ms.count, 2);
  EXPECT_DOUBLE_EQ(s.max_itl_ms.max, 400);
  EXPECT_DOUBLE_EQ(s.max_itl_ms.p50, 230);  // between 60 and 400
  // Without the gap target both meet TTFT and TPOT.
  EXPECT_EQ(Summarize(result, {.ttft_ms = 200, .tpot_ms = 150}, 2, 0).met_slo,
            2);
  EXPECT_NE(FormatSummary(s).find("longest gap <= 100 ms"), std::string::npos);
  EXPECT_EQ(ToJson(s)["slo_max_itl_ms"], 100.0);
}

}  // namespace
}  // namespace pdserve::loadgen
