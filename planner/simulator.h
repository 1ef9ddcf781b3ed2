// A discrete-event simulator of a disaggregated cluster against a capacity
// profile: how a scaling policy (the planner, a fixed size, an oracle)
// would serve a trace, at a scale this machine cannot run.
//
// The model (docs/planner.md): each prefill worker serves prompts FCFS,
// busy profile.PrefillSeconds(prompt) each, and the router sends a prompt
// to the worker with the least queued work; its TTFT adds the profile's
// lone-prompt overhead. Each decode worker runs continuous batching: a
// step of profile.DecodeStepSeconds(batch, mean context) gives every
// running stream one token; streams join at step boundaries while the
// batch is under max_batch and the KV cache holds their context; the
// router picks the decode worker with the fewest streams. A worker asked
// for becomes ready after the profile's load_time_s; a worker removed
// takes no new work and leaves when its last request ends (drain). Worker
// time counts from start to leaving, over the trace's span.
//
// A policy is called at every interval boundary with the last interval's
// observation (what a live planner reads from Prometheus) and returns the
// replicas to run. Not thread-safe; Simulate is a pure function of its
// arguments (deterministic).
#ifndef PDSERVE_PLANNER_SIMULATOR_H_
#define PDSERVE_PLANNER_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "planner/capacity_profile.h"
#include "planner/planner.h"

namespace pdserve::planner {

struct SimRequest {
  double arrival_s = 0;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
};

// What to run at each boundary: (prefill, decode) replicas wanted.
using SimPolicy =
    std::function<std::pair<int, int>(const Observation& last_interval)>;

struct SimOptions {
  double interval_s = 30;
  // Per-request SLO: TTFT and TPOT (mean gap after the first token).
  double ttft_target_s = 6;
  double itl_target_s = 0.05;
  double quantile = 0.99;  // of the observed latencies a policy sees
  int initial_prefill = 1, initial_decode = 1;  // ready at time 0
  // Simulate one phase only (fixed-size sweeps): prefill_only ends every
  // request at its first token; decode_only starts decode at arrival plus
  // the lone-prompt TTFT. Attainment then counts that phase's target only.
  bool prefill_only = false, decode_only = false;
};

struct SimInterval {
  double start_s = 0;
  double arrival_rate = 0;
  int prefill_configured = 0, prefill_ready = 0, prefill_alive = 0;
  int decode_configured = 0, decode_ready = 0, decode_alive = 0;
  double ttft_p99_s = 0, itl_p99_s = 0;  // of tokens in the interval
  double attainment = 1;                 // of requests that arrived in it
};

struct SimResult {
  int64_t requests = 0;
  double attainment = 0;       // both targets met
  double ttft_attainment = 0;  // TTFT target alone
  double itl_attainment = 0;   // TPOT target alone
  double ttft_p50_s = 0, ttft_p99_s = 0;
  double itl_p50_s = 0, itl_p99_s = 0;  // every gap between two tokens
  double tpot_p99_s = 0;
  double span_s = 0;  // the trace's span (first to last arrival, from 0)
  double prefill_worker_hours = 0, decode_worker_hours = 0;
  double cost_hours = 0;  // worker-hours times the profile's costs
  int peak_prefill = 0, peak_decode = 0;  // alive at once
  std::vector<SimInterval> timeline;
};

SimResult Simulate(const CapacityProfile& profile,
                   const std::vector<SimRequest>& requests,
                   const SimOptions& options, const SimPolicy& policy);

// A policy that never changes the initial size.
SimPolicy FixedPolicy();

// The oracle: knows each interval's true load (arrivals and lengths of the
// requests that arrive in it) and sizes every interval with the planner's
// model (SizePrefill/SizeDecode at the targets), asking early enough that
// workers are ready when their interval starts: at each boundary, the
// largest need of the intervals a worker started now could still serve
// or must already serve. Returns the policy and the size for time 0.
struct OracleSchedule {
  std::vector<std::pair<int, int>> need;  // per interval
  std::pair<int, int> initial;
};
OracleSchedule MakeOracleSchedule(const CapacityProfile& profile,
                                  const std::vector<SimRequest>& requests,
                                  const SimOptions& options, int max_replicas);
SimPolicy OraclePolicy(const CapacityProfile& profile,
                       const OracleSchedule& schedule,
                       const SimOptions& options);

}  // namespace pdserve::planner

#endif  // PDSERVE_PLANNER_SIMULATOR_H_
