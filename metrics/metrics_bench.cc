// metrics_bench: what recording a metric costs on the request and decode
// paths, alone and with threads sharing one series (cache-line contention,
// the worst case: every decode thread observing the same histogram).
//
//   bazel run --config=opt //metrics:metrics_bench --
//       [--benchmark_out=metrics.json --benchmark_out_format=json]
//
// Compare the figures with a decode step (milliseconds): recording a dozen
// metrics per step should stay far below 1% of it.
#include <vector>

#include "benchmark/benchmark.h"
#include "metrics/buckets.h"
#include "metrics/registry.h"

namespace pdserve::metrics {
namespace {

MetricOptions Options(const char* name) {
  MetricOptions o;
  o.name = name;
  o.help = "benchmark";
  o.label_names = {"model"};
  return o;
}

// One registry for the whole run, so that threads of one benchmark share
// the same series.
Registry& SharedRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

Counter* SharedCounter() {
  static Counter* c =
      *(*SharedRegistry().AddCounter(Options("pdserve_bench_tokens_total")))
           ->WithLabels({"m"});
  return c;
}

Gauge* SharedGauge() {
  static Gauge* g =
      *(*SharedRegistry().AddGauge(Options("pdserve_bench_running")))
           ->WithLabels({"m"});
  return g;
}

// Inter-token latency buckets from 0.5 ms, as issue 17 asks.
Histogram* SharedHistogram() {
  static Histogram* h =
      *(*SharedRegistry().AddHistogram(
            Options("pdserve_bench_inter_token_latency_seconds"),
            *ExponentialBuckets(0.0005, 2, 14)))
           ->WithLabels({"m"});
  return h;
}

void BM_CounterInc(benchmark::State& state) {
  Counter* c = SharedCounter();
  for (auto _ : state) c->Inc();
}
BENCHMARK(BM_CounterInc)->ThreadRange(1, 4)->UseRealTime();

void BM_CounterAddSeconds(benchmark::State& state) {
  Counter* c = SharedCounter();
  for (auto _ : state) c->Add(0.001);
}
BENCHMARK(BM_CounterAddSeconds)->ThreadRange(1, 4)->UseRealTime();

void BM_GaugeSet(benchmark::State& state) {
  Gauge* g = SharedGauge();
  double v = 0;
  for (auto _ : state) g->Set(v += 1);
}
BENCHMARK(BM_GaugeSet)->ThreadRange(1, 4)->UseRealTime();

void BM_GaugeIncDec(benchmark::State& state) {
  Gauge* g = SharedGauge();
  for (auto _ : state) {
    g->Inc();
    g->Dec();
  }
}
BENCHMARK(BM_GaugeIncDec)->ThreadRange(1, 4)->UseRealTime();

void BM_HistogramObserve(benchmark::State& state) {
  Histogram* h = SharedHistogram();
  // Latencies spread over the buckets, so the search is not always short.
  std::vector<double> values;
  for (int i = 0; i < 64; ++i) values.push_back(0.0002 * (i * i + 1));
  size_t i = 0;
  for (auto _ : state) h->Observe(values[i++ & 63]);
}
BENCHMARK(BM_HistogramObserve)->ThreadRange(1, 4)->UseRealTime();

}  // namespace
}  // namespace pdserve::metrics
