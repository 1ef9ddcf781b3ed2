#include "planner/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

using ::testing::HasSubstr;

constexpr char kProfile[] = "planner/profiles/smollm2-135m-q4_1-cpu1.json";

CapacityProfile Profile() {
  auto p = CapacityProfile::Load(kProfile);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

LoadEstimate Load(double rate, double prompt, double output) {
  LoadEstimate l;
  l.request_rate = rate;
  l.prompt.Add(prompt, 1000);
  l.output.Add(output, 1000);
  return l;
}

TEST(SizingTest, PrefillMeetsTheTargetWithTheFewestWorkers) {
  const CapacityProfile p = Profile();
  // 5 prompts/s of 128 tokens, 0.32 s busy each: 1.6 workers busy.
  const LoadEstimate load = Load(5, 128, 100);
  const Sizing s = SizePrefill(p, load, 1.0, 0.99, 1000);
  ASSERT_TRUE(s.feasible) << s.why;
  EXPECT_GE(s.replicas, 2);
  EXPECT_LE(s.predicted_latency_s, 1.0);
  EXPECT_GT(PredictTtft(p, load, s.replicas - 1, 0.99), 1.0);
  // A lone 128-token prompt is the floor; queueing adds to it.
  EXPECT_GE(s.predicted_latency_s, 0.34);
  // Half the prompt cached: about half the workers.
  LoadEstimate cached = load;
  cached.cached_prompt_fraction = 0.5;
  EXPECT_LT(SizePrefill(p, cached, 1.0, 0.99, 1000).replicas, s.replicas);
  // Economies of scale: 100x the load needs well under 100x the workers.
  const Sizing big = SizePrefill(p, Load(500, 128, 100), 1.0, 0.99, 1000);
  EXPECT_GE(big.replicas, 160);  // 160 busy
  EXPECT_LT(big.replicas, 100 * s.replicas);
  EXPECT_LT(big.replicas, 180);
}

TEST(SizingTest, PrefillTargetBelowALonePromptIsInfeasibleAndSaysSo) {
  // A 1536-token prompt alone takes 5.15 s: no count meets 2 s.
  const Sizing s = SizePrefill(Profile(), Load(1, 1536, 100), 2.0, 0.99, 1000);
  EXPECT_FALSE(s.feasible);
  EXPECT_THAT(s.why, HasSubstr("infeasible"));
  // Sized for throughput: 1 req/s x 5.12 s busy at 80 %: 7 workers.
  EXPECT_EQ(s.replicas, 7);
}

TEST(SizingTest, DecodeUsesLittlesLawAndTheProfilesStepTime) {
  const CapacityProfile p = Profile();
  // 2 req/s x 99 decode tokens = 198 tokens/s; one stream's step at this
  // context is ~13 ms, so one worker alone cannot keep up at batch 1.
  const LoadEstimate load = Load(2, 128, 100);
  const Sizing s = SizeDecode(p, load, 0.05, 0.99, 1000);
  ASSERT_TRUE(s.feasible) << s.why;
  EXPECT_LE(s.predicted_latency_s, 0.05);
  EXPECT_GT(PredictItl(p, load, s.replicas - 1, 0.99), 0.05);
  EXPECT_GE(s.replicas, 2);
  EXPECT_LE(s.replicas, 6);
  // Longer outputs: more streams at once, more workers.
  EXPECT_GT(SizeDecode(p, Load(2, 128, 400), 0.05, 0.99, 1000).replicas,
            s.replicas);
  // A target under one stream's step is infeasible.
  EXPECT_FALSE(SizeDecode(p, load, 0.01, 0.99, 1000).feasible);
  // Overloaded: the model says so rather than a number.
  EXPECT_GE(PredictItl(p, Load(50, 128, 100), 1, 0.99), 1e6);
  // The mean gap a token sees (one worker is overloaded here): its step
  // holds the mean batch (the median step's) and the token's own stream,
  // and stays under the p99.
  for (int n : {2, 4, 8}) {
    const double mean = PredictMeanItl(p, load, n);
    EXPECT_GT(mean, PredictItl(p, load, n, 0.5)) << n;
    EXPECT_LT(mean, PredictItl(p, load, n, 0.99)) << n;
  }
  EXPECT_GT(PredictMeanItl(p, load, 2), PredictMeanItl(p, load, 4));
}

// The rate a warm planner sizes for at a steady observed rate: the
// forecast plus its Poisson headroom (z 1.5 over 30 s intervals).
double Planned(double rate) { return rate + 1.5 * std::sqrt(rate / 30); }

PlannerOptions Options() {
  PlannerOptions o;
  o.ttft_target_s = 1.0;
  o.itl_target_s = 0.05;
  o.interval_s = 30;
  o.min_prefill = 1;
  o.min_decode = 1;
  o.max_prefill = 200;
  o.max_decode = 200;
  o.scale_down_window_s = 90;
  return o;
}

// Drives a planner like a scaler that applies every decision at once.
class Loop {
 public:
  explicit Loop(PlannerOptions o = Options(), int prefill = 1, int decode = 1)
      : prefill_(prefill), decode_(decode) {
    auto p = Planner::Create(o, Profile());
    EXPECT_TRUE(p.ok()) << p.status();
    planner_ = std::move(*p);
  }
  Decision Step(double rate, double prompt = 128, double output = 100,
                std::optional<double> ttft = std::nullopt,
                double prefill_queue = 0,
                std::optional<Observation::Bucket> ttft_bucket = std::nullopt) {
    Observation o;
    t_ += 30;
    o.time_s = t_;
    o.load.duration_s = 30;
    o.load.requests = rate * 30;
    o.load.prompt.Add(prompt, o.load.requests);
    o.load.output.Add(output, o.load.requests);
    o.ttft_s = ttft;
    o.ttft_samples = ttft ? o.load.requests : 0;
    o.ttft_bucket = ttft_bucket;
    if (itl_mean.has_value()) {
      o.itl_s = itl_p99;
      o.itl_mean_s = itl_mean;
      o.itl_samples = o.load.requests * (output - 1);
    }
    o.retries = retries;
    o.prefill = {prefill_, prefill_, prefill_queue, 0};
    o.decode = {decode_, decode_, 0, 0.3};
    Decision d = planner_->Decide(o);
    prefill_ = d.prefill.desired;
    decode_ = d.decode.desired;
    return d;
  }
  void Operator(int prefill, int decode) {
    prefill_ = prefill;
    decode_ = decode;
  }
  int prefill() const { return prefill_; }
  // Requests retried elsewhere in every later interval.
  double retries = 0;
  // The next intervals' inter-token gaps: mean and p99 (none: no gaps).
  std::optional<double> itl_mean, itl_p99;
  int decode() const { return decode_; }

 private:
  std::unique_ptr<Planner> planner_;
  int prefill_, decode_;
  double t_ = 0;
};

TEST(PlannerTest, SteadyLoadSettlesOnTheModelsSizes) {
  Loop loop;
  Decision d;
  for (int i = 0; i < 8; ++i) d = loop.Step(10);
  const CapacityProfile p = Profile();
  const LoadEstimate load = Load(Planned(10), 128, 100);
  EXPECT_EQ(d.prefill.desired, SizePrefill(p, load, 1.0, 0.99, 200).replicas);
  EXPECT_EQ(d.decode.desired, SizeDecode(p, load, 0.05, 0.99, 200).replicas);
  EXPECT_TRUE(d.warm);
  EXPECT_LE(d.prefill.predicted_latency_s, 1.0);
  EXPECT_LE(d.decode.predicted_latency_s, 0.05);
}

TEST(PlannerTest, ColdStartDoesNotOverScale) {
  // The first interval after start sees a burst (say a backlog of clients
  // that retried while the cluster came up): 40 req/s.
  Loop cold;
  const Decision first = cold.Step(40);
  // Without the cold-start rule the same observation goes all the way.
  PlannerOptions eager_options = Options();
  eager_options.predictor.min_samples = 1;
  Loop eager(eager_options);
  const Decision all_the_way = eager.Step(40);
  EXPECT_GT(all_the_way.decode.desired, 10);
  EXPECT_FALSE(first.warm);
  EXPECT_NEAR(first.cold_start_weight, 1.0 / 3, 1e-9);
  EXPECT_EQ(first.decode.desired,
            1 + std::ceil((all_the_way.decode.desired - 1) / 3.0));
  EXPECT_THAT(first.reasons[0], HasSubstr("cold start: 1 of 3"));
  // Then the load turns out to be 5 req/s: no further growth, and no
  // scale-down while cold either; once warm the pool comes down.
  const Decision second = cold.Step(5);
  EXPECT_LE(second.decode.desired, first.decode.desired);
  // A handful of requests is not a sample at all: nothing moves.
  Loop trickle(Options(), 2, 2);
  const Decision d = trickle.Step(0.2, 1500, 400, /*ttft=*/30.0);
  EXPECT_EQ(d.forecast_samples, 0);
  EXPECT_EQ(d.prefill.desired, 2);
  EXPECT_EQ(d.decode.desired, 2);
  EXPECT_EQ(d.prefill.correction, 1);  // a cold 30 s TTFT corrects nothing
}

TEST(PlannerTest, LargeGapMovesManyReplicasAtOnce) {
  Loop loop;
  for (int i = 0; i < 5; ++i) loop.Step(2);
  const int before = loop.decode();
  const Decision d = loop.Step(30);
  EXPECT_GE(d.decode.desired - before, 5);
  EXPECT_GE(d.prefill.desired - 1, 3);
  EXPECT_THAT(d.decode.reasons.back(), HasSubstr("scale up"));
}

TEST(PlannerTest, HysteresisAndStabilizationDelayScaleDown) {
  Loop loop;
  for (int i = 0; i < 6; ++i) loop.Step(20);
  const int settled = loop.decode();
  // 5 % less load: inside the dead band, nothing moves for ever.
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(loop.Step(19).decode.desired, settled) << i;
  }
  // Half the load: held while the window still remembers 19/s (90 s =
  // three intervals), then down.
  const Decision first = loop.Step(10);
  EXPECT_EQ(first.decode.desired, settled);
  EXPECT_THAT(first.decode.reasons.back(), HasSubstr("hold"));
  EXPECT_EQ(loop.Step(10).decode.desired, settled);
  EXPECT_EQ(loop.Step(10).decode.desired, settled);
  int after = settled;
  for (int i = 0; i < 4 && after == settled; ++i) {
    after = loop.Step(10).decode.desired;
  }
  EXPECT_LT(after, settled);
  // And the pool ends where the need with the margin says, not lower.
  const CapacityProfile p = Profile();
  Decision d;
  for (int i = 0; i < 6; ++i) d = loop.Step(10);
  EXPECT_EQ(d.decode.desired,
            SizeDecode(p, Load(Planned(10) * 1.15, 128, 100), 0.05, 0.99, 200)
                .replicas);
}

TEST(PlannerTest, BudgetClampKeepsBothPoolsAndTheRatio) {
  PlannerOptions o = Options();
  o.budget = 12;  // cores, one per worker in this profile
  Loop loop(o);
  Decision d;
  for (int i = 0; i < 6; ++i) d = loop.Step(30);
  EXPECT_TRUE(d.budget_clamped);
  EXPECT_LE(d.cost, 12);
  EXPECT_EQ(d.prefill.desired + d.decode.desired, 12);
  EXPECT_GE(d.prefill.desired, 1);
  EXPECT_GE(d.decode.desired, 1);
  EXPECT_THAT(d.reasons.back(), HasSubstr("budget 12 cores"));
  // What the pools wanted, in proportion: compare with no budget.
  Loop free_loop;
  Decision want;
  for (int i = 0; i < 6; ++i) want = free_loop.Step(30);
  ASSERT_GT(want.prefill.desired + want.decode.desired, 12);
  const double share = double(want.prefill.desired) /
                       (want.prefill.desired + want.decode.desired);
  EXPECT_NEAR(double(d.prefill.desired) / 12, share, 0.1);
  // Minimums over the budget are refused up front.
  o.min_prefill = 8;
  o.min_decode = 8;
  auto bad = Planner::Create(o, Profile());
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("over the budget"));
}

TEST(PlannerTest, ManualChangeIsHeldNotFought) {
  PlannerOptions o = Options();
  o.manual_hold_s = 300;
  Loop loop(o);
  for (int i = 0; i < 6; ++i) loop.Step(5);
  const int planned = loop.decode();
  // An operator doubles decode (and leaves prefill alone).
  loop.Operator(loop.prefill(), planned + 6);
  const Decision d = loop.Step(5);
  EXPECT_EQ(d.decode.desired, planned + 6);
  EXPECT_TRUE(d.decode.manual_hold);
  EXPECT_FALSE(d.prefill.manual_hold);
  EXPECT_THAT(d.decode.reasons[0], HasSubstr("changed from"));
  // Held for 300 s (ten intervals) although the model wants fewer.
  for (int i = 0; i < 9; ++i) {
    const Decision h = loop.Step(5);
    EXPECT_EQ(h.decode.desired, planned + 6) << i;
    EXPECT_LT(h.decode.need, planned + 6);
  }
  // Then the planner plans from the operator's number, down gradually, to
  // the need with the hysteresis margin (the count a scale-down stops at).
  Decision after;
  for (int i = 0; i < 10; ++i) after = loop.Step(5);
  EXPECT_FALSE(after.decode.manual_hold);
  EXPECT_EQ(after.decode.desired, after.decode.stabilized);
  EXPECT_LE(after.decode.desired, planned + 1);
  EXPECT_GE(after.decode.desired, planned);
}

TEST(PlannerTest, ObservedLatencyAboveTheModelAddsWorkers) {
  Loop plain;
  Loop slow;
  Decision a, b;
  for (int i = 0; i < 8; ++i) {
    a = plain.Step(10);
    // The cluster answers 2.5x slower than the profile predicts (a slower
    // machine than profiled).
    const double model =
        PredictTtft(Profile(), Load(10, 128, 100), slow.prefill(), 0.99);
    b = slow.Step(10, 128, 100, 2.5 * model);
  }
  EXPECT_GT(b.prefill.correction, 2.0);
  EXPECT_GT(b.prefill.desired, a.prefill.desired);
  EXPECT_THAT(b.prefill.reasons[0], HasSubstr("latency correction"));
}

// A live cluster's quantile comes from histogram buckets (pdserve's ITL
// buckets are a factor 2 apart): what was interpolated inside a bucket is
// not evidence against a prediction inside the same bucket.
TEST(PlannerTest, AHistogramQuantileCorrectsOnlyBeyondItsBucket) {
  // Each interval observes `factor` x the model's TTFT at the pool's
  // size, in the bucket [lower, upper] x the model's.
  auto correction = [](double factor, double lower, double upper) {
    Loop loop;
    Decision d;
    for (int i = 0; i < 12; ++i) {
      const double model =
          PredictTtft(Profile(), Load(10, 128, 100), loop.prefill(), 0.99);
      d = loop.Step(10, 128, 100, factor * model, 0,
                    Observation::Bucket{lower * model, upper * model});
    }
    return d.prefill.correction;
  };
  // Interpolated at 1.9x the model, but the bucket [0.6x, 2.4x] holds the
  // model's value: no correction.
  EXPECT_DOUBLE_EQ(correction(1.9, 0.6, 2.4), 1);
  // The bucket [2x, 4x] lies wholly above: at least 2x slower, and that is
  // all the observation says (interpolated, 3x); smoothed toward 2.
  const double above = correction(3, 2, 4);
  EXPECT_GT(above, 1.8);
  EXPECT_LE(above, 2);
}

// A p99 from a few dozen samples is little more than their slowest one:
// the correction learns only from intervals with at least two samples
// expected above the quantile (200 for a p99).
TEST(PlannerTest, AQuantileOfTooFewSamplesDoesNotCorrect) {
  auto correction = [](double rate) {
    Loop loop;
    Decision d;
    for (int i = 0; i < 8; ++i) {
      const double model =
          PredictTtft(Profile(), Load(rate, 128, 100), loop.prefill(), 0.99);
      d = loop.Step(rate, 128, 100, 2.5 * model);
    }
    return d.prefill.correction;
  };
  EXPECT_EQ(correction(3), 1);    // 90 requests an interval: p99 = the max
  EXPECT_EQ(correction(6.5), 1);  // 195
  EXPECT_GT(correction(7), 2);    // 210
}

// Decode corrects from the mean inter-token gap: the p99 of gaps is set by
// rare slow ones (each stream's first, after its hand-off from prefill)
// that the profile's step times leave out and more workers do not shorten.
TEST(PlannerTest, DecodeCorrectsFromTheMeanGapNotItsTail) {
  auto run = [](double mean_factor, double p99_factor) {
    Loop loop;
    Decision d;
    for (int i = 0; i < 16; ++i) {
      const LoadEstimate load = Load(10, 128, 100);
      loop.itl_mean =
          mean_factor * PredictMeanItl(Profile(), load, loop.decode());
      loop.itl_p99 =
          p99_factor * PredictItl(Profile(), load, loop.decode(), 0.99);
      d = loop.Step(10);
    }
    return d;
  };
  const Decision plain = run(1, 1);
  EXPECT_EQ(plain.decode.correction, 1);
  // Hand-off gaps put the p99 at 3x the model's; the mean is the model's.
  const Decision tail = run(1, 3);
  EXPECT_EQ(tail.decode.correction, 1);
  EXPECT_EQ(tail.decode.desired, plain.decode.desired);
  // Steps 2x slower than profiled: the mean shows it.
  const Decision slow = run(2, 2);
  EXPECT_GT(slow.decode.correction, 1.8);
  EXPECT_GT(slow.decode.desired, plain.decode.desired);
  EXPECT_THAT(slow.decode.reasons[0], HasSubstr("latency correction"));
}

// A retry (a worker failed, or a drained one handed its queue back) makes
// TTFT measure the failure, not the profile.
TEST(PlannerTest, IntervalsWithRetriesDoNotCorrectTheProfile) {
  auto correction = [](double retries) {
    Loop loop;
    loop.retries = retries;
    Decision d;
    for (int i = 0; i < 8; ++i) {
      const double model =
          PredictTtft(Profile(), Load(10, 128, 100), loop.prefill(), 0.99);
      d = loop.Step(10, 128, 100, 2.5 * model);
    }
    return d.prefill.correction;
  };
  EXPECT_GT(correction(0), 2);
  EXPECT_EQ(correction(3), 1);
}

TEST(PlannerTest, LatencyOfABacklogIsNotTakenForASlowProfile) {
  Loop loop;
  for (int i = 0; i < 5; ++i) loop.Step(10);
  const int before = loop.prefill();
  // A burst left 200 prompts queued: TTFT is 10x the model's, but that is
  // the queue (planned for through the queue depth), not the profile.
  const double model =
      PredictTtft(Profile(), Load(10, 128, 100), loop.prefill(), 0.99);
  const Decision d = loop.Step(10, 128, 100, 10 * model, 200);
  EXPECT_EQ(d.prefill.correction, 1);
  // The backlog itself adds workers: 200 prompts to clear in 30 s.
  EXPECT_GT(d.prefill.desired, before + 1);
  // The same latency without a backlog is a slow profile.
  Loop steady;
  for (int i = 0; i < 5; ++i) steady.Step(10);
  // (the ratio is clamped at 3, half of it taken at once).
  EXPECT_DOUBLE_EQ(steady.Step(10, 128, 100, 10 * model).prefill.correction, 2);
}

TEST(PlannerTest, DecisionCarriesItsInputsAsJsonAndGauges) {
  Loop loop;
  Decision d;
  for (int i = 0; i < 4; ++i) d = loop.Step(10, 300, 80, 0.5);
  const nlohmann::json j = nlohmann::json::parse(d.ToJson());
  EXPECT_DOUBLE_EQ(j["observed"]["request_rate"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(j["observed"]["ttft_s"].get<double>(), 0.5);
  EXPECT_GT(j["forecast"]["prompt_tokens"]["p50"].get<double>(), 200);
  EXPECT_EQ(j["prefill"]["desired"].get<int>(), d.prefill.desired);
  EXPECT_FALSE(j["decode"]["reasons"].empty());
  bool found = false;
  for (const Decision::Gauge& g : d.Gauges()) {
    if (g.name == "pdserve_planner_desired_replicas" &&
        g.labels == decltype(g.labels){{"pool", "decode"}}) {
      found = true;
      EXPECT_EQ(g.value, d.decode.desired);
    }
  }
  EXPECT_TRUE(found);
}

TEST(PlannerTest, GarbageObservationsAreIgnoredNotTrusted) {
  Loop loop(Options(), 3, 3);
  for (int i = 0; i < 5; ++i) loop.Step(5);
  const int prefill = loop.prefill(), decode = loop.decode();
  Observation o;
  o.time_s = 1000;
  o.load.duration_s = 30;
  o.load.requests = -50;  // a counter reset read as an increase
  o.ttft_s = std::nan("");
  o.ttft_samples = 1000;
  o.itl_s = -1;
  o.prefill = {prefill, prefill, std::numeric_limits<double>::infinity(), 0};
  o.decode = {decode, decode, 0, std::nan("")};
  auto planner = Planner::Create(Options(), Profile());
  ASSERT_TRUE(planner.ok());
  const Decision d = (*planner)->Decide(o);
  EXPECT_EQ(d.observed_rate, 0);
  EXPECT_FALSE(d.observed_ttft_s.has_value());
  EXPECT_FALSE(d.observed_itl_s.has_value());
  EXPECT_EQ(d.prefill.correction, 1);
  EXPECT_LE(d.prefill.desired, prefill);  // no backlog of infinity
  EXPECT_THAT(d.reasons[0], HasSubstr("ignored requests = -50"));
  EXPECT_NO_THROW(nlohmann::json::parse(d.ToJson()));
}

TEST(PlannerTest, BadOptionsAreRefused) {
  PlannerOptions o = Options();
  o.min_decode = 5;
  o.max_decode = 2;
  EXPECT_FALSE(Planner::Create(o, Profile()).ok());
  o = Options();
  o.ttft_target_s = 0;
  EXPECT_FALSE(Planner::Create(o, Profile()).ok());
  o = Options();
  o.quantile = 1;
  EXPECT_FALSE(Planner::Create(o, Profile()).ok());
}

}  // namespace
}  // namespace pdserve::planner
