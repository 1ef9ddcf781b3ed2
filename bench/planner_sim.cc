// planner_sim: the SLO planner judged on a trace at a scale this machine
// cannot run (docs/planner.md).
//
//   planner_sim --make_trace=trace.jsonl [--duration_s ... --seed ...]
//       Writes a synthetic chat trace (loadgen's generator: log-normal
//       lengths, shared system prompts as hash_ids) whose arrival rate
//       follows a diurnal curve from --low_rate to --high_rate and back,
//       with --bursts bursts of --burst_factor times the rate. Mooncake's
//       JSONL format.
//   planner_sim --trace=trace.jsonl --profile=... --json_out=...
//       Replays a Mooncake-format trace (read by loadgen) against the
//       capacity profile: the planner (deciding every --interval_s), the
//       planner from a cold 1+1 cluster, an oracle that knows each
//       interval's load, the cheapest fixed cluster that meets --goal, and
//       the best fixed cluster of the planner's worker-hours. Prints the
//       table and writes JSON (with per-interval timelines for the plot).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "loadgen/workload.h"
#include "nlohmann/json.hpp"
#include "planner/capacity_profile.h"
#include "planner/planner.h"
#include "planner/simulator.h"

ABSL_FLAG(std::string, make_trace, "", "Write a synthetic diurnal trace here");
ABSL_FLAG(double, duration_s, 7200, "Trace span in seconds (one 'day')");
ABSL_FLAG(double, low_rate, 4, "Request rate at the start and end, req/s");
ABSL_FLAG(double, high_rate, 60, "Request rate at the diurnal peak, req/s");
ABSL_FLAG(int32_t, bursts, 4, "Bursts over the span");
ABSL_FLAG(double, burst_factor, 1.5, "Rate multiplier during a burst");
ABSL_FLAG(double, burst_s, 240, "Length of a burst in seconds");
ABSL_FLAG(uint64_t, seed, 7, "Seed of the synthetic trace");

ABSL_FLAG(std::string, trace, "", "Mooncake-format JSONL trace to replay");
ABSL_FLAG(std::string, profile, "planner/profiles/smollm2-135m-q4_1-cpu1.json",
          "Capacity profile");
ABSL_FLAG(double, ttft_slo_s, 6,
          "TTFT target (per request; p99 for the planner)");
ABSL_FLAG(double, itl_slo_s, 0.05,
          "ITL target: per request its TPOT; p99 of gaps for the planner");
ABSL_FLAG(double, interval_s, 30, "Planner interval, seconds of trace time");
ABSL_FLAG(double, goal, 0.99, "SLO attainment a fixed cluster must reach");
ABSL_FLAG(double, budget, 0,
          "Planner budget in the profile's cost unit (0: none)");
ABSL_FLAG(int32_t, max_replicas, 2000, "Per pool, for every policy");
ABSL_FLAG(std::string, json_out, "", "Write the results here");
ABSL_FLAG(std::string, decisions_out, "",
          "Write the planner's decisions here, one JSON object a line");

namespace pdserve::planner {
namespace {

using json = nlohmann::json;

// The rate at time t: a diurnal cosine from low to high and back, times
// burst_factor inside the bursts.
struct RateCurve {
  double low, high, span;
  std::vector<std::pair<double, double>> bursts;  // [start, end)
  double factor;
  double At(double t) const {
    double r = low + (high - low) * 0.5 *
                         (1 - std::cos(2 * std::numbers::pi * t / span));
    for (const auto& [a, b] : bursts) {
      if (t >= a && t < b) r *= factor;
    }
    return r;
  }
};

int MakeTrace(const std::string& path) {
  RateCurve c{absl::GetFlag(FLAGS_low_rate),
              absl::GetFlag(FLAGS_high_rate),
              absl::GetFlag(FLAGS_duration_s),
              {},
              absl::GetFlag(FLAGS_burst_factor)};
  if (!(c.low > 0) || c.high < c.low || !(c.span > 0) || !(c.factor >= 1)) {
    std::cerr << "planner_sim: need 0 < low_rate <= high_rate, duration_s > 0,"
                 " burst_factor >= 1\n";
    return 2;
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const double burst = absl::GetFlag(FLAGS_burst_s);
  std::uniform_real_distribution<double> where(0.05 * c.span,
                                               0.95 * c.span - burst);
  for (int i = 0; i < absl::GetFlag(FLAGS_bursts); ++i) {
    const double a = where(rng);
    c.bursts.emplace_back(a, a + burst);
  }
  // Cumulative intensity on a 1 s grid; a unit-rate Poisson process
  // mapped through its inverse is a Poisson process of rate c.At(t).
  std::vector<double> cumulative = {0};
  for (double t = 0; t < c.span; t += 1) {
    cumulative.push_back(cumulative.back() + c.At(t + 0.5));
  }
  loadgen::SyntheticTraceOptions options;
  options.num_requests = static_cast<int32_t>(cumulative.back());
  options.rate = 1.0;
  options.seed = absl::GetFlag(FLAGS_seed);
  const std::string unit = loadgen::SyntheticChatTrace(options);
  std::ofstream out(path);
  if (!out) {
    std::cerr << "planner_sim: cannot write " << path << "\n";
    return 1;
  }
  size_t start = 0;
  int64_t written = 0;
  while (start < unit.size()) {
    const size_t end = unit.find('\n', start);
    json line = json::parse(unit.substr(start, end - start));
    start = end + 1;
    const double s = line["timestamp"].get<double>() / 1000;
    if (s >= cumulative.back()) break;
    const size_t i = std::upper_bound(cumulative.begin(), cumulative.end(), s) -
                     cumulative.begin();
    const double t =
        (i - 1) + (s - cumulative[i - 1]) / (cumulative[i] - cumulative[i - 1]);
    line["timestamp"] = std::llround(t * 1000);
    out << line.dump() << "\n";
    ++written;
  }
  std::cerr << "planner_sim: wrote " << written << " requests over " << c.span
            << " s to " << path << " (bursts at";
  for (const auto& [a, b] : c.bursts) std::cerr << " " << std::lround(a);
  std::cerr << " s)\n";
  return 0;
}

json ResultJson(const std::string& name, const SimResult& r, double wall_s,
                bool timeline) {
  json j = {{"policy", name},
            {"requests", r.requests},
            {"attainment", r.attainment},
            {"ttft_attainment", r.ttft_attainment},
            {"itl_attainment", r.itl_attainment},
            {"ttft_p50_s", r.ttft_p50_s},
            {"ttft_p99_s", r.ttft_p99_s},
            {"itl_p50_s", r.itl_p50_s},
            {"itl_p99_s", r.itl_p99_s},
            {"tpot_p99_s", r.tpot_p99_s},
            {"prefill_worker_hours", r.prefill_worker_hours},
            {"decode_worker_hours", r.decode_worker_hours},
            {"cost_hours", r.cost_hours},
            {"peak_prefill", r.peak_prefill},
            {"peak_decode", r.peak_decode},
            {"wall_s", wall_s}};
  if (timeline) {
    json t = json::array();
    for (const SimInterval& i : r.timeline) {
      t.push_back({{"t", i.start_s},
                   {"rate", i.arrival_rate},
                   {"prefill", i.prefill_configured},
                   {"prefill_ready", i.prefill_ready},
                   {"decode", i.decode_configured},
                   {"decode_ready", i.decode_ready},
                   {"ttft_p99_s", i.ttft_p99_s},
                   {"itl_p99_s", i.itl_p99_s},
                   {"attainment", i.attainment}});
    }
    j["timeline"] = std::move(t);
  }
  return j;
}

int Run() {
  auto profile = CapacityProfile::Load(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    std::cerr << "planner_sim: " << profile.status().message() << "\n";
    return 2;
  }
  loadgen::WorkloadOptions w;
  w.kind = loadgen::WorkloadKind::kTrace;
  w.trace_path = absl::GetFlag(FLAGS_trace);
  w.num_requests = 0;  // all of it
  std::vector<SimRequest> trace;
  {
    auto requests = loadgen::MakeWorkload(w);
    if (!requests.ok()) {
      std::cerr << "planner_sim: " << requests.status().message() << "\n";
      return 2;
    }
    for (const loadgen::BenchRequest& r : *requests) {
      trace.push_back({absl::ToDoubleSeconds(*r.arrival),
                       int32_t(r.prompt.size()), r.output_tokens});
    }
  }
  SimOptions o;
  o.interval_s = absl::GetFlag(FLAGS_interval_s);
  o.ttft_target_s = absl::GetFlag(FLAGS_ttft_slo_s);
  o.itl_target_s = absl::GetFlag(FLAGS_itl_slo_s);
  const double goal = absl::GetFlag(FLAGS_goal);
  const int max_replicas = absl::GetFlag(FLAGS_max_replicas);
  if (!(o.interval_s > 0) || !(o.ttft_target_s > 0) || !(o.itl_target_s > 0)) {
    std::cerr << "planner_sim: interval and targets must be > 0\n";
    return 2;
  }
  const CapacityProfile& p = *profile;
  std::cerr << "planner_sim: " << trace.size() << " requests over "
            << trace.back().arrival_s << " s, profile " << p.model() << "\n";

  auto timed = [&](const SimOptions& opts, const SimPolicy& policy,
                   double* wall) {
    const auto start = std::chrono::steady_clock::now();
    SimResult r = Simulate(p, trace, opts, policy);
    *wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return r;
  };
  json runs = json::object();
  std::vector<std::pair<std::string, SimResult>> table;
  std::vector<double> walls;

  // The oracle.
  const OracleSchedule oracle = MakeOracleSchedule(p, trace, o, max_replicas);
  SimOptions oo = o;
  oo.initial_prefill = oracle.initial.first;
  oo.initial_decode = oracle.initial.second;
  double wall = 0;
  SimResult oracle_result = timed(oo, OraclePolicy(p, oracle, o), &wall);
  runs["oracle"] = ResultJson("oracle", oracle_result, wall, true);
  table.emplace_back("oracle (knows each interval's load)", oracle_result);
  walls.push_back(wall);

  // The planner, from the size an operator would start with (the
  // oracle's for the first minute), and from a cold 1 + 1.
  PlannerOptions po;
  po.ttft_target_s = o.ttft_target_s;
  po.itl_target_s = o.itl_target_s;
  po.interval_s = o.interval_s;
  po.max_prefill = po.max_decode = max_replicas;
  po.budget = absl::GetFlag(FLAGS_budget);
  std::ofstream decisions;
  if (!absl::GetFlag(FLAGS_decisions_out).empty()) {
    decisions.open(absl::GetFlag(FLAGS_decisions_out));
  }
  auto planner_run = [&](const std::string& name, int prefill, int decode,
                         bool log) -> SimResult {
    auto planner = Planner::Create(po, p);
    if (!planner.ok()) {
      std::cerr << "planner_sim: " << planner.status().message() << "\n";
      std::exit(2);
    }
    SimOptions so = o;
    so.initial_prefill = prefill;
    so.initial_decode = decode;
    SimResult r = timed(
        so,
        [&](const Observation& obs) {
          const Decision d = (*planner)->Decide(obs);
          if (log && decisions.is_open()) decisions << d.ToJson() << "\n";
          return std::make_pair(d.prefill.desired, d.decode.desired);
        },
        &wall);
    runs[name] = ResultJson(name, r, wall, true);
    walls.push_back(wall);
    return r;
  };
  const SimResult planned =
      planner_run("planner", oracle.initial.first, oracle.initial.second, true);
  table.emplace_back("planner", planned);
  const SimResult cold = planner_run("planner_cold_start", 1, 1, false);
  table.emplace_back("planner from 1 + 1 (cold start)", cold);

  // Fixed sizes: each pool's attainment alone (the other phase ideal),
  // then the cheapest pair that meets the goal together.
  std::map<int, double> ttft_by_n, itl_by_n;
  auto phase = [&](bool prefill, int n) {
    auto& cache = prefill ? ttft_by_n : itl_by_n;
    if (auto it = cache.find(n); it != cache.end()) return it->second;
    SimOptions so = o;
    so.prefill_only = prefill;
    so.decode_only = !prefill;
    so.initial_prefill = so.initial_decode = n;
    const SimResult r = Simulate(p, trace, so, FixedPolicy());
    return cache[n] = prefill ? r.ttft_attainment : r.itl_attainment;
  };
  auto smallest = [&](bool prefill, double target) {
    int lo = 1, hi = 1;
    while (phase(prefill, hi) < target && hi < max_replicas) {
      lo = hi;
      hi = std::min(max_replicas, hi * 2);
    }
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (phase(prefill, mid) >= target ? hi : lo) = mid;
    }
    return phase(prefill, lo) >= target ? lo : hi;
  };
  std::map<std::pair<int, int>, SimResult> fixed_runs;
  auto fixed = [&](int np, int nd) -> const SimResult& {
    auto key = std::make_pair(np, nd);
    if (auto it = fixed_runs.find(key); it != fixed_runs.end())
      return it->second;
    SimOptions so = o;
    so.initial_prefill = np;
    so.initial_decode = nd;
    return fixed_runs[key] = timed(so, FixedPolicy(), &wall);
  };
  // Each phase must reach more than the goal for the pair to (their
  // misses add up); tighten until the pair meets it.
  int np = smallest(true, 1 - (1 - goal) / 2);
  int nd = smallest(false, 1 - (1 - goal) / 2);
  for (int i = 0; i < 20 && fixed(np, nd).attainment < goal; ++i) {
    const SimResult& r = fixed(np, nd);
    (r.ttft_attainment <= r.itl_attainment ? np : nd) += 1;
  }
  const SimResult best_fixed = fixed(np, nd);
  runs["fixed_best"] = ResultJson(absl::StrCat("fixed ", np, " + ", nd),
                                  best_fixed, wall, false);
  runs["fixed_best"]["prefill"] = np;
  runs["fixed_best"]["decode"] = nd;
  table.emplace_back(absl::StrFormat("fixed %d + %d (cheapest meeting %.0f%%)",
                                     np, nd, 100 * goal),
                     best_fixed);

  // The fixed cluster with the planner's worker-hours, split as well as
  // the per-phase curves allow.
  const double hours = o.interval_s > 0 ? planned.span_s / 3600 : 1;
  const int total =
      std::max(2, static_cast<int>(std::lround((planned.prefill_worker_hours +
                                                planned.decode_worker_hours) /
                                               hours)));
  // Around the cheapest pair's split: the product of the phases'
  // attainments is the pair's to within the requests both miss.
  int best_p = 1;
  double best_score = -1;
  const int around = std::clamp<int>(
      std::lround(double(total) * np / (np + nd)), 1, total - 1);
  for (int a = std::max(1, around - 3); a <= std::min(total - 1, around + 3);
       ++a) {
    const double score = phase(true, a) * phase(false, total - a);
    if (score > best_score) {
      best_score = score;
      best_p = a;
    }
  }
  const SimResult& equal = fixed(best_p, total - best_p);
  runs["fixed_equal_cost"] = ResultJson(
      absl::StrCat("fixed ", best_p, " + ", total - best_p), equal, wall, true);
  runs["fixed_equal_cost"]["prefill"] = best_p;
  runs["fixed_equal_cost"]["decode"] = total - best_p;
  table.emplace_back(
      absl::StrFormat("fixed %d + %d (the planner's worker-hours)", best_p,
                      total - best_p),
      equal);
  json sweep = json::object();
  for (const auto& [n, a] : ttft_by_n)
    sweep["prefill_ttft_attainment"][std::to_string(n)] = a;
  for (const auto& [n, a] : itl_by_n)
    sweep["decode_itl_attainment"][std::to_string(n)] = a;

  // The table.
  std::printf("%-46s %10s %7s %7s %9s %9s %9s %9s %7s %9s\n", "policy",
              "attain", "TTFT", "ITL", "TTFT p99", "TPOT p99", "worker-h",
              "x oracle", "peak", "mean P+D");
  json rows = json::array();
  for (const auto& [name, r] : table) {
    const double x = r.cost_hours / oracle_result.cost_hours;
    std::printf(
        "%-46s %9.2f%% %6.2f%% %6.2f%% %8.2fs %7.1fms %9.1f %9.2f %3d+%-3d "
        "%4.1f+%-4.1f\n",
        name.c_str(), 100 * r.attainment, 100 * r.ttft_attainment,
        100 * r.itl_attainment, r.ttft_p99_s, 1000 * r.tpot_p99_s,
        r.prefill_worker_hours + r.decode_worker_hours, x, r.peak_prefill,
        r.peak_decode, r.prefill_worker_hours / hours,
        r.decode_worker_hours / hours);
    rows.push_back(
        {{"policy", name},
         {"attainment", r.attainment},
         {"worker_hours", r.prefill_worker_hours + r.decode_worker_hours},
         {"cost_hours", r.cost_hours},
         {"x_oracle", x}});
  }
  double max_wall = 0;
  for (double w2 : walls) max_wall = std::max(max_wall, w2);
  std::printf("one simulation of %zu requests takes at most %.2f s here\n",
              trace.size(), max_wall);

  const std::string out = absl::GetFlag(FLAGS_json_out);
  if (!out.empty()) {
    double rate_max = 0;
    for (const SimInterval& i : planned.timeline)
      rate_max = std::max(rate_max, i.arrival_rate);
    json j = {{"trace",
               {{"path", absl::GetFlag(FLAGS_trace)},
                {"requests", trace.size()},
                {"span_s", planned.span_s},
                {"peak_interval_rate", rate_max}}},
              {"profile",
               {{"path", absl::GetFlag(FLAGS_profile)},
                {"model", p.model()},
                {"hardware", p.hardware()},
                {"source", p.source()},
                {"cost_unit", p.cost_unit()},
                {"load_time_s", p.decode_load_time_s()}}},
              {"targets",
               {{"ttft_s", o.ttft_target_s},
                {"itl_s", o.itl_target_s},
                {"interval_s", o.interval_s},
                {"goal", goal}}},
              {"table", rows},
              {"runs", runs},
              {"fixed_sweep", sweep},
              {"max_simulation_wall_s", max_wall}};
    std::ofstream(out) << j.dump(1) << "\n";
    std::cerr << "planner_sim: wrote " << out << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::planner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_make_trace).empty()) {
    return pdserve::planner::MakeTrace(absl::GetFlag(FLAGS_make_trace));
  }
  if (absl::GetFlag(FLAGS_trace).empty()) {
    std::cerr << "planner_sim: give --make_trace=PATH or --trace=PATH\n";
    return 2;
  }
  return pdserve::planner::Run();
}
