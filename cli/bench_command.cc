#include "cli/bench_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "loadgen/metrics.h"
#include "loadgen/runner.h"
#include "loadgen/target.h"
#include "loadgen/workload.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, target, "grpc://127.0.0.1:50050",
          "bench: grpc://HOST:PORT (the router's client API) or "
          "http://HOST:PORT (any OpenAI-compatible server)");
ABSL_FLAG(std::string, served_model, "",
          "bench: the \"model\" field of HTTP requests");
ABSL_FLAG(std::string, workload, "fixed",
          "bench: fixed, uniform, shared_prefix or trace");
ABSL_FLAG(int32_t, num_requests, 100,
          "bench: requests per rate (trace: at most this many; 0 = all)");
ABSL_FLAG(int32_t, prompt_tokens, 256, "bench: prompt length");
ABSL_FLAG(int32_t, output_tokens, 64, "bench: output length");
ABSL_FLAG(double, range_ratio, 0.5,
          "bench: uniform lengths within +- this fraction");
ABSL_FLAG(int32_t, num_prefixes, 4, "bench: shared_prefix system prompts");
ABSL_FLAG(int32_t, prefix_tokens, 512, "bench: shared_prefix prefix length");
ABSL_FLAG(std::string, trace, "", "bench: JSONL trace to replay");
ABSL_FLAG(double, trace_speedup, 1.0,
          "bench: replay the trace this much faster");
ABSL_FLAG(int32_t, trace_block_tokens, 16,
          "bench: tokens per trace hash_id block");
ABSL_FLAG(std::vector<std::string>, request_rate, {"inf"},
          "bench: requests/s, comma-separated for a sweep; inf = all at once");
ABSL_FLAG(double, burstiness, 1.0,
          "bench: gamma shape of inter-arrival times (1 = Poisson)");
ABSL_FLAG(int32_t, max_concurrency, 0, "bench: most requests in flight");
ABSL_FLAG(double, slo_ttft_ms, 0, "bench: TTFT target for goodput (0 = none)");
ABSL_FLAG(double, slo_tpot_ms, 0, "bench: TPOT target for goodput (0 = none)");
ABSL_FLAG(double, slo_max_itl_ms, 0,
          "bench: target for each request's longest inter-token gap, for "
          "goodput (0 = none)");
ABSL_FLAG(uint64_t, seed, 0, "bench: seed of prompts and arrivals");
ABSL_FLAG(int32_t, vocab_size, 49152,
          "bench: prompt token ids are drawn below this (the model's vocab)");
ABSL_FLAG(int32_t, min_token_id, 256,
          "bench: ... and from this up (past the special tokens)");
ABSL_FLAG(std::string, json, "", "bench: write the results here");
ABSL_FLAG(std::string, plot, "", "bench: write the plots here (PNG)");
ABSL_FLAG(std::string, plot_script, "bench/plot_serving.py",
          "bench: the plotting script (needs python3 with matplotlib)");
ABSL_FLAG(std::string, write_trace, "",
          "bench: write a synthetic chat trace here and exit");

// Shared with `pdctl generate`.
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(int32_t, timeout_s);

namespace pdserve::cli {
namespace {

using json = nlohmann::json;
using loadgen::LoadOptions;

int Usage(const std::string& why) {
  std::cerr << "pdctl bench: " << why << "\n";
  return 2;
}

int WriteTrace() {
  loadgen::SyntheticTraceOptions t;
  t.num_requests = absl::GetFlag(FLAGS_num_requests);
  const std::vector<std::string> rates = absl::GetFlag(FLAGS_request_rate);
  if (rates.size() != 1 || !absl::SimpleAtod(rates[0], &t.rate) ||
      !(t.rate > 0) || !std::isfinite(t.rate) || t.num_requests <= 0) {
    return Usage(
        "--write_trace needs one finite --request_rate and "
        "--num_requests > 0");
  }
  t.seed = absl::GetFlag(FLAGS_seed);
  const std::string path = absl::GetFlag(FLAGS_write_trace);
  std::ofstream out(path);
  out << loadgen::SyntheticChatTrace(t);
  if (!out.flush()) {
    std::cerr << "pdctl bench: cannot write " << path << "\n";
    return 1;
  }
  std::cerr << "wrote " << t.num_requests << " requests at " << t.rate
            << "/s to " << path << "\n";
  return 0;
}

}  // namespace

int Bench() {
  if (!absl::GetFlag(FLAGS_write_trace).empty()) return WriteTrace();

  absl::StatusOr<loadgen::WorkloadKind> kind =
      loadgen::ParseWorkloadKind(absl::GetFlag(FLAGS_workload));
  if (!kind.ok()) return Usage(std::string(kind.status().message()));
  loadgen::WorkloadOptions w;
  w.kind = *kind;
  w.num_requests = absl::GetFlag(FLAGS_num_requests);
  w.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  w.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  w.range_ratio = absl::GetFlag(FLAGS_range_ratio);
  w.num_prefixes = absl::GetFlag(FLAGS_num_prefixes);
  w.prefix_tokens = absl::GetFlag(FLAGS_prefix_tokens);
  w.trace_path = absl::GetFlag(FLAGS_trace);
  w.trace_speedup = absl::GetFlag(FLAGS_trace_speedup);
  w.trace_block_tokens = absl::GetFlag(FLAGS_trace_block_tokens);
  w.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  w.min_token_id = absl::GetFlag(FLAGS_min_token_id);
  w.seed = absl::GetFlag(FLAGS_seed);
  if (w.kind == loadgen::WorkloadKind::kTrace && w.trace_path.empty()) {
    return Usage("--workload=trace needs --trace=FILE");
  }
  // Each rate gets prompts of its own (seed + run): a server's prefix cache
  // must not make the later rates look faster. Options are checked once.
  auto workload_for_run = [&w](size_t run) {
    loadgen::WorkloadOptions o = w;
    o.seed = w.seed + 1000003 * run;
    return loadgen::MakeWorkload(o);
  };
  absl::StatusOr<std::vector<loadgen::BenchRequest>> requests =
      workload_for_run(0);
  if (!requests.ok()) return Usage(std::string(requests.status().message()));

  std::vector<double> rates;
  for (const std::string& r : absl::GetFlag(FLAGS_request_rate)) {
    double rate = 0;
    if (r == "inf") {
      rate = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(r, &rate) || !(rate > 0)) {
      return Usage(absl::StrCat("bad --request_rate '", r, "'"));
    }
    rates.push_back(rate);
  }
  if (w.kind == loadgen::WorkloadKind::kTrace &&
      absl::GetFlag(FLAGS_request_rate) != std::vector<std::string>{"inf"}) {
    return Usage(
        "a trace keeps its own arrival times: use --trace_speedup, not "
        "--request_rate");
  }
  const double burstiness = absl::GetFlag(FLAGS_burstiness);
  if (!(burstiness > 0)) return Usage("--burstiness must be positive");
  const loadgen::Slo slo{.ttft_ms = absl::GetFlag(FLAGS_slo_ttft_ms),
                         .tpot_ms = absl::GetFlag(FLAGS_slo_tpot_ms),
                         .max_itl_ms = absl::GetFlag(FLAGS_slo_max_itl_ms)};

  absl::StatusOr<std::unique_ptr<loadgen::Target>> target =
      loadgen::MakeTarget({.url = absl::GetFlag(FLAGS_target),
                           .model = absl::GetFlag(FLAGS_served_model),
                           .temperature = absl::GetFlag(FLAGS_temperature)});
  if (!target.ok()) return Usage(std::string(target.status().message()));
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));

  json runs = json::array();
  for (size_t run_index = 0; run_index < rates.size(); ++run_index) {
    double rate = rates[run_index];
    if (run_index > 0) requests = workload_for_run(run_index);
    if (!requests.ok()) {
      std::cerr << "pdctl bench: " << requests.status() << "\n";
      return 1;
    }
    // A replayed trace is labelled with its own mean rate.
    if (w.kind == loadgen::WorkloadKind::kTrace && requests->size() > 1) {
      const double span = absl::ToDoubleSeconds(*requests->back().arrival -
                                                *requests->front().arrival);
      if (span > 0) rate = (requests->size() - 1) / span;
    }
    // One request first: a target that cannot answer it fails the run
    // clearly instead of filling the table with errors.
    // Its prompt is the first one reversed: no prefix to leave in a cache
    // for the run's first request.
    loadgen::BenchRequest probe = requests->front();
    std::reverse(probe.prompt.begin(), probe.prompt.end());
    probe.arrival.reset();
    probe.output_tokens = std::min(probe.output_tokens, 2);
    const loadgen::RequestRecord warm =
        (*target)->Send(probe, absl::Now(), timeout);
    if (!warm.ok()) {
      std::cerr << "pdctl bench: the warm-up request to "
                << (*target)->Describe() << " failed: " << warm.error_kind
                << ": " << warm.error << "\n";
      return 1;
    }
    LoadOptions options;
    options.request_rate = rate;
    options.burstiness = burstiness;
    options.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
    options.request_timeout = timeout;
    options.seed = w.seed + run_index;
    options.on_progress = [](const LoadOptions::Progress& p) {
      absl::FPrintF(stderr, "  %6.1f s  sent %d/%d  finished %d  failed %d\n",
                    absl::ToDoubleSeconds(p.elapsed), p.sent, p.total,
                    p.finished, p.failed);
    };
    std::cerr << "== " << (*target)->Describe() << ", rate "
              << (std::isfinite(rate) ? absl::StrCat(rate, "/s") : "inf")
              << ", " << requests->size() << " requests\n";
    const loadgen::LoadResult result =
        loadgen::RunLoad(**target, *requests, options);
    const loadgen::LoadSummary summary =
        loadgen::Summarize(result, slo, rate, options.max_concurrency);
    std::cout << loadgen::FormatSummary(summary) << std::endl;
    json run = loadgen::ToJson(summary);
    run["requests"] = loadgen::ToJson(result.records);
    runs.push_back(std::move(run));
  }

  const json report = {
      {"target", (*target)->Describe()},
      {"workload",
       {{"kind", absl::GetFlag(FLAGS_workload)},
        {"num_requests", requests->size()},
        {"prompt_tokens", w.prompt_tokens},
        {"output_tokens", w.output_tokens},
        {"range_ratio", w.range_ratio},
        {"num_prefixes", w.num_prefixes},
        {"prefix_tokens", w.prefix_tokens},
        {"trace", w.trace_path},
        {"burstiness", burstiness},
        {"max_concurrency", absl::GetFlag(FLAGS_max_concurrency)},
        {"seed", w.seed}}},
      {"runs", runs}};
  std::string json_path = absl::GetFlag(FLAGS_json);
  const std::string plot = absl::GetFlag(FLAGS_plot);
  if (json_path.empty() && !plot.empty()) {
    json_path = std::filesystem::path(plot).replace_extension(".json");
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << loadgen::DumpJson(report) << "\n";
    if (!out.flush()) {
      std::cerr << "pdctl bench: cannot write " << json_path << "\n";
      return 1;
    }
    std::cerr << "wrote " << json_path << "\n";
  }
  if (!plot.empty()) {
    const std::string command =
        absl::StrCat("python3 '", absl::GetFlag(FLAGS_plot_script), "' '", plot,
                     "' '", json_path, "'");
    if (std::system(command.c_str()) != 0) {
      std::cerr << "pdctl bench: plotting failed: " << command << "\n";
      return 1;
    }
  }
  // Failed requests are results (in the table and the JSON), not an error
  // of the benchmark.
  return 0;
}

}  // namespace pdserve::cli
