#include "cli/top_view.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/buckets.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"
#include "metrics/text_parse.h"

namespace pdserve::cli {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Optional;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

metrics::MetricOptions Options(std::string name,
                               std::vector<std::string> labels) {
  metrics::MetricOptions o;
  o.name = std::move(name);
  o.help = "Help.";
  o.label_names = std::move(labels);
  return o;
}

// Small bounds for TTFT-like histograms keep the expected quantiles easy to
// compute by hand; ITL-like ones are the contract's.
const std::vector<double> kTtftBounds = {0.01, 0.02, 0.05, 0.1};
std::vector<double> ItlBounds() {
  return *metrics::ExponentialBuckets(0.0005, 2, 14);
}

// The router's families that pdctl top reads, named and labelled as the
// router exports them (issue 17's contract).
struct FakeRouter {
  FakeRouter() {
    in_flight =
        *(*registry.AddGauge(Options("pdserve_requests_in_flight", {"model"})))
             ->WithLabels({"m"});
    metrics::CounterFamily* requests = *registry.AddCounter(
        Options("pdserve_requests_total", {"model", "endpoint", "status"}));
    ok = *requests->WithLabels({"m", "completions", "ok"});
    cancelled = *requests->WithLabels({"m", "generate", "cancelled"});
    generated = *(*registry.AddCounter(
                      Options("pdserve_generation_tokens_total", {"model"})))
                     ->WithLabels({"m"});
    prompt = *(*registry.AddCounter(
                   Options("pdserve_prompt_tokens_total", {"model"})))
                  ->WithLabels({"m"});
    ttft = *(*registry.AddHistogram(
                 Options("pdserve_time_to_first_token_seconds", {"model"}),
                 kTtftBounds))
                ->WithLabels({"m"});
    itl = *(*registry.AddHistogram(
                Options("pdserve_inter_token_latency_seconds", {"model"}),
                ItlBounds()))
               ->WithLabels({"m"});
  }
  metrics::ParsedMetrics Scrape() const {
    return *metrics::ParseText(metrics::RenderText(registry));
  }

  metrics::Registry registry;
  metrics::Gauge* in_flight;
  metrics::Counter* ok;
  metrics::Counter* cancelled;
  metrics::Counter* generated;
  metrics::Counter* prompt;
  metrics::Histogram* ttft;
  metrics::Histogram* itl;
};

// A worker's families that pdctl top reads, as workers export them.
struct FakeWorker {
  FakeWorker(const std::string& role, const std::string& id) {
    const std::vector<absl::string_view> labels = {"m", role, id};
    const std::vector<std::string> names = {"model", "role", "worker_id"};
    running =
        *(*registry.AddGauge(Options("pdserve_worker_requests_running", names)))
             ->WithLabels(labels);
    waiting =
        *(*registry.AddGauge(Options("pdserve_worker_requests_waiting", names)))
             ->WithLabels(labels);
    kv_usage =
        *(*registry.AddGauge(Options("pdserve_kv_cache_usage_ratio", names)))
             ->WithLabels(labels);
    prompt = *(*registry.AddCounter(Options(
                   "pdserve_worker_prompt_tokens_computed_total", names)))
                  ->WithLabels(labels);
    generated = *(*registry.AddCounter(
                      Options("pdserve_worker_generated_tokens_total", names)))
                     ->WithLabels(labels);
    ttft = *(*registry.AddHistogram(
                 Options("pdserve_worker_time_to_first_token_seconds", names),
                 kTtftBounds))
                ->WithLabels(labels);
    itl = *(*registry.AddHistogram(
                Options("pdserve_worker_inter_token_latency_seconds", names),
                ItlBounds()))
               ->WithLabels(labels);
  }
  metrics::ParsedMetrics Scrape() const {
    return *metrics::ParseText(metrics::RenderText(registry));
  }

  metrics::Registry registry;
  metrics::Gauge* running;
  metrics::Gauge* waiting;
  metrics::Gauge* kv_usage;
  metrics::Counter* prompt;
  metrics::Counter* generated;
  metrics::Histogram* ttft;
  metrics::Histogram* itl;
};

void Observe(metrics::Histogram* h, int n, double v) {
  for (int i = 0; i < n; ++i) h->Observe(v);
}

v1::WorkerInfo Worker(const std::string& id, v1::WorkerRole role,
                      v1::WorkerState state, const std::string& metrics) {
  v1::WorkerInfo w;
  w.set_worker_id(id);
  w.set_role(role);
  w.set_state(state);
  w.set_metrics_address(metrics);
  return w;
}

// Two scrapes 10 s apart of a router, a prefill and two decode workers,
// one decode worker scraped once, one unreachable and a colocated worker
// that serves no metrics.
class TopViewTest : public ::testing::Test {
 protected:
  TopViewTest() : scrapes_(absl::Seconds(60)) {
    // Before the window: what must not count.
    router_.ok->Inc(10);
    router_.generated->Inc(100);
    router_.prompt->Inc(1000);
    Observe(router_.ttft, 10, 0.015);
    Observe(router_.itl, 30, 2);
    prefill_.prompt->Inc(500);
    Observe(prefill_.ttft, 50, 0.08);
    decode_.generated->Inc(40);
    Observe(decode_.itl, 40, 0.03);
    scrapes_.router().Add(kT0, router_.Scrape());
    scrapes_.worker("prefill-0").Add(kT0, prefill_.Scrape());
    scrapes_.worker("decode-0").Add(kT0, decode_.Scrape());
    scrapes_.worker("decode-1").Add(kT0, decode_.Scrape());

    // The window.
    router_.in_flight->Set(3);
    router_.ok->Inc(15);
    router_.cancelled->Inc(5);         // 20 requests in 10 s
    router_.generated->Inc(500);       // 50 tokens/s
    router_.prompt->Inc(2000);         // 200 tokens/s
    Observe(router_.ttft, 10, 0.005);  // p50 0.01 (end of le=0.01)
    Observe(router_.ttft, 10, 0.03);   // p99 0.02 + 0.03 * 9.8 / 10
    Observe(router_.itl, 50, 0.0007);  // p50 0.001 (end of le=0.001)
    Observe(router_.itl, 50, 0.003);   // p99 0.002 + 0.002 * 49 / 50
    prefill_.running->Set(1);
    prefill_.waiting->Set(2);
    prefill_.kv_usage->Set(0.125);
    prefill_.prompt->Inc(1200);        // 120 tokens/s
    Observe(prefill_.ttft, 4, 0.015);  // p50 0.015, p99 0.0199
    decode_.running->Set(4);
    decode_.kv_usage->Set(0.5);
    decode_.generated->Inc(300);      // 30 tokens/s
    decode_.prompt->Inc(7777);        // not what a decode row shows
    Observe(decode_.itl, 10, 0.003);  // p50 0.003, p99 0.00398
    const absl::Time t1 = kT0 + absl::Seconds(10);
    scrapes_.router().Add(t1, router_.Scrape());
    scrapes_.worker("prefill-0").Add(t1, prefill_.Scrape());
    scrapes_.worker("decode-0").Add(t1, decode_.Scrape());
    scrapes_.worker("decode-1")
        .Add(t1, absl::UnavailableError(
                     "GET http://127.0.0.1:9/metrics: Connection\nmore"));
    scrapes_.worker("decode-2").Add(t1, decode_.Scrape());

    input_.router_control = "127.0.0.1:50051";
    input_.router_http = "127.0.0.1:8000";
    input_.window = absl::Seconds(60);
    v1::ListWorkersResponse workers;
    *workers.add_workers() = Worker("colocated-0", v1::WORKER_ROLE_BOTH,
                                    v1::WORKER_STATE_SERVING, "");
    *workers.add_workers() = Worker("decode-2", v1::WORKER_ROLE_DECODE,
                                    v1::WORKER_STATE_STARTING, "d2:1");
    *workers.add_workers() = Worker("decode-1", v1::WORKER_ROLE_DECODE,
                                    v1::WORKER_STATE_DRAINING, "d1:1");
    *workers.add_workers() = Worker("decode-0", v1::WORKER_ROLE_DECODE,
                                    v1::WORKER_STATE_SERVING, "d0:1");
    *workers.add_workers() = Worker("prefill-0", v1::WORKER_ROLE_PREFILL,
                                    v1::WORKER_STATE_SERVING, "p0:1");
    input_.workers = workers;
  }

  FakeRouter router_;
  FakeWorker prefill_{"prefill", "prefill-0"};
  FakeWorker decode_{"decode", "decode-0"};
  ClusterScrapes scrapes_;
  TopFrameInput input_;
};

TEST_F(TopViewTest, RouterFiguresComeFromTheWindowsIncrease) {
  const RouterStats r = ComputeRouterStats(scrapes_.router());
  EXPECT_THAT(r.in_flight, Optional(3.0));
  EXPECT_THAT(r.requests_per_s, Optional(DoubleNear(2.0, 1e-12)));
  EXPECT_THAT(r.generated_per_s, Optional(DoubleNear(50.0, 1e-12)));
  EXPECT_THAT(r.prompt_per_s, Optional(DoubleNear(200.0, 1e-12)));
  EXPECT_THAT(r.ttft_p50, Optional(DoubleNear(0.01, 1e-12)));
  EXPECT_THAT(r.ttft_p99, Optional(DoubleNear(0.0494, 1e-12)));
  EXPECT_THAT(r.itl_p50, Optional(DoubleNear(0.001, 1e-12)));
  EXPECT_THAT(r.itl_p99, Optional(DoubleNear(0.00396, 1e-12)));
}

TEST_F(TopViewTest, EachRoleShowsItsOwnTokensAndLatency) {
  const WorkerStats p = ComputeWorkerStats(*scrapes_.FindWorker("prefill-0"),
                                           v1::WORKER_ROLE_PREFILL);
  EXPECT_THAT(p.running, Optional(1.0));
  EXPECT_THAT(p.waiting, Optional(2.0));
  EXPECT_THAT(p.kv_usage, Optional(0.125));
  EXPECT_THAT(p.tokens_per_s, Optional(DoubleNear(120.0, 1e-12)));
  EXPECT_THAT(p.latency_p50, Optional(DoubleNear(0.015, 1e-12)));
  EXPECT_THAT(p.latency_p99, Optional(DoubleNear(0.0199, 1e-12)));

  const WorkerStats d = ComputeWorkerStats(*scrapes_.FindWorker("decode-0"),
                                           v1::WORKER_ROLE_DECODE);
  EXPECT_THAT(d.running, Optional(4.0));
  EXPECT_THAT(d.kv_usage, Optional(0.5));
  EXPECT_THAT(d.tokens_per_s, Optional(DoubleNear(30.0, 1e-12)));
  EXPECT_THAT(d.latency_p50, Optional(DoubleNear(0.003, 1e-12)));
  EXPECT_THAT(d.latency_p99, Optional(DoubleNear(0.00398, 1e-12)));

  // One scrape: gauges, but no rate and no quantile yet.
  const WorkerStats once = ComputeWorkerStats(*scrapes_.FindWorker("decode-2"),
                                              v1::WORKER_ROLE_DECODE);
  EXPECT_THAT(once.running, Optional(4.0));
  EXPECT_EQ(once.tokens_per_s, std::nullopt);
  EXPECT_EQ(once.latency_p50, std::nullopt);
}

TEST_F(TopViewTest, RendersTheFrame) {
  EXPECT_EQ(
      RenderTopFrame(input_, scrapes_),
      R"(pdctl top  router 127.0.0.1:50051  /metrics 127.0.0.1:8000  window 60 s
cluster    in flight 3  requests 2.00/s  tokens 50.0/s generated, 200.0/s prompt  (over 10.0 s)
           TTFT p50 10.0ms p99 49.4ms  ITL p50 1.00ms p99 3.96ms

prefill pool, 1 worker
  WORKER               STATE     RUNNING WAITING  KV USED  PROMPT TOK/S  TTFT P50  TTFT P99
  prefill-0            SERVING         1       2    12.5%         120.0    15.0ms    19.9ms

decode pool, 3 workers
  WORKER               STATE     RUNNING WAITING  KV USED     GEN TOK/S   ITL P50   ITL P99
  decode-0             SERVING         4       0    50.0%          30.0    3.00ms    3.98ms
  decode-1             DRAINING  unreachable: GET http://127.0.0.1:9/metrics: Connection
  decode-2             STARTING        4       0    50.0%             -         -         -

colocated pool, 1 worker
  WORKER               STATE     RUNNING WAITING  KV USED     GEN TOK/S   ITL P50   ITL P99
  colocated-0          SERVING   no metrics address registered
)");
}

TEST_F(TopViewTest, AnUnreachableRouterIsSaidAndTheFrameGoesOn) {
  scrapes_.router().Add(kT0 + absl::Seconds(11),
                        absl::UnavailableError("GET x: Connection"));
  input_.workers = absl::UnavailableError("router 127.0.0.1:50051: down");
  const std::string frame = RenderTopFrame(input_, scrapes_);
  EXPECT_THAT(frame, HasSubstr("cluster    router /metrics unreachable: GET "
                               "x: Connection\n"));
  EXPECT_THAT(frame, HasSubstr("workers: router admin API unreachable: "
                               "router 127.0.0.1:50051: down\n"));
  // The next success shows figures again.
  scrapes_.router().Add(kT0 + absl::Seconds(12), router_.Scrape());
  EXPECT_THAT(RenderTopFrame(input_, scrapes_),
              HasSubstr("cluster    in flight 3"));
  input_.workers = v1::ListWorkersResponse();
  EXPECT_THAT(RenderTopFrame(input_, scrapes_),
              HasSubstr("(no workers registered)"));
}

TEST(ScrapeHistoryTest, KeepsTheLastWindowAndComparesItsEnds) {
  metrics::Registry registry;
  metrics::Counter* tokens =
      *(*registry.AddCounter(Options("pdserve_tokens_total", {})))
           ->WithLabels({});
  ScrapeHistory history(absl::Seconds(60));
  auto scrape = [&] {
    return *metrics::ParseText(metrics::RenderText(registry));
  };
  EXPECT_EQ(history.newest(), nullptr);
  EXPECT_EQ(history.Rate("pdserve_tokens_total"), std::nullopt);
  history.Add(kT0, scrape());
  EXPECT_EQ(history.Rate("pdserve_tokens_total"), std::nullopt);
  tokens->Inc(6000);  // 6000 tokens in the first 30 s
  history.Add(kT0 + absl::Seconds(30), scrape());
  EXPECT_THAT(history.Rate("pdserve_tokens_total"), Optional(200.0));
  tokens->Inc(60);  // 60 in the next 31 s
  history.Add(kT0 + absl::Seconds(61), scrape());
  // The scrape of kT0 is more than 60 s old: the window starts at +30 s.
  EXPECT_EQ(history.size(), 2);
  EXPECT_EQ(history.oldest()->time, kT0 + absl::Seconds(30));
  EXPECT_EQ(history.span(), absl::Seconds(31));
  EXPECT_THAT(history.Rate("pdserve_tokens_total"),
              Optional(DoubleNear(60.0 / 31, 1e-12)));
  // A failure keeps the window, reported until the next success.
  history.Add(kT0 + absl::Seconds(62), absl::UnavailableError("down"));
  EXPECT_EQ(history.size(), 2);
  EXPECT_EQ(history.last_error().code(), absl::StatusCode::kUnavailable);
  history.Add(kT0 + absl::Seconds(63), scrape());
  EXPECT_TRUE(history.last_error().ok());
  EXPECT_EQ(history.size(), 3);
}

TEST(ClusterScrapesTest, ForgetsWorkersThatLeft) {
  ClusterScrapes scrapes(absl::Seconds(60));
  scrapes.worker("a").Add(kT0, metrics::ParsedMetrics());
  scrapes.worker("b").Add(kT0, metrics::ParsedMetrics());
  scrapes.Retain({"b"});
  EXPECT_EQ(scrapes.FindWorker("a"), nullptr);
  EXPECT_NE(scrapes.FindWorker("b"), nullptr);
}

TEST(FrameForOutputTest, PlainFramesAreSeparatedByABlankLine) {
  EXPECT_EQ(FrameForOutput("a\nb\n", false, 0), "a\nb\n");
  EXPECT_EQ(FrameForOutput("a\nb\n", false, 1), "\na\nb\n");
}

TEST(FrameForOutputTest, TerminalFramesReplaceThePreviousInPlace) {
  EXPECT_EQ(FrameForOutput("a\nb\n", true, 0),
            "\x1b[2J\x1b[Ha\x1b[K\nb\x1b[K\n\x1b[J");
  EXPECT_EQ(FrameForOutput("a\n\nb\n", true, 3),
            "\x1b[Ha\x1b[K\n\x1b[K\nb\x1b[K\n\x1b[J");
}

TEST(FormatLatencyTest, Units) {
  EXPECT_EQ(FormatLatency(0.00052), "0.52ms");
  EXPECT_EQ(FormatLatency(0.0412), "41.2ms");
  EXPECT_EQ(FormatLatency(1.25), "1.25s");
  EXPECT_EQ(FormatLatency(std::nullopt), "-");
  EXPECT_EQ(FormatLatency(std::numeric_limits<double>::infinity()), "-");
}

}  // namespace
}  // namespace pdserve::cli
