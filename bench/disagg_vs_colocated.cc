// The experiment that justifies disaggregation: the same workload against
//   (a) disaggregated  P prefill + D decode workers, and
//   (b) colocated      P + D colocated workers (both phases in one process),
// on the same cores (one worker pinned per core, in both configurations),
// sweeping the request rate. Reports goodput (requests/s meeting both the
// TTFT and the TPOT SLO), SLO attainment, p99 TTFT and TPOT per rate, and
// the goodput ratio disaggregated / colocated.
//
// The SLOs default to multiples of what one request alone gets on the
// colocated cluster, measured in the same run (--slo_ttft_factor,
// --slo_tpot_factor); --slo_ttft_ms / --slo_tpot_ms fix them instead. Each
// rate runs --repeats times (fresh prompts each time) and the medians are
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
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
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
ABSL_FLAG(std::vector<std::string>, request_rate,
          std::vector<std::string>({"0.5", "1", "1.5", "2"}),
          "request rates to sweep (requests/s)");
ABSL_FLAG(int32_t, num_requests, 20, "requests per rate and repeat");
ABSL_FLAG(int32_t, repeats, 3, "runs per rate (medians reported)");
ABSL_FLAG(int32_t, prompt_tokens, 128, "mean prompt length (uniform +-50%)");
ABSL_FLAG(int32_t, output_tokens, 96, "mean output length (uniform +-50%)");
ABSL_FLAG(double, burstiness, 1.0, "gamma shape of arrivals (1 = Poisson)");
ABSL_FLAG(double, slo_ttft_factor, 5.0,
          "TTFT SLO = this x one request's TTFT on the colocated cluster");
ABSL_FLAG(double, slo_tpot_factor, 3.0,
          "TPOT SLO = this x one request's TPOT on the colocated cluster");
ABSL_FLAG(double, slo_ttft_ms, 0, "fixed TTFT SLO (overrides the factor)");
ABSL_FLAG(double, slo_tpot_ms, 0, "fixed TPOT SLO (overrides the factor)");
ABSL_FLAG(int32_t, threads, 1, "forward-pass threads per worker");
ABSL_FLAG(std::string, json, "", "write the comparison here");

namespace pdserve::bench {
namespace {

using json = nlohmann::json;

struct Config {
  std::string name;  // "disaggregated", "colocated"
  cli::LocalClusterOptions options;
  std::string cores;  // as printed
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

// One worker per core, in the same order in both configurations: worker i
// of P + D gets core i % cores. The router (and this load generator) are
// not pinned: they share the cores with the workers, equally in both.
std::vector<Config> Configs(const std::vector<int>& cpus) {
  const int p = absl::GetFlag(FLAGS_prefill), d = absl::GetFlag(FLAGS_decode);
  cli::LocalClusterOptions base;
  base.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  base.model_path = absl::GetFlag(FLAGS_model).empty()
                        ? model::DefaultModelPath()
                        : absl::GetFlag(FLAGS_model);
  base.worker_args = {absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
                      "--kv_cache_mb=256"};
  base.startup_timeout = absl::Seconds(120);
  Config disagg{"disaggregated", base, ""};
  disagg.options.num_prefill = p;
  disagg.options.num_decode = d;
  Config coloc{"colocated", base, ""};
  coloc.options.num_prefill = 0;
  coloc.options.num_decode = 0;
  coloc.options.num_colocated = p + d;
  std::vector<std::string> disagg_names, coloc_names;
  for (int i = 0; i < p; ++i)
    disagg_names.push_back(absl::StrCat("prefill-", i));
  for (int i = 0; i < d; ++i)
    disagg_names.push_back(absl::StrCat("decode-", i));
  for (int i = 0; i < p + d; ++i) {
    coloc_names.push_back(absl::StrCat("colocated-", i));
  }
  for (auto [config, names] :
       {std::pair{&disagg, &disagg_names}, std::pair{&coloc, &coloc_names}}) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < names->size(); ++i) {
      const int cpu = cpus[i % cpus.size()];
      config->options.process_cpus[(*names)[i]] = {cpu};
      shown.push_back(absl::StrCat((*names)[i], "->cpu", cpu));
    }
    config->cores = absl::StrCat(absl::StrJoin(shown, ", "),
                                 "; router and load generator unpinned");
  }
  // Colocated first: its lone request sets the SLOs.
  return {coloc, disagg};
}

loadgen::WorkloadOptions Workload(int num_requests, uint64_t seed) {
  loadgen::WorkloadOptions w;
  w.kind = loadgen::WorkloadKind::kUniform;
  w.num_requests = num_requests;
  w.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  w.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  w.range_ratio = 0.5;
  w.seed = seed;
  return w;
}

double Median(std::vector<double> v) { return loadgen::Percentile(v, 0.5); }

// One request at a time: what a request gets from an idle cluster.
struct Unloaded {
  double ttft_ms = 0, tpot_ms = 0;
};
// The workload's mean lengths exactly; every one of the five must succeed
// (a baseline from failures would make every SLO 0, that is none).
absl::StatusOr<Unloaded> MeasureUnloaded(loadgen::Target& target) {
  loadgen::WorkloadOptions w = Workload(5, 777);
  w.kind = loadgen::WorkloadKind::kFixed;
  PD_ASSIGN_OR_RETURN(std::vector<loadgen::BenchRequest> requests,
                      loadgen::MakeWorkload(w));
  std::vector<double> ttft, tpot;
  for (const loadgen::BenchRequest& r : requests) {
    const loadgen::RequestRecord rec =
        target.Send(r, absl::Now(), absl::Minutes(2));
    if (!rec.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "a request alone failed: ", rec.error_kind, ": ", rec.error));
    }
    ttft.push_back(absl::ToDoubleMilliseconds(rec.ttft));
    tpot.push_back(absl::ToDoubleMilliseconds(rec.tpot()));
  }
  return Unloaded{Median(ttft), Median(tpot)};
}

struct RatePoint {
  double rate = 0;
  double goodput = 0, attainment = 0, throughput = 0;
  double p99_ttft = 0, p99_tpot = 0, p50_ttft = 0, p50_tpot = 0;
  int64_t failed = 0;
};

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
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<Config> configs = Configs(cpus);
  loadgen::Slo slo{absl::GetFlag(FLAGS_slo_ttft_ms),
                   absl::GetFlag(FLAGS_slo_tpot_ms)};
  json out = {{"model", configs[0].options.model_path},
              {"prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens)},
              {"output_tokens", absl::GetFlag(FLAGS_output_tokens)},
              {"num_requests", absl::GetFlag(FLAGS_num_requests)},
              {"repeats", repeats},
              {"burstiness", absl::GetFlag(FLAGS_burstiness)}};
  std::map<std::string, std::vector<RatePoint>> points;
  for (Config& config : configs) {
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
    const absl::StatusOr<Unloaded> measured = MeasureUnloaded(**target);
    if (!measured.ok()) {
      absl::FPrintF(stderr, "%s: %s\n", config.name,
                    measured.status().ToString());
      return 1;
    }
    const Unloaded alone = *measured;
    absl::FPrintF(stderr, "   one request alone: TTFT %.1f ms, TPOT %.2f ms\n",
                  alone.ttft_ms, alone.tpot_ms);
    if (slo.ttft_ms <= 0) {
      slo.ttft_ms = absl::GetFlag(FLAGS_slo_ttft_factor) * alone.ttft_ms;
    }
    if (slo.tpot_ms <= 0) {
      slo.tpot_ms = absl::GetFlag(FLAGS_slo_tpot_factor) * alone.tpot_ms;
    }
    json report = {{"label", config.name},
                   {"target", (*target)->Describe()},
                   {"cores", config.cores},
                   {"unloaded_ttft_ms", alone.ttft_ms},
                   {"unloaded_tpot_ms", alone.tpot_ms},
                   {"runs", json::array()}};
    for (size_t ri = 0; ri < rates.size(); ++ri) {
      std::vector<double> good, attain, thr, p99t, p99p, p50t, p50p;
      int64_t failed = 0;
      for (int rep = 0; rep < repeats; ++rep) {
        // The same prompts and arrivals for both configurations.
        const uint64_t seed = 1000 * ri + rep;
        auto requests = loadgen::MakeWorkload(
            Workload(absl::GetFlag(FLAGS_num_requests), seed));
        loadgen::LoadOptions options;
        options.request_rate = rates[ri];
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
        p50t.push_back(s.ttft_ms.p50);
        p50p.push_back(s.tpot_ms.p50);
        failed += s.failed;
        json run = loadgen::ToJson(s);
        run["repeat"] = rep;
        run["requests"] = loadgen::ToJson(result.records);
        // The plot draws one CDF per rate: the first repeat's.
        if (rep == 0) report["runs"].push_back(std::move(run));
      }
      RatePoint p{rates[ri],    Median(good), Median(attain),
                  Median(thr),  Median(p99t), Median(p99p),
                  Median(p50t), Median(p50p), failed};
      absl::FPrintF(stderr,
                    "   rate %5.2f/s: goodput %5.2f/s (%3.0f%% met SLO), "
                    "p99 TTFT %7.0f ms, p99 TPOT %6.1f ms, %d failed\n",
                    p.rate, p.goodput, 100 * p.attainment, p.p99_ttft,
                    p.p99_tpot, p.failed);
      points[config.name].push_back(p);
      // The medians over the repeats, beside the first repeat's own
      // figures (bench/plot_serving.py draws the medians when present).
      report["runs"].back()["median"] = {{"goodput", p.goodput},
                                         {"request_throughput", p.throughput},
                                         {"slo_attainment", p.attainment},
                                         {"p99_ttft_ms", p.p99_ttft},
                                         {"p99_tpot_ms", p.p99_tpot},
                                         {"repeats", repeats}};
    }
    if (const absl::Status stopped = (*cluster)->Stop(absl::Seconds(20));
        !stopped.ok()) {
      absl::FPrintF(stderr, "%s cluster stopped uncleanly: %s\n", config.name,
                    stopped.ToString());
    }
    out[config.name] = report;
  }

  absl::PrintF(
      "\nDisaggregated (%d prefill + %d decode) vs colocated (%d), %s\n"
      "SLO: TTFT <= %.0f ms, TPOT <= %.1f ms; uniform prompts %d +-50%%, "
      "outputs %d +-50%%; medians of %d runs of %d requests\n",
      absl::GetFlag(FLAGS_prefill), absl::GetFlag(FLAGS_decode),
      absl::GetFlag(FLAGS_prefill) + absl::GetFlag(FLAGS_decode),
      configs[1].cores, slo.ttft_ms, slo.tpot_ms,
      absl::GetFlag(FLAGS_prompt_tokens), absl::GetFlag(FLAGS_output_tokens),
      repeats, absl::GetFlag(FLAGS_num_requests));
  absl::PrintF("%8s | %22s | %22s | %22s | %22s | %6s\n", "rate/s",
               "goodput/s disagg coloc", "attainment disagg coloc",
               "p99 TTFT ms dis col", "p99 TPOT ms dis col", "ratio");
  json table = json::array();
  const auto& d = points["disaggregated"];
  const auto& c = points["colocated"];
  // "inf" when only the disaggregated cluster met the SLOs at all.
  auto ratio_of = [](double a, double b) {
    return b > 0 ? a / b : (a > 0 ? INFINITY : 0.0);
  };
  auto ratio_json = [](double r) {
    return std::isfinite(r) ? json(r) : json("inf");
  };
  for (size_t i = 0; i < rates.size(); ++i) {
    const double ratio = ratio_of(d[i].goodput, c[i].goodput);
    absl::PrintF(
        "%8.2f | %10.2f %11.2f | %9.0f%% %11.0f%% | %10.0f %11.0f | %10.1f "
        "%11.1f | %6.2f\n",
        rates[i], d[i].goodput, c[i].goodput, 100 * d[i].attainment,
        100 * c[i].attainment, d[i].p99_ttft, c[i].p99_ttft, d[i].p99_tpot,
        c[i].p99_tpot, ratio);
    table.push_back({{"rate", rates[i]},
                     {"goodput_disaggregated", d[i].goodput},
                     {"goodput_colocated", c[i].goodput},
                     {"goodput_ratio", ratio_json(ratio)},
                     {"attainment_disaggregated", d[i].attainment},
                     {"attainment_colocated", c[i].attainment},
                     {"p99_ttft_ms_disaggregated", d[i].p99_ttft},
                     {"p99_ttft_ms_colocated", c[i].p99_ttft},
                     {"p99_tpot_ms_disaggregated", d[i].p99_tpot},
                     {"p99_tpot_ms_colocated", c[i].p99_tpot},
                     {"failed_disaggregated", d[i].failed},
                     {"failed_colocated", c[i].failed}});
  }
  // Goodput at the best rate of each: the usual one-number summary.
  double best_d = 0, best_c = 0;
  for (size_t i = 0; i < rates.size(); ++i) {
    best_d = std::max(best_d, d[i].goodput);
    best_c = std::max(best_c, c[i].goodput);
  }
  absl::PrintF(
      "max goodput: disaggregated %.2f/s, colocated %.2f/s, ratio %.2f\n",
      best_d, best_c, ratio_of(best_d, best_c));
  out["slo_ttft_ms"] = slo.ttft_ms;
  out["slo_tpot_ms"] = slo.tpot_ms;
  out["table"] = table;
  out["max_goodput_ratio"] = ratio_json(ratio_of(best_d, best_c));
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream(json_path) << loadgen::DumpJson(out) << "\n";
    for (const char* name : {"disaggregated", "colocated"}) {
      const std::string path =
          std::filesystem::path(json_path).replace_extension(
              absl::StrCat(".", name, ".json"));
      std::ofstream(path) << loadgen::DumpJson(out[name]) << "\n";
    }
    absl::FPrintF(stderr, "wrote %s (and its .disaggregated/.colocated.json)\n",
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
