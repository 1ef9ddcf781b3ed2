// kernel_bandwidth_bench: how close the CPU kernels come to the machine's
// memory bandwidth, measured in the same run.
//
// Kernels that stream their operands once (RMSNorm today; dequantizing
// matrix-vector products with the engine) are bandwidth-bound during decode,
// so "fraction of memcpy bandwidth" is the figure that says how much is left
// to gain. Each case runs with repetitions; medians are reported, since these
// machines are noisy.
//
//   kernel_bandwidth_bench [--json=FILE] [--benchmark_repetitions=N] ...
//
// Prints a table of median GB/s and the ratio to memcpy, and writes JSON.
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "kernels/rms_norm.h"

namespace pdserve::bench {
namespace {

// Working sets well beyond the last-level cache, so DRAM is measured.
constexpr int64_t kBytes = int64_t{64} << 20;

std::vector<float> RandomFloats(size_t n) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = kBytes / sizeof(float);
  std::vector<float> src = RandomFloats(n), dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  // Read once, written once: the same accounting as the kernels below.
  state.SetBytesProcessed(state.iterations() * 2 * kBytes);
}

void BM_RmsNormCpu(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const int rows = static_cast<int>(kBytes / sizeof(float) / dim);
  std::vector<float> x = RandomFloats(size_t{1} * rows * dim);
  std::vector<float> weight = RandomFloats(dim), out(x.size());
  for (auto _ : state) {
    kernels::RmsNormCpu(x.data(), weight.data(), 1e-5f, rows, dim, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * int64_t{rows} * dim *
                          int64_t{sizeof(float)});
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
// Hidden sizes of SmolLM2-135M (576), Llama-3.2-1B (2048), Llama-3-8B (4096).
BENCHMARK(BM_RmsNormCpu)
    ->Arg(576)
    ->Arg(2048)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Collects the median aggregate of every benchmark while printing as usual.
class MedianCollector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.aggregate_name == "median") {
        const auto bytes = run.counters.find("bytes_per_second");
        if (bytes != run.counters.end()) {
          median_gbps_[run.run_name.function_name +
                       (run.run_name.args.empty() ? ""
                                                  : "/" + run.run_name.args)] =
              bytes->second.value / 1e9;
        }
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  const std::map<std::string, double>& median_gbps() const {
    return median_gbps_;
  }

 private:
  std::map<std::string, double> median_gbps_;
};

int Main(int argc, char** argv) {
  std::string json_path = "kernel_bandwidth.json";
  std::vector<char*> args = {argv[0]};
  bool repetitions_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--json=", 0) == 0) {
      json_path = arg.substr(7);
    } else {
      repetitions_given |= arg.rfind("--benchmark_repetitions", 0) == 0;
      args.push_back(argv[i]);
    }
  }
  std::string default_repetitions = "--benchmark_repetitions=5";
  if (!repetitions_given) args.push_back(default_repetitions.data());
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  args.push_back(aggregates.data());
  int bench_argc = static_cast<int>(args.size());
  benchmark::Initialize(&bench_argc, args.data());

  MedianCollector reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const auto& gbps = reporter.median_gbps();
  const auto memcpy_it = gbps.find("BM_Memcpy");
  if (memcpy_it == gbps.end()) {
    std::cerr << "memcpy baseline did not run\n";
    return 1;
  }
  const double baseline = memcpy_it->second;
  std::cout << absl::StrFormat("\n%-22s %10s %14s\n", "case", "GB/s (med)",
                               "x memcpy");
  std::ofstream json(json_path);
  json << "{\n  \"memcpy_gbps\": " << baseline << ",\n  \"cases\": [\n";
  bool first = true;
  for (const auto& [name, value] : gbps) {
    std::cout << absl::StrFormat("%-22s %10.2f %14.2f\n", name, value,
                                 value / baseline);
    json << (first ? "" : ",\n")
         << absl::StrFormat(
                "    {\"name\": \"%s\", \"gbps\": %.3f, \"ratio_to_memcpy\": "
                "%.3f}",
                name, value, value / baseline);
    first = false;
  }
  json << "\n  ]\n}\n";
  std::cout << "JSON written to " << json_path << "\n";
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) { return pdserve::bench::Main(argc, argv); }
