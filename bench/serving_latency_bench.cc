// One long prompt through the cluster against the offline engine: what
// disaggregation costs (or saves) a single request, and how much of the KV
// transfer the prefill compute hides.
//
// For --runs prompts of --prompt_tokens tokens (distinct, so no prefix-cache
// hits) generating --gen_tokens tokens each, greedy, it measures
//   offline       LlmEngine in this process (--threads threads);
//   disaggregated router + 1 prefill + 1 decode worker (--threads each),
//                 KV over UCX;
//   colocated     router + 1 colocated worker (--threads);
// and prints medians of TTFT and TPOT, the cluster / offline ratios, and,
// for the disaggregated runs, prefill compute, KV transfer time and the part
// of it after the compute (the rest overlapped the compute). JSON to --json.
//
//   bazel build --config=opt //bench:serving_latency_bench //cli:pdctl
//     //router:pd-router //prefill_worker:pd-prefill-worker
//     //decode_worker:pd-decode-worker
//   bazel-bin/bench/serving_latency_bench --bin_dir=$PWD/bazel-bin
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/generate_client.h"
#include "cli/local_cluster.h"
#include "engine/llm_engine.h"
#include "model/default_model.h"
#include "model/model.h"

ABSL_FLAG(std::string, model, "", "GGUF file (default: the default model)");
ABSL_FLAG(std::string, bin_dir, "bazel-bin", "where the server binaries are");
ABSL_FLAG(std::string, work_dir, "/tmp/pdserve-serving-bench", "cluster logs");
ABSL_FLAG(int32_t, prompt_tokens, 500, "prompt length");
ABSL_FLAG(int32_t, gen_tokens, 64, "tokens generated per request");
ABSL_FLAG(int32_t, runs, 5, "requests per configuration (medians reported)");
ABSL_FLAG(int32_t, threads, 1, "forward-pass threads per process");
ABSL_FLAG(std::string, json, "", "write the results here");

namespace pdserve::bench {
namespace {

struct Sample {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double prefill_compute_ms = 0;
  double kv_transfer_ms = 0;
  double kv_transfer_tail_ms = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2]
                      : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

template <typename F>
double MedianOf(const std::vector<Sample>& samples, F field) {
  std::vector<double> v;
  for (const Sample& s : samples) v.push_back(field(s));
  return Median(v);
}

std::vector<int32_t> Prompt(int run, int32_t length, int32_t vocab) {
  std::vector<int32_t> p(length);
  for (int32_t i = 0; i < length; ++i) {
    p[i] = (i * 7919 + run * 104729 + 17) % (vocab - 100) + 50;
  }
  return p;
}

std::vector<Sample> RunOffline(const model::Model& model, int32_t vocab) {
  engine::EngineOptions options;
  options.runner.num_threads = absl::GetFlag(FLAGS_threads);
  auto engine = engine::LlmEngine::Create(model, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return {};
  }
  std::vector<Sample> samples;
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    engine::EngineRequest r;
    r.prompt = Prompt(run, absl::GetFlag(FLAGS_prompt_tokens), vocab);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = absl::GetFlag(FLAGS_gen_tokens);
    r.sampling.ignore_eos = true;
    absl::Time start = absl::Now(), first, last;
    int n = 0;
    r.on_output = [&](const engine::RequestOutput& out) {
      if (out.token_ids.empty()) return;
      last = absl::Now();
      if (n == 0) first = last;
      n += out.token_ids.size();
    };
    if (!(*engine)->AddRequest(std::move(r)).ok()) return {};
    if (!(*engine)->RunUntilIdle().ok()) return {};
    Sample s;
    s.ttft_ms = absl::ToDoubleMilliseconds(first - start);
    s.tpot_ms = absl::ToDoubleMilliseconds(last - first) / std::max(1, n - 1);
    s.prefill_compute_ms = s.ttft_ms;
    samples.push_back(s);
    std::fprintf(stderr, "  offline run %d: TTFT %.1f ms, TPOT %.2f ms\n", run,
                 s.ttft_ms, s.tpot_ms);
  }
  return samples;
}

std::vector<Sample> RunCluster(const std::string& name, int prefill, int decode,
                               int colocated, int32_t vocab) {
  cli::LocalClusterOptions options;
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  options.work_dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/", name);
  std::filesystem::create_directories(options.work_dir);
  options.model_path = absl::GetFlag(FLAGS_model);
  options.num_prefill = prefill;
  options.num_decode = decode;
  options.num_colocated = colocated;
  options.worker_args = {
      absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads))};
  options.startup_timeout = absl::Seconds(120);
  auto cluster = cli::LocalCluster::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str());
    return {};
  }
  std::vector<Sample> samples;
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    v1::GenerateRequest request;
    for (int32_t t : Prompt(run, absl::GetFlag(FLAGS_prompt_tokens), vocab)) {
      request.mutable_token_ids()->add_ids(t);
    }
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(absl::GetFlag(FLAGS_gen_tokens));
    request.mutable_sampling()->set_ignore_eos(true);
    request.mutable_stream_options()->set_include_timing(true);
    const absl::Time start = absl::Now();
    absl::Time first, last;
    int n = 0;
    v1::Timing timing;
    const absl::Status status = cli::StreamGenerate(
        (*cluster)->router_address(), request, absl::Minutes(5),
        [&](const v1::GenerateResponse& chunk) {
          if (chunk.has_timing()) timing = chunk.timing();
          if (chunk.token_ids().empty()) return;
          last = absl::Now();
          if (n == 0) first = last;
          n += chunk.token_ids_size();
        });
    if (!status.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), status.ToString().c_str());
      return {};
    }
    Sample s;
    s.ttft_ms = absl::ToDoubleMilliseconds(first - start);
    s.tpot_ms = absl::ToDoubleMilliseconds(last - first) / std::max(1, n - 1);
    s.prefill_compute_ms = timing.prefill_compute_ms();
    s.kv_transfer_ms = timing.kv_transfer_ms();
    s.kv_transfer_tail_ms = timing.kv_transfer_tail_ms();
    samples.push_back(s);
    std::fprintf(stderr,
                 "  %s run %d: TTFT %.1f ms (prefill compute %.1f, KV "
                 "transfer %.1f, after compute %.1f), TPOT %.2f ms\n",
                 name.c_str(), run, s.ttft_ms, s.prefill_compute_ms,
                 s.kv_transfer_ms, s.kv_transfer_tail_ms, s.tpot_ms);
  }
  (void)(*cluster)->Stop(absl::Seconds(30));
  return samples;
}

int Run() {
  std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) path = model::DefaultModelPath();
  absl::SetFlag(&FLAGS_model, path);
  auto model = model::Model::Open(path);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const int32_t vocab = (*model)->config().vocab_size;
  std::map<std::string, std::vector<Sample>> results;
  std::fprintf(stderr, "offline engine (%d threads)\n",
               absl::GetFlag(FLAGS_threads));
  results["offline"] = RunOffline(**model, vocab);
  std::fprintf(stderr, "disaggregated: router + 1 prefill + 1 decode\n");
  results["disaggregated"] = RunCluster("disaggregated", 1, 1, 0, vocab);
  std::fprintf(stderr, "colocated: router + 1 colocated worker\n");
  results["colocated"] = RunCluster("colocated", 0, 0, 1, vocab);
  for (const auto& [name, samples] : results) {
    if (samples.empty()) {
      std::fprintf(stderr, "%s failed\n", name.c_str());
      return 1;
    }
  }

  const double off_ttft =
      MedianOf(results["offline"], [](const Sample& s) { return s.ttft_ms; });
  const double off_tpot =
      MedianOf(results["offline"], [](const Sample& s) { return s.tpot_ms; });
  std::printf(
      "\n%d-token prompt, %d generated tokens, %d thread(s) per process, "
      "medians of %d runs\n\n",
      absl::GetFlag(FLAGS_prompt_tokens), absl::GetFlag(FLAGS_gen_tokens),
      absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_runs));
  std::printf("%-14s %10s %8s %10s %8s\n", "config", "TTFT ms", "x offl",
              "TPOT ms", "x offl");
  std::string json = "{\n";
  absl::StrAppendFormat(
      &json,
      "  \"prompt_tokens\": %d,\n  \"gen_tokens\": %d,\n  \"threads\": %d,\n"
      "  \"runs\": %d,\n  \"model\": \"%s\",\n  \"configs\": {\n",
      absl::GetFlag(FLAGS_prompt_tokens), absl::GetFlag(FLAGS_gen_tokens),
      absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_runs), path);
  bool first_config = true;
  for (const char* name : {"offline", "disaggregated", "colocated"}) {
    const auto& samples = results[name];
    const double ttft =
        MedianOf(samples, [](const Sample& s) { return s.ttft_ms; });
    const double tpot =
        MedianOf(samples, [](const Sample& s) { return s.tpot_ms; });
    const double compute =
        MedianOf(samples, [](const Sample& s) { return s.prefill_compute_ms; });
    const double transfer =
        MedianOf(samples, [](const Sample& s) { return s.kv_transfer_ms; });
    const double tail = MedianOf(
        samples, [](const Sample& s) { return s.kv_transfer_tail_ms; });
    std::printf("%-14s %10.1f %8.2f %10.2f %8.2f\n", name, ttft,
                ttft / off_ttft, tpot, tpot / off_tpot);
    absl::StrAppendFormat(
        &json,
        "%s    \"%s\": {\"ttft_ms\": %.3f, \"tpot_ms\": %.4f, "
        "\"ttft_vs_offline\": %.4f, \"tpot_vs_offline\": %.4f, "
        "\"prefill_compute_ms\": %.3f, \"kv_transfer_ms\": %.3f, "
        "\"kv_transfer_tail_ms\": %.3f}",
        first_config ? "" : ",\n", name, ttft, tpot, ttft / off_ttft,
        tpot / off_tpot, compute, transfer, tail);
    first_config = false;
  }
  json += "\n  }\n}\n";
  const auto& d = results["disaggregated"];
  const double compute =
      MedianOf(d, [](const Sample& s) { return s.prefill_compute_ms; });
  const double transfer =
      MedianOf(d, [](const Sample& s) { return s.kv_transfer_ms; });
  const double tail =
      MedianOf(d, [](const Sample& s) { return s.kv_transfer_tail_ms; });
  std::printf(
      "\ndisaggregated: prefill compute %.1f ms; KV transfer %.1f ms from the "
      "first layer's write to the verified notice, of which %.1f ms after "
      "the compute: %.0f%% of the transfer overlapped the compute\n",
      compute, transfer, tail,
      transfer > 0 ? 100.0 * (1 - tail / transfer) : 0.0);
  if (const std::string out = absl::GetFlag(FLAGS_json); !out.empty()) {
    std::ofstream(out) << json;
    std::printf("wrote %s\n", out.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::bench::Run();
}
