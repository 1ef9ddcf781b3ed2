// The experiment that justifies disaggregation: the same workload against
//   (a) disaggregated  P prefill + D decode workers, and
//   (b) colocated      P + D colocated workers (both phases in one process),
//       once per chunked-prefill token budget of --colocated_budgets (the
//       budget bounds how long a prefill chunk stalls the decode streams
//       batched with it, as in Sarathi-Serve; the best budget is the
//       colocated baseline),
// on the same cores (one worker pinned per core, in every configuration),
// sweeping the request rate. Goodput counts the requests that meet three
// SLOs: TTFT, TPOT and their longest inter-token gap. Reports goodput, SLO
// attainment, p99 TTFT, TPOT, ITL and longest gap per rate, each phase's
// share of a request's time (queue, prefill compute, KV transfer tail,
// decode), and the ratio of the disaggregated goodput to the best colocated
// configuration's.
//
// Workloads (--workload): long_prompts (prompts of 1000-4000 tokens,
// outputs of 100-300), chat_trace (the synthetic chat trace of
// loadgen::SyntheticChatTrace at each rate: log-normal lengths, shared
// system prompts) or uniform (--prompt_tokens, --output_tokens, +-50 %).
//
// The SLOs default to multiples of what one request alone gets on the first
// colocated configuration, measured in the same run (--slo_ttft_factor,
// --slo_tpot_factor, --slo_itl_factor); --slo_ttft_ms / --slo_tpot_ms /
// --slo_max_itl_ms fix them instead. Each rate runs --repeats times (fresh
// prompts each time, the same for every configuration) and the medians are
// reported. Per-configuration reports (pdctl bench's JSON layout) go next to
// --json, for bench/plot_serving.py.
//
//   bazel build --config=opt //bench:disagg_vs_colocated //cli:pdctl
//     //router:pd-router //prefill_worker:pd-prefill-worker
//     //decode_worker:pd-decode-worker
//   bazel-bin/bench/disagg_vs_colocated --bin_dir=$PWD/bazel-bin
// (scripts/pd-bench disagg-vs-colocated does all of it and plots.)
#include <sched.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/local_cluster.h"
#include "common/status_macros.h"
#include "loadgen/metrics.h"
#include "loadgen/runner.h"
#include "loadgen/target.h"
#include "loadgen/workload.h"
#include "model/default_model.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "GGUF file (default: the default model)");
ABSL_FLAG(std::string, bin_dir, "bazel-bin", "where the server binaries are");
ABSL_FLAG(std::string, work_dir, "/tmp/pdserve-disagg-bench", "cluster logs");
ABSL_FLAG(int32_t, prefill, 1, "P: prefill workers (and as many colocated)");
ABSL_FLAG(int32_t, decode, 1, "D: decode workers (and as many colocated)");
ABSL_FLAG(std::string, workload, "long_prompts",
          "long_prompts (prompts of 1000-4000 tokens, outputs of 100-300), "
          "chat_trace (synthetic chat trace at each rate) or uniform");
ABSL_FLAG(std::vector<std::string>, colocated_budgets,
          std::vector<std::string>({"512", "256", "128", "64"}),
          "chunked-prefill token budgets (--max_batch_tokens) of the "
          "colocated workers; one configuration each, the first sets the "
          "SLOs");
ABSL_FLAG(std::vector<std::string>, request_rate,
          std::vector<std::string>({"0.1", "0.2", "0.3"}),
          "request rates to sweep (requests/s)");
ABSL_FLAG(int32_t, num_requests, 16, "requests per rate and repeat");
ABSL_FLAG(int32_t, repeats, 3, "runs per rate (medians reported)");
ABSL_FLAG(int32_t, prompt_tokens, 128,
          "uniform workload: mean prompt length (+-50%)");
ABSL_FLAG(int32_t, output_tokens, 96,
          "uniform workload: mean output length (+-50%)");
ABSL_FLAG(double, burstiness, 1.0, "gamma shape of arrivals (1 = Poisson)");
ABSL_FLAG(double, slo_ttft_factor, 5.0,
          "TTFT SLO = this x one request's TTFT on the colocated cluster");
ABSL_FLAG(double, slo_tpot_factor, 3.0,
          "TPOT SLO = this x one request's TPOT on the colocated cluster");
ABSL_FLAG(double, slo_itl_factor, 3.0,
          "longest-gap SLO = this x one request's longest inter-token gap "
          "on the colocated cluster");
ABSL_FLAG(double, slo_ttft_ms, 0, "fixed TTFT SLO (overrides the factor)");
ABSL_FLAG(double, slo_tpot_ms, 0, "fixed TPOT SLO (overrides the factor)");
ABSL_FLAG(double, slo_max_itl_ms, 0,
          "fixed longest-gap SLO (overrides the factor)");
ABSL_FLAG(int32_t, threads, 1, "forward-pass threads per worker");
ABSL_FLAG(std::string, json, "", "write the comparison here");

namespace pdserve::bench {
namespace {

using json = nlohmann::json;

struct Config {
  std::string name;  // "disaggregated", "colocated-512", ...
  cli::LocalClusterOptions options;
  std::string cores;   // as printed
  int32_t budget = 0;  // colocated: the chunked-prefill budget; else 0
};

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// One worker per core, in the same order in every configuration: worker i
// of P + D gets core i % cores. The router (and this load generator) are
// not pinned: they share the cores with the workers, equally in all.
// Colocated configurations first, one per budget: the first one's lone
// request sets the SLOs.
absl::StatusOr<std::vector<Config>> Configs(const std::vector<int>& cpus) {
  const int p = absl::GetFlag(FLAGS_prefill), d = absl::GetFlag(FLAGS_decode);
  cli::LocalClusterOptions base;
  base.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  base.model_path = absl::GetFlag(FLAGS_model).empty()
                        ? model::DefaultModelPath()
                        : absl::GetFlag(FLAGS_model);
  base.worker_args = {absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
                      "--kv_cache_mb=256"};
  base.startup_timeout = absl::Seconds(120);
  std::vector<Config> configs;
  for (const std::string& b : absl::GetFlag(FLAGS_colocated_budgets)) {
    int32_t budget = 0;
    if (!absl::SimpleAtoi(b, &budget) || budget <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --colocated_budgets entry '", b, "'"));
    }
    Config coloc{absl::StrCat("colocated-", budget), base, "", budget};
    coloc.options.num_prefill = 0;
    coloc.options.num_decode = 0;
    coloc.options.num_colocated = p + d;
    coloc.options.pool_args["colocated"] = {
        absl::StrCat("--max_batch_tokens=", budget)};
    configs.push_back(std::move(coloc));
  }
  if (configs.empty()) {
    return absl::InvalidArgumentError("--colocated_budgets is empty");
  }
  Config disagg{"disaggregated", base, "", 0};
  disagg.options.num_prefill = p;
  disagg.options.num_decode = d;
  configs.push_back(std::move(disagg));
  for (Config& config : configs) {
    std::vector<std::string> names;
    if (config.budget == 0) {
      for (int i = 0; i < p; ++i) names.push_back(absl::StrCat("prefill-", i));
      for (int i = 0; i < d; ++i) names.push_back(absl::StrCat("decode-", i));
    } else {
      for (int i = 0; i < p + d; ++i) {
        names.push_back(absl::StrCat("colocated-", i));
      }
    }
    std::vector<std::string> shown;
    for (size_t i = 0; i < names.size(); ++i) {
      const int cpu = cpus[i % cpus.size()];
      config.options.process_cpus[names[i]] = {cpu};
      shown.push_back(absl::StrCat(names[i], "->cpu", cpu));
    }
    config.cores = absl::StrCat(absl::StrJoin(shown, ", "),
                                "; router and load generator unpinned");
  }
  return configs;
}

// The requests of one run (rate index, repeat): the same for every
// configuration.
absl::StatusOr<std::vector<loadgen::BenchRequest>> Workload(
    int num_requests, double rate, uint64_t seed, const std::string& dir) {
  const std::string kind = absl::GetFlag(FLAGS_workload);
  loadgen::WorkloadOptions w;
  w.num_requests = num_requests;
  w.seed = seed;
  if (kind == "chat_trace") {
    loadgen::SyntheticTraceOptions t;
    t.num_requests = num_requests;
    t.rate = rate;
    t.seed = seed;
    w.kind = loadgen::WorkloadKind::kTrace;
    w.trace_path = absl::StrCat(dir, "/chat_trace_", seed, ".jsonl");
    std::ofstream(w.trace_path) << loadgen::SyntheticChatTrace(t);
  } else if (kind == "long_prompts") {
    w.kind = loadgen::WorkloadKind::kUniform;
    w.prompt_tokens = 2500;  // 1000..4000
    w.range_ratio = 0.6;
    w.output_tokens = 200;  // 100..300
    w.output_range_ratio = 0.5;
  } else if (kind == "uniform") {
    w.kind = loadgen::WorkloadKind::kUniform;
    w.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
    w.output_tokens = absl::GetFlag(FLAGS_output_tokens);
    w.range_ratio = 0.5;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --workload '", kind, "'"));
  }
  return loadgen::MakeWorkload(w);
}

double Median(std::vector<double> v) { return loadgen::Percentile(v, 0.5); }

// One request at a time: what a request gets from an idle cluster.
struct Unloaded {
  double ttft_ms = 0, tpot_ms = 0, max_itl_ms = 0;
};
// Five requests of the workload's typical shape (its mean lengths; the chat
// trace's medians), one at a time; every one must succeed (a baseline from
// failures would make every SLO 0, that is none). Medians.
absl::StatusOr<Unloaded> MeasureUnloaded(loadgen::Target& target) {
  loadgen::WorkloadOptions w;
  w.kind = loadgen::WorkloadKind::kFixed;
  w.num_requests = 5;
  w.seed = 777;
  const std::string kind = absl::GetFlag(FLAGS_workload);
  if (kind == "long_prompts") {
    w.prompt_tokens = 2500;
    w.output_tokens = 200;
  } else if (kind == "chat_trace") {
    const loadgen::SyntheticTraceOptions t;
    w.prompt_tokens = static_cast<int32_t>(t.prompt_median);
    w.output_tokens = static_cast<int32_t>(t.output_median);
  } else {
    w.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
    w.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  }
  PD_ASSIGN_OR_RETURN(std::vector<loadgen::BenchRequest> requests,
                      loadgen::MakeWorkload(w));
  std::vector<double> ttft, tpot, max_itl;
  for (const loadgen::BenchRequest& r : requests) {
    const loadgen::RequestRecord rec =
        target.Send(r, absl::Now(), absl::Minutes(2));
    if (!rec.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "a request alone failed: ", rec.error_kind, ": ", rec.error));
    }
    ttft.push_back(absl::ToDoubleMilliseconds(rec.ttft));
    tpot.push_back(absl::ToDoubleMilliseconds(rec.tpot()));
    max_itl.push_back(loadgen::LongestGapMs(rec));
  }
  return Unloaded{Median(ttft), Median(tpot), Median(max_itl)};
}

// Where the time of the completed requests of one run went, as shares of
// their summed end-to-end time: queueing and prefill compute (as the router
// reports them), the KV transfer's tail after the compute, the rest of the
// time to the first token (routing, admission, streaming), and decoding.
struct PhaseShares {
  double queue = 0, prefill = 0, transfer_tail = 0, other_ttft = 0, decode = 0;
};
PhaseShares SharesOf(const std::vector<loadgen::RequestRecord>& records) {
  PhaseShares sums;
  double total = 0;
  for (const loadgen::RequestRecord& r : records) {
    if (!r.ok()) continue;
    const double ttft = absl::ToDoubleMilliseconds(r.ttft);
    const double e2e = absl::ToDoubleMilliseconds(r.e2e);
    sums.queue += r.server_queue_ms;
    sums.prefill += r.server_prefill_ms;
    sums.transfer_tail += r.server_transfer_tail_ms;
    sums.other_ttft +=
        std::max(0.0, ttft - r.server_queue_ms - r.server_prefill_ms -
                          r.server_transfer_tail_ms);
    sums.decode += e2e - ttft;
    total += e2e;
  }
  if (total <= 0) return {};
  return {sums.queue / total, sums.prefill / total, sums.transfer_tail / total,
          sums.other_ttft / total, sums.decode / total};
}

struct RatePoint {
  double rate = 0;
  double goodput = 0, attainment = 0, throughput = 0;
  double p99_ttft = 0, p99_tpot = 0, p99_itl = 0, p99_max_itl = 0;
  PhaseShares shares;  // Medians over the repeats, share by share.
  int64_t failed = 0;
};

json ToJson(const PhaseShares& s) {
  return {{"queue", s.queue},
          {"prefill", s.prefill},
          {"transfer_tail", s.transfer_tail},
          {"other_ttft", s.other_ttft},
          {"decode", s.decode}};
}

int Main() {
  const std::vector<int> cpus = AllowedCpus();
  if (cpus.size() < 2) {
    absl::FPrintF(stderr, "needs at least 2 CPUs, has %d\n", cpus.size());
    return 1;
  }
  std::vector<double> rates;
  for (const std::string& r : absl::GetFlag(FLAGS_request_rate)) {
    double rate = 0;
    if (!absl::SimpleAtod(r, &rate) || !(rate > 0) || !std::isfinite(rate)) {
      absl::FPrintF(stderr, "bad --request_rate %s\n", r);
      return 2;
    }
    rates.push_back(rate);
  }
  const std::string work_dir = absl::GetFlag(FLAGS_work_dir);
  std::filesystem::create_directories(work_dir);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  absl::StatusOr<std::vector<Config>> made = Configs(cpus);
  if (!made.ok()) {
    absl::FPrintF(stderr, "%s\n", made.status().ToString());
    return 2;
  }
  std::vector<Config>& configs = *made;
  loadgen::Slo slo{.ttft_ms = absl::GetFlag(FLAGS_slo_ttft_ms),
                   .tpot_ms = absl::GetFlag(FLAGS_slo_tpot_ms),
                   .max_itl_ms = absl::GetFlag(FLAGS_slo_max_itl_ms)};
  const std::string workload = absl::GetFlag(FLAGS_workload);
  json out = {{"model", configs[0].options.model_path},
              {"workload", workload},
              {"prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens)},
              {"output_tokens", absl::GetFlag(FLAGS_output_tokens)},
              {"num_requests", absl::GetFlag(FLAGS_num_requests)},
              {"repeats", repeats},
              {"burstiness", absl::GetFlag(FLAGS_burstiness)},
              {"configurations", json::array()}};
  std::map<std::string, std::vector<RatePoint>> points;
  Unloaded alone;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    Config& config = configs[ci];
    config.options.work_dir = absl::StrCat(work_dir, "/", config.name);
    std::filesystem::create_directories(config.options.work_dir);
    absl::FPrintF(stderr, "== %s: %s\n", config.name, config.cores);
    auto cluster = cli::LocalCluster::Start(config.options);
    if (!cluster.ok()) {
      absl::FPrintF(stderr, "%s cluster failed to start: %s\n", config.name,
                    cluster.status().ToString());
      return 1;
    }
    loadgen::TargetOptions target_options;
    target_options.url = absl::StrCat("grpc://", (*cluster)->router_address());
    auto target = loadgen::MakeTarget(target_options);
    if (ci == 0) {
      const absl::StatusOr<Unloaded> measured = MeasureUnloaded(**target);
      if (!measured.ok()) {
        absl::FPrintF(stderr, "%s: %s\n", config.name,
                      measured.status().ToString());
        return 1;
      }
      alone = *measured;
      absl::FPrintF(stderr,
                    "   one request alone: TTFT %.1f ms, TPOT %.2f ms, "
                    "longest gap %.1f ms\n",
                    alone.ttft_ms, alone.tpot_ms, alone.max_itl_ms);
      if (slo.ttft_ms <= 0) {
        slo.ttft_ms = absl::GetFlag(FLAGS_slo_ttft_factor) * alone.ttft_ms;
      }
      if (slo.tpot_ms <= 0) {
        slo.tpot_ms = absl::GetFlag(FLAGS_slo_tpot_factor) * alone.tpot_ms;
      }
      if (slo.max_itl_ms <= 0) {
        slo.max_itl_ms = absl::GetFlag(FLAGS_slo_itl_factor) * alone.max_itl_ms;
      }
    }
    json report = {{"label", config.name},
                   {"target", (*target)->Describe()},
                   {"cores", config.cores},
                   {"colocated_budget", config.budget},
                   {"runs", json::array()}};
    for (size_t ri = 0; ri < rates.size(); ++ri) {
      std::vector<double> good, attain, thr, p99t, p99p, p99i, p99m;
      std::vector<std::vector<double>> shares(5);
      int64_t failed = 0;
      for (int rep = 0; rep < repeats; ++rep) {
        // The same prompts and arrivals for every configuration.
        const uint64_t seed = 1000 * ri + rep;
        auto requests = Workload(absl::GetFlag(FLAGS_num_requests), rates[ri],
                                 seed, work_dir);
        if (!requests.ok()) {
          absl::FPrintF(stderr, "%s\n", requests.status().ToString());
          return 2;
        }
        loadgen::LoadOptions options;
        options.request_rate = rates[ri];  // A trace keeps its own arrivals.
        options.burstiness = absl::GetFlag(FLAGS_burstiness);
        options.seed = seed;
        options.request_timeout = absl::Minutes(5);
        const loadgen::LoadResult result =
            loadgen::RunLoad(**target, *requests, options);
        const loadgen::LoadSummary s =
            loadgen::Summarize(result, slo, rates[ri], 0);
        good.push_back(s.goodput);
        attain.push_back(s.slo_attainment);
        thr.push_back(s.request_throughput);
        p99t.push_back(s.ttft_ms.p99);
        p99p.push_back(s.tpot_ms.p99);
        p99i.push_back(s.itl_ms.p99);
        p99m.push_back(s.max_itl_ms.p99);
        const PhaseShares ps = SharesOf(result.records);
        for (int k = 0; k < 5; ++k) {
          shares[k].push_back(std::array{ps.queue, ps.prefill, ps.transfer_tail,
                                         ps.other_ttft, ps.decode}[k]);
        }
        failed += s.failed;
        json run = loadgen::ToJson(s);
        run["repeat"] = rep;
        run["phase_shares"] = ToJson(ps);
        run["requests"] = loadgen::ToJson(result.records);
        // The plot draws one CDF per rate: the first repeat's.
        if (rep == 0) report["runs"].push_back(std::move(run));
      }
      RatePoint p;
      p.rate = rates[ri];
      p.goodput = Median(good);
      p.attainment = Median(attain);
      p.throughput = Median(thr);
      p.p99_ttft = Median(p99t);
      p.p99_tpot = Median(p99p);
      p.p99_itl = Median(p99i);
      p.p99_max_itl = Median(p99m);
      p.shares = {Median(shares[0]), Median(shares[1]), Median(shares[2]),
                  Median(shares[3]), Median(shares[4])};
      p.failed = failed;
      absl::FPrintF(stderr,
                    "   rate %5.2f/s: goodput %5.2f/s (%3.0f%% met SLO), "
                    "p99 TTFT %7.0f ms, TPOT %6.1f ms, ITL %6.1f ms, longest "
                    "gap %6.0f ms, %d failed\n",
                    p.rate, p.goodput, 100 * p.attainment, p.p99_ttft,
                    p.p99_tpot, p.p99_itl, p.p99_max_itl, p.failed);
      points[config.name].push_back(p);
      // The medians over the repeats, beside the first repeat's own
      // figures (bench/plot_serving.py draws the medians when present).
      report["runs"].back()["median"] = {{"goodput", p.goodput},
                                         {"request_throughput", p.throughput},
                                         {"slo_attainment", p.attainment},
                                         {"p99_ttft_ms", p.p99_ttft},
                                         {"p99_tpot_ms", p.p99_tpot},
                                         {"p99_itl_ms", p.p99_itl},
                                         {"p99_max_itl_ms", p.p99_max_itl},
                                         {"phase_shares", ToJson(p.shares)},
                                         {"repeats", repeats}};
    }
    if (const absl::Status stopped = (*cluster)->Stop(absl::Seconds(20));
        !stopped.ok()) {
      absl::FPrintF(stderr, "%s cluster stopped uncleanly: %s\n", config.name,
                    stopped.ToString());
    }
    out["configurations"].push_back(config.name);
    out[config.name] = report;
  }

  absl::PrintF(
      "\nDisaggregated (%d prefill + %d decode) vs colocated (%d) at "
      "chunked-prefill budgets %s; %s\n"
      "workload %s; SLO: TTFT <= %.0f ms, TPOT <= %.1f ms, longest gap <= "
      "%.0f ms (one request alone: %.0f ms, %.1f ms, %.0f ms); medians of %d "
      "runs of %d requests\n",
      absl::GetFlag(FLAGS_prefill), absl::GetFlag(FLAGS_decode),
      absl::GetFlag(FLAGS_prefill) + absl::GetFlag(FLAGS_decode),
      absl::StrJoin(absl::GetFlag(FLAGS_colocated_budgets), "/"),
      configs.back().cores, workload, slo.ttft_ms, slo.tpot_ms, slo.max_itl_ms,
      alone.ttft_ms, alone.tpot_ms, alone.max_itl_ms, repeats,
      absl::GetFlag(FLAGS_num_requests));
  absl::PrintF("%7s %-15s | %9s %6s | %8s %7s %7s %8s | %s\n", "rate/s",
               "configuration", "goodput/s", "met", "p99 TTFT", "TPOT", "ITL",
               "max gap",
               "time: queue/prefill/transfer tail/other TTFT/decode");
  json table = json::array();
  for (size_t i = 0; i < rates.size(); ++i) {
    for (const Config& config : configs) {
      const RatePoint& p = points[config.name][i];
      absl::PrintF(
          "%7.2f %-15s | %9.2f %5.0f%% | %8.0f %7.1f %7.1f %8.0f | "
          "%3.0f%% %3.0f%% %3.0f%% %3.0f%% %3.0f%%\n",
          p.rate, config.name, p.goodput, 100 * p.attainment, p.p99_ttft,
          p.p99_tpot, p.p99_itl, p.p99_max_itl, 100 * p.shares.queue,
          100 * p.shares.prefill, 100 * p.shares.transfer_tail,
          100 * p.shares.other_ttft, 100 * p.shares.decode);
      table.push_back({{"rate", p.rate},
                       {"configuration", config.name},
                       {"goodput", p.goodput},
                       {"attainment", p.attainment},
                       {"p99_ttft_ms", p.p99_ttft},
                       {"p99_tpot_ms", p.p99_tpot},
                       {"p99_itl_ms", p.p99_itl},
                       {"p99_max_itl_ms", p.p99_max_itl},
                       {"phase_shares", ToJson(p.shares)},
                       {"failed", p.failed}});
    }
  }
  // Goodput at the best rate of each configuration; the colocated baseline
  // is its best budget.
  std::map<std::string, double> best;
  std::string best_colocated;
  for (const Config& config : configs) {
    for (const RatePoint& p : points[config.name]) {
      best[config.name] = std::max(best[config.name], p.goodput);
    }
    if (config.budget > 0 &&
        (best_colocated.empty() || best[config.name] > best[best_colocated])) {
      best_colocated = config.name;
    }
  }
  // "inf" when only the disaggregated cluster met the SLOs at all.
  const double d = best["disaggregated"], c = best[best_colocated];
  const double ratio = c > 0 ? d / c : (d > 0 ? INFINITY : 0.0);
  std::string per_config;
  for (const Config& config : configs) {
    absl::StrAppendFormat(&per_config, " %s %.3f/s;", config.name,
                          best[config.name]);
  }
  absl::PrintF("max goodput:%s disaggregated / best colocated (%s) = %.2f\n",
               per_config, best_colocated, ratio);
  out["slo_ttft_ms"] = slo.ttft_ms;
  out["slo_tpot_ms"] = slo.tpot_ms;
  out["slo_max_itl_ms"] = slo.max_itl_ms;
  out["unloaded"] = {{"ttft_ms", alone.ttft_ms},
                     {"tpot_ms", alone.tpot_ms},
                     {"max_itl_ms", alone.max_itl_ms}};
  out["table"] = table;
  out["best_colocated"] = best_colocated;
  out["max_goodput"] = best;
  out["max_goodput_ratio"] = std::isfinite(ratio) ? json(ratio) : json("inf");
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream(json_path) << loadgen::DumpJson(out) << "\n";
    for (const Config& config : configs) {
      const std::string path =
          std::filesystem::path(json_path).replace_extension(
              absl::StrCat(".", config.name, ".json"));
      std::ofstream(path) << loadgen::DumpJson(out[config.name]) << "\n";
    }
    absl::FPrintF(stderr, "wrote %s (and one .<configuration>.json each)\n",
                  json_path);
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::bench::Main();
}
