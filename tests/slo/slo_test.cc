// Latency SLO tests: the cluster under a steady Poisson load keeps its
// latencies within fixed multiples of baselines measured in the same run,
// so the thresholds hold on any CPU this project runs on (Intel and AMD, one
// twice as fast as the other in either phase) and still catch a scheduling
// regression.
//
// The cluster: 1 prefill + 1 decode worker, one thread each, on the default
// model, so that costs are a real model's. Two baselines, before the load
// and again after it: one request at a time (its TTFT), and kBatch streams
// at once, closed loop (their TPOT and the requests per second the cluster
// sustains that way). The load: Poisson arrivals at the smaller of
// kPrefillLoad of the prefill worker's capacity (one prompt per lone TTFT)
// and kDecodeLoad of the rate sustained at kBatch streams, which is about
// the concurrency such a load produces (1.6-2.4 streams decoding on
// average, 5 at most, measured). The SLOs:
//   p99 TTFT under load <= kTtftFactor x one request's TTFT alone;
//   p99 TPOT under load <= kTpotFactor x TPOT at kBatch streams;
//   the longest gap between two tokens of any stream <= kStallFactor x TPOT
//     at kBatch streams;
//   no request fails, every one gets every token.
// Why kBatch streams and not one: how much batching buys decode depends on
// the CPU. On AMD Zen 4 one stream decodes about twice as fast as on the
// Intel machine the test was first tuned on, while three streams gain
// little over one, so a load sized from one stream's TPOT kept two or three
// streams in flight and its p99 TPOT reached 3-3.9x the lone request's
// (issue 15: 3 failures in 9 runs against a 3.5x limit). Against TPOT at
// the load's own concurrency the factor can be tight.
// Measured on AMD EPYC (Zen 4), 16 healthy runs: p99 TTFT 2.2-3.4x the lone
// request's, p99 TPOT 1.12-1.52x the kBatch-stream TPOT, longest gap 2.1-3.4x,
// at rates 0.95-1.42/s (decode-bound). With the engine's runner lock unfair
// again (an Admit waiting behind step after step, the regression fixed when
// these tests were written) p99 TTFT was 5.8-14x and the longest gap
// 975-1070 ms (about 70x), and the test failed 3 runs of 3.
//
// To see the check fail on a setting, give the cluster one through the
// environment (comma-separated flags), e.g.
//   bazel test //tests/slo:slo_test --test_env=PDSERVE_DEFAULT_MODEL
//     --test_env=PDSERVE_SLO_ROUTER_ARGS=--max_inflight=1
// (PDSERVE_SLO_PREFILL_ARGS and PDSERVE_SLO_DECODE_ARGS likewise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/local_cluster.h"
#include "loadgen/metrics.h"
#include "loadgen/runner.h"
#include "loadgen/target.h"
#include "loadgen/workload.h"
#include "model/default_model.h"
#include "tests/cluster_testing.h"

namespace pdserve {
namespace {

using loadgen::BenchRequest;
using loadgen::LoadSummary;

// Under the sanitizers (ASan + UBSan slow the router, gRPC and the load
// generator far more than the model's kernels, built -O2 either way) the
// TTFT, TPOT and after-load factors cannot tell the runner lock regression
// from noise: with it, two sanitizer runs had p99 TTFT 4.4x and 2.5x the
// lone TTFT and p99 TPOT 1.35x and 1.14x the 3-stream TPOT; two healthy
// ones 2.8-3.2x and 1.14-1.2x. Those are measured and printed there but held
// only without sanitizers. The stall check still tells them apart (longest gap
// 47x and 66x the 3-stream TPOT with the regression, 1.8-2.5x healthy), so it
// is held everywhere, at twice the factor under the sanitizers.
#ifdef __SANITIZE_ADDRESS__
constexpr bool kHoldLatencies = false;
constexpr double kSanitizerSlack = 2.0;
#else
constexpr bool kHoldLatencies = true;
constexpr double kSanitizerSlack = 1.0;
#endif
constexpr double kTtftFactor = 6.0;
constexpr double kTpotFactor = 2.0;
// The longest gap between two tokens of any stream, against the batched
// TPOT: healthy runs on AMD Zen 4 showed 26-41 ms (2.1-3.4x); with the
// runner lock unfair again 455-734 ms (35-65x), while their p99 TTFT, at
// 5.8-14x, did not always pass the TTFT factor.
constexpr double kStallFactor = 10.0 * kSanitizerSlack;
constexpr double kPrefillLoad = 0.25;
// Of the requests per second the cluster sustains at kBatch streams, closed
// loop: an open-loop load near that would queue, and TPOT would grow with the
// queue rather than with any scheduling fault.
constexpr double kDecodeLoad = 0.6;
// The lone request after the load may be at most this much slower than
// before it.
constexpr double kAfterLoadFactor = 2.5;
// Streams of the batched baseline: about the peak a load at kDecodeLoad
// keeps decoding on average and then some (see the top of the file).
constexpr int kBatch = 3;
constexpr int kPromptTokens = 128;
constexpr int kOutputTokens = 96;
// About 24 s of load at the chosen rate, at least 12 requests.
constexpr double kLoadSeconds = 24;

struct Baseline {
  double ttft_ms = 0, tpot_ms = 0;
  // Completed requests per second (closed loop).
  double requests_per_s = 0;
};

// How many requests were decoding at once during a load (first token to
// last): the time-weighted mean over the load's span and the peak.
struct Concurrency {
  double mean = 0;
  int peak = 0;
};

Concurrency DecodeConcurrency(
    const std::vector<loadgen::RequestRecord>& records) {
  std::vector<std::pair<absl::Duration, int>> edges;
  for (const loadgen::RequestRecord& r : records) {
    if (!r.ok()) continue;
    edges.push_back({r.sent_at + r.ttft, +1});
    edges.push_back({r.sent_at + r.e2e, -1});
  }
  std::sort(edges.begin(), edges.end());
  Concurrency c;
  if (edges.empty()) return c;
  int now = 0;
  double weighted = 0;
  for (size_t i = 0; i + 1 < edges.size(); ++i) {
    now += edges[i].second;
    c.peak = std::max(c.peak, now);
    weighted +=
        now * absl::ToDoubleSeconds(edges[i + 1].first - edges[i].first);
  }
  c.mean = weighted /
           absl::ToDoubleSeconds(edges.back().first - edges.front().first);
  return c;
}

struct SloRun {
  // One request alone, measured before the load (which sets the rate) and
  // again after it; the SLOs hold the load to the slower of the two, so that
  // a quiet spell of the shared machine during one baseline does not count
  // as the cluster's fault.
  Baseline before, after, alone;
  // kBatch streams at once, before and after the load; the SLO holds TPOT
  // to the slower of the two.
  Baseline batched_before, batched_after;
  double batched_tpot_ms = 0;
  double rate = 0;
  LoadSummary loaded;
  std::vector<loadgen::RequestRecord> records;
  // Each broken SLO, with the figures: failures and stalls, and the TTFT,
  // TPOT and after-load factors (held only where kHoldLatencies).
  std::vector<std::string> violations;
  std::vector<std::string> latency_violations;
};

loadgen::WorkloadOptions Workload(int n, uint64_t seed) {
  loadgen::WorkloadOptions w;
  w.kind = loadgen::WorkloadKind::kFixed;
  w.num_requests = n;
  w.prompt_tokens = kPromptTokens;
  w.output_tokens = kOutputTokens;
  w.vocab_size = 49152;  // the default model's
  w.seed = seed;
  return w;
}

class SloTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::DefaultModelPathOrEmpty().empty()) {
      GTEST_SKIP() << model::kNoDefaultModel;
    }
  }

  // Extra flags for one kind of process from the environment (a deliberately
  // bad setting, to watch the check fail).
  static std::vector<std::string> FlagsFromEnv(const char* name) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return {};
    return absl::StrSplit(value, ',');
  }

  void StartCluster(const std::string& name) {
    cli::LocalClusterOptions options;
    options.bin_dir = testing::BinDir();
    options.work_dir = testing::MakeWorkDir(name);
    options.model_path = testing::DefaultModelPathOrEmpty();
    options.worker_args = {"--threads=1", "--kv_cache_mb=64"};
    options.process_args["prefill-0"] =
        FlagsFromEnv("PDSERVE_SLO_PREFILL_ARGS");
    options.process_args["decode-0"] = FlagsFromEnv("PDSERVE_SLO_DECODE_ARGS");
    options.router_args = FlagsFromEnv("PDSERVE_SLO_ROUTER_ARGS");
    options.startup_timeout = absl::Seconds(60);
    auto cluster = cli::LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    auto target = loadgen::MakeTarget(
        {.url = absl::StrCat("grpc://", cluster_->router_address()),
         .model = "",
         .temperature = 0});
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = std::move(*target);
  }

  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop(absl::Seconds(20)).ok());
    }
  }

  // Closed-loop requests, `concurrency` at a time, after one warm-up
  // request alone: medians of TTFT and TPOT, and the requests per second
  // the cluster sustained. Each baseline takes prompts of its own seed:
  // prompts seen before would hit the prefix cache and time a prefill that
  // never ran.
  Baseline MeasureAt(int concurrency, int n, uint64_t seed) {
    auto requests = loadgen::MakeWorkload(Workload(n + 1, seed));
    const loadgen::RequestRecord warm_up =
        target_->Send(requests->front(), absl::Now(), absl::Minutes(1));
    EXPECT_TRUE(warm_up.ok()) << warm_up.error_kind << ": " << warm_up.error;
    requests->erase(requests->begin());
    loadgen::LoadOptions options;
    options.max_concurrency = concurrency;
    options.request_timeout = absl::Minutes(1);
    const loadgen::LoadResult result =
        loadgen::RunLoad(*target_, *requests, options);
    std::vector<double> ttft, tpot;
    for (const loadgen::RequestRecord& rec : result.records) {
      EXPECT_TRUE(rec.ok()) << rec.error_kind << ": " << rec.error;
      if (!rec.ok()) continue;
      ttft.push_back(absl::ToDoubleMilliseconds(rec.ttft));
      tpot.push_back(absl::ToDoubleMilliseconds(rec.tpot()));
    }
    if (ttft.size() != result.records.size()) return {};
    return {loadgen::Percentile(ttft, 0.5), loadgen::Percentile(tpot, 0.5),
            ttft.size() / absl::ToDoubleSeconds(result.duration)};
  }

  // Poisson arrivals at a fraction of the capacity of the busier pool, as
  // measured (see the top of the file), for about kLoadSeconds.
  SloRun RunSteadyLoad() {
    SloRun run;
    run.before = MeasureAt(1, 5, /*seed=*/99);
    run.batched_before = MeasureAt(kBatch, 3 * kBatch, /*seed=*/97);
    if (!(run.before.ttft_ms > 0 && run.before.tpot_ms > 0 &&
          run.batched_before.tpot_ms > 0)) {
      // No baseline (requests failed): nothing to hold the load to.
      run.violations.push_back("no baseline: the requests alone failed");
      return run;
    }
    const double prefill_capacity = 1000.0 / run.before.ttft_ms;
    const double decode_capacity = run.batched_before.requests_per_s;
    run.rate = std::min(kPrefillLoad * prefill_capacity,
                        kDecodeLoad * decode_capacity);
    const int n = std::max(12, static_cast<int>(run.rate * kLoadSeconds));
    auto requests = loadgen::MakeWorkload(Workload(n, 7));
    loadgen::LoadOptions options;
    options.request_rate = run.rate;
    options.seed = 7;
    options.request_timeout = absl::Minutes(2);
    const loadgen::LoadResult result =
        loadgen::RunLoad(*target_, *requests, options);
    run.loaded = loadgen::Summarize(result, {}, run.rate, 0);
    run.records = result.records;
    run.after = MeasureAt(1, 5, /*seed=*/98);
    run.batched_after = MeasureAt(kBatch, 3 * kBatch, /*seed=*/96);
    run.alone = {std::max(run.before.ttft_ms, run.after.ttft_ms),
                 std::max(run.before.tpot_ms, run.after.tpot_ms)};
    run.batched_tpot_ms =
        std::max(run.batched_before.tpot_ms, run.batched_after.tpot_ms);
    const double ttft_limit = kTtftFactor * run.alone.ttft_ms;
    const double tpot_limit = kTpotFactor * run.batched_tpot_ms;
    // Taking the slower baseline must not hide a cluster that stayed slow
    // after the load (a leak, a stuck thread). The two baselines differed
    // by up to 1.5x either way in hand runs (the machine's noise).
    if (run.after.ttft_ms > kAfterLoadFactor * run.before.ttft_ms ||
        run.after.tpot_ms > kAfterLoadFactor * run.before.tpot_ms) {
      run.latency_violations.push_back(absl::StrFormat(
          "slower after the load than before it: TTFT %.1f ms after, %.1f "
          "before; TPOT %.2f ms after, %.2f before",
          run.after.ttft_ms, run.before.ttft_ms, run.after.tpot_ms,
          run.before.tpot_ms));
    }
    if (run.loaded.failed > 0) {
      run.violations.push_back(
          absl::StrCat(run.loaded.failed, " requests failed"));
    }
    if (run.loaded.ttft_ms.p99 > ttft_limit) {
      run.latency_violations.push_back(absl::StrFormat(
          "p99 TTFT %.1f ms > %.1f x %.1f ms alone", run.loaded.ttft_ms.p99,
          kTtftFactor, run.alone.ttft_ms));
    }
    if (run.loaded.tpot_ms.p99 > tpot_limit) {
      run.latency_violations.push_back(absl::StrFormat(
          "p99 TPOT %.2f ms > %.1f x %.2f ms at %d streams",
          run.loaded.tpot_ms.p99, kTpotFactor, run.batched_tpot_ms, kBatch));
    }
    if (run.loaded.itl_ms.max > kStallFactor * run.batched_tpot_ms) {
      run.violations.push_back(absl::StrFormat(
          "a stream stalled: longest gap between tokens %.1f ms > %.0f x "
          "%.2f ms at %d streams",
          run.loaded.itl_ms.max, kStallFactor, run.batched_tpot_ms, kBatch));
    }
    const Concurrency decoding = DecodeConcurrency(run.records);
    // For the test log: what was measured against what.
    absl::PrintF(
        "SLO-RUN|alone TTFT %.1f ms TPOT %.2f ms (before the load %.1f, "
        "%.2f; after %.1f, %.2f)|%d streams TPOT %.2f ms, %.2f req/s (before "
        "%.2f ms %.2f/s, after %.2f ms %.2f/s)|rate %.2f/s (%s-bound), %d "
        "requests, decoding %.2f streams on average, %d at most|p99 TTFT "
        "%.1f ms (limit %.0f) p99 TPOT %.2f ms (limit %.2f) max ITL %.1f ms "
        "(limit %.0f)|%s%s\n",
        run.alone.ttft_ms, run.alone.tpot_ms, run.before.ttft_ms,
        run.before.tpot_ms, run.after.ttft_ms, run.after.tpot_ms, kBatch,
        run.batched_tpot_ms, decode_capacity, run.batched_before.tpot_ms,
        run.batched_before.requests_per_s, run.batched_after.tpot_ms,
        run.batched_after.requests_per_s, run.rate,
        run.rate < kPrefillLoad * prefill_capacity ? "decode" : "prefill",
        run.loaded.sent, decoding.mean, decoding.peak, run.loaded.ttft_ms.p99,
        ttft_limit, run.loaded.tpot_ms.p99, tpot_limit, run.loaded.itl_ms.max,
        kStallFactor * run.batched_tpot_ms,
        run.violations.empty() && run.latency_violations.empty() ? "met"
                                                                 : "VIOLATED",
        kHoldLatencies ? "" : " (latencies not held under sanitizers)");
    absl::PrintF("%s", loadgen::FormatSummary(run.loaded));
    return run;
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
  std::unique_ptr<loadgen::Target> target_;
};

TEST_F(SloTest, SteadyLoadMeetsTheLatencySlos) {
  StartCluster("slo");
  const SloRun run = RunSteadyLoad();
  EXPECT_TRUE(run.violations.empty())
      << "SLOs broken: " << absl::StrJoin(run.violations, "; ");
  if (kHoldLatencies) {
    EXPECT_TRUE(run.latency_violations.empty())
        << "latency SLOs broken: "
        << absl::StrJoin(run.latency_violations, "; ");
  } else if (!run.latency_violations.empty()) {
    absl::PrintF("SLO-NOT-HELD|under sanitizers: %s\n",
                 absl::StrJoin(run.latency_violations, "; "));
  }
  EXPECT_EQ(run.loaded.completed, run.loaded.sent);
  // The router's breakdown says where each TTFT went: queues (router and
  // prefill worker), prefill compute, the KV transfer after it. Together
  // they fit in the TTFT the client saw and explain most of it.
  std::vector<double> unexplained;
  for (const loadgen::RequestRecord& r : run.records) {
    const double ttft = absl::ToDoubleMilliseconds(r.ttft);
    const double parts =
        r.server_queue_ms + r.server_prefill_ms + r.server_transfer_tail_ms;
    EXPECT_GT(r.server_prefill_ms, 0);
    EXPECT_LE(parts, ttft + 1) << "request " << r.index;
    unexplained.push_back(ttft - parts);
  }
  EXPECT_LT(loadgen::Percentile(unexplained, 0.5),
            0.5 * run.loaded.ttft_ms.p50);
  // The load was real: requests ran while others did (else the test proves
  // nothing about scheduling). Counted from the records, not from the mean
  // number in flight, which falls as the cluster gets better at overlapping
  // (11 of 12 overlapped in hand runs). Poisson arrivals at `rate` overlap a
  // request lasting e2e with probability 1 - exp(-2 rate e2e): about 0.9
  // here, but 0.6 where prefill is twice as slow and decode twice as fast,
  // so the bound is a share of what this run's rate and lone latency make
  // likely, not a fixed half.
  const double lone_e2e_s =
      (run.alone.ttft_ms + kOutputTokens * run.alone.tpot_ms) / 1000.0;
  const double likely_overlap = 1.0 - std::exp(-2.0 * run.rate * lone_e2e_s);
  int overlapped = 0;
  for (const loadgen::RequestRecord& a : run.records) {
    for (const loadgen::RequestRecord& b : run.records) {
      if (&a != &b && a.sent_at < b.sent_at + b.e2e &&
          b.sent_at < a.sent_at + a.e2e) {
        ++overlapped;
        break;
      }
    }
  }
  absl::PrintF(
      "SLO-OVERLAP|%d of %d requests overlapped another (%.2f likely)\n",
      overlapped, run.records.size(), likely_overlap);
  EXPECT_GE(overlapped, 0.6 * likely_overlap * run.records.size())
      << "only " << overlapped << " of " << run.records.size()
      << " requests overlapped another, where " << likely_overlap
      << " of them would be likely";
}

// The load generator's targets against the real router: gRPC and OpenAI
// HTTP both see every token asked for, with TTFT before the end; a target
// that is not there fails clearly.
TEST_F(SloTest, BothTargetsTimeEveryTokenOfTheRealRouter) {
  StartCluster("slo-targets");
  auto requests = loadgen::MakeWorkload(Workload(4, 3));
  for (const std::string& url :
       {absl::StrCat("grpc://", cluster_->router_address()),
        cluster_->http_url()}) {
    auto target =
        loadgen::MakeTarget({.url = url, .model = "", .temperature = 0});
    ASSERT_TRUE(target.ok()) << target.status();
    loadgen::LoadOptions options;
    options.max_concurrency = 2;
    const loadgen::LoadResult result =
        loadgen::RunLoad(**target, *requests, options);
    for (const loadgen::RequestRecord& r : result.records) {
      ASSERT_TRUE(r.ok()) << url << ": " << r.error_kind << ": " << r.error;
      EXPECT_EQ(r.output_tokens, kOutputTokens) << url;
      EXPECT_EQ(r.prompt_tokens, kPromptTokens);
      EXPECT_GT(r.ttft, absl::ZeroDuration());
      EXPECT_LT(r.ttft, r.e2e);
      EXPECT_FALSE(r.itl_ms.empty()) << url;
    }
  }
  for (const char* gone : {"grpc://127.0.0.1:1", "http://127.0.0.1:1"}) {
    auto target =
        loadgen::MakeTarget({.url = gone, .model = "", .temperature = 0});
    ASSERT_TRUE(target.ok());
    const loadgen::RequestRecord r =
        (*target)->Send(requests->front(), absl::Now(), absl::Seconds(5));
    EXPECT_FALSE(r.ok()) << gone;
    EXPECT_TRUE(r.error_kind == "UNAVAILABLE" || r.error_kind == "CONNECT")
        << gone << ": " << r.error_kind;
  }
  EXPECT_FALSE(
      loadgen::MakeTarget({.url = "https://x:1", .model = "", .temperature = 0})
          .ok());
  EXPECT_FALSE(loadgen::MakeTarget(
                   {.url = "grpc://nohost", .model = "", .temperature = 0})
                   .ok());
}

}  // namespace
}  // namespace pdserve
