// pdctl profile: measures what one prefill worker and one decode worker of
// a model can do on this machine, and writes the capacity profile the
// planner reads (planner/capacity_profile.h; docs/planner.md, "Measuring a
// profile").
//
// RunProfile starts its own local cluster (router + 1 prefill + 1 decode
// worker, real processes, loopback ports chosen free), drives it through
// the router's client API as any client would, and stops it. Every figure
// is measured at the client, so it holds what a client sees: the router,
// gRPC, the KV transfer and the engine loop, not the forward pass alone.
//
// Prompts are token ids (GenerateRequest.token_ids, used verbatim), so a
// prompt of L tokens is exactly L tokens whatever the tokenizer. Their
// first tokens encode a serial number, so no two requests share a first
// KV block and none hits the prefix cache unless it is meant to.
//
// What is measured:
//   - prefill, per prompt length L:
//       ttft_s        the median, over `lone_runs` requests sent one at a
//                     time to the idle cluster (max_tokens 1), of send ->
//                     first token;
//       tokens_per_s  `burst` requests of L tokens sent at once; with T the
//                     send -> last first token time of the burst,
//                     (burst - 1) * L / (T - ttft_s). The lone TTFT is the
//                     burst's first prompt plus the pipeline's latency, so
//                     T - ttft_s is the worker's busy time for the other
//                     burst - 1 prompts, however it batches them (a worker
//                     that computes several prompts in one pass answers
//                     them together, so the gap between the burst's first
//                     and last answers would miss the first pass's work).
//   - decode, per batch b and context c: b streams at once of c-token
//     prompts (a shared prefix, cached by one warm-up request first, plus a
//     unique tail of at most one KV block, so that prefill is short), with
//     ignore_eos. Each token's arrival is recorded per stream; a stream is
//     cancelled once it has received `decode_tokens` tokens after every
//     stream had its first (its max_tokens lets it run that far past a
//     slow start, within the model's context and its share of the KV pool),
//     and the next cell waits until the decode worker holds no sequence.
//     itl_s is the median gap between consecutive tokens of a stream over
//     the window where all b streams run (from the last stream's first
//     token to the first stream's last token). A window with too few gaps
//     is an error naming the cell, not a number. The steps in the window
//     run at contexts c + (tokens generated so far): c is the prompt.
//     A larger batch measured faster than a smaller one (noise: the parser
//     refuses such a grid) is raised to the smaller one's figure, a running
//     maximum along the batch axis; each raise is logged and listed in the
//     JSON's "notes".
//   - load_time_s, per pool: after the grids, one more worker of that pool
//     is started (LocalCluster::AddWorker) and timed from launch until the
//     router lists it as SERVING (model loaded, registered).
//   - max_batch: the decode worker's --max_running (64 unless the worker
//     args set it as --max_running=N). kv_capacity_tokens: the decode
//     worker's pool as it registered it (ListWorkers: KvLayout.num_blocks x
//     block_size_tokens).
//
// Thread-safety: RunProfile runs one profile at a time from one thread (it
// starts its own client threads). The pure helpers are stateless.
#ifndef PDSERVE_CLI_PROFILE_H_
#define PDSERVE_CLI_PROFILE_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/local_cluster.h"
#include "planner/capacity_profile.h"

namespace pdserve::cli {

struct ProfileOptions {
  // bin_dir, model_path, work_dir, worker_args and pool_args ("prefill",
  // "decode") are the caller's; RunProfile sets the pool sizes (1 + 1) and
  // loopback ports of its own.
  LocalClusterOptions cluster;
  std::vector<int> prompt_lengths = {32, 128, 512, 1536};
  int lone_runs = 3;
  int burst = 6;
  std::vector<int> batch_sizes = {1, 4, 16, 64};
  std::vector<int> context_lengths = {16, 512, 1536};
  int decode_tokens = 64;
  std::string cost_unit = "workers";
  absl::Duration request_timeout = absl::Seconds(300);
  // Seeds the prompts' token ids past their serial numbers.
  uint64_t seed = 1;
  // Polled between requests; true stops the profile (CANCELLED). Unset:
  // never.
  std::function<bool()> interrupted;
  // The date written into "source"; empty: today (UTC).
  std::string date;
};

// One decode cell's measurement.
struct DecodeCell {
  int batch = 0;
  int context = 0;
  double itl_s = 0;     // as measured, before the running maximum
  int window_gaps = 0;  // gaps the median is taken over
  double window_s = 0;  // the window's length
};

struct ProfileResult {
  std::string model, hardware, source, cost_unit;
  double prefill_load_time_s = 0, decode_load_time_s = 0;
  std::vector<planner::PrefillPoint> prefill;
  int max_batch = 0;
  double kv_capacity_tokens = 0;
  std::vector<int> batch_sizes, context_lengths;
  std::vector<std::vector<double>> itl_s;  // [batch][context], monotone
  std::vector<DecodeCell> cells;           // as measured
  std::vector<std::string> notes;          // grid cuts, monotonicity raises
  double total_s = 0;
};

// Starts the cluster, measures, stops it. INVALID_ARGUMENT for a bad grid
// (empty, not positive, nothing left after the caps); NOT_FOUND for a model
// file that does not exist; the cluster's start error (with the failed
// process's log) when it does not start; an error naming the prompt length
// or decode cell whose requests failed or whose window was too short;
// CANCELLED when `interrupted` said so. The cluster is stopped (its
// processes killed if they do not stop) on every path. Progress, each
// cell's figure and the total time go to `log`.
absl::StatusOr<ProfileResult> RunProfile(const ProfileOptions& options,
                                         std::ostream& log);

// The profile JSON (planner/capacity_profile.h's format, plus "notes" and
// per-cell "measurement" details the parser ignores). RunProfile's results
// always pass CapacityProfile::Parse; ValidatedProfileJson checks it.
std::string ProfileJson(const ProfileResult& result);
absl::StatusOr<std::string> ValidatedProfileJson(const ProfileResult& result);

// ---- The pure parts, exposed for tests ----------------------------------

// Token ids a prompt is drawn from: [first, end).
struct TokenRange {
  uint32_t first = 0;
  uint32_t end = 0;
};

// The range for a vocabulary: past the first 256 ids (special and byte
// tokens in most vocabularies) when the vocabulary is large, its upper half
// when it is small. The ids' content does not change a forward pass's cost.
TokenRange PromptTokenRange(uint32_t vocab_size);

// `length` ids in `range`: the first ones spell `serial` (base
// range.end - range.first, least significant first, as many digits as
// kSerialDigits or the length allows), the rest drawn from `rng`. Distinct
// serials give distinct leading tokens, so two prompts share no KV block.
inline constexpr int kSerialDigits = 4;
std::vector<uint32_t> MakePromptTokens(uint64_t serial, int length,
                                       TokenRange range, std::mt19937_64& rng);

double Median(std::vector<double> values);

// Prefill busy throughput from a burst (see the header comment):
// (burst - 1) * prompt_tokens / (burst_last_ttft_s - lone_ttft_s).
// INVALID_ARGUMENT when the burst's last answer came no later than a lone
// prompt's (no busy time to measure: a burst too small to queue).
absl::StatusOr<double> BurstTokensPerSecond(int prompt_tokens, int burst,
                                            double lone_ttft_s,
                                            double burst_last_ttft_s);

// One stream's tokens as they arrived: chunk i came at times_s[i] (any
// common origin) carrying tokens[i] tokens (>= 1). The first chunk holds
// the first token.
struct TokenArrivals {
  std::vector<double> times_s;
  std::vector<int> tokens;
};

struct SteadyItl {
  double itl_s = 0;
  int gaps = 0;
  double window_start_s = 0, window_end_s = 0;
};

// The median inter-token gap over the window where every stream runs:
// [latest first-chunk time, earliest last-chunk time]. A chunk of n tokens
// counts as n gaps of (its time - the previous chunk's) / n; only gaps whose
// two chunks both lie in the window count. INVALID_ARGUMENT (saying how
// many gaps there were and how many it needs) when fewer than
// max(kMinWindowGaps, kMinWindowSteps * streams) gaps lie in the window, or
// a stream has no tokens.
inline constexpr int kMinWindowGaps = 8;
inline constexpr int kMinWindowSteps = 3;
absl::StatusOr<SteadyItl> SteadyStateItl(
    const std::vector<TokenArrivals>& streams);

// Makes each column of itl_s[batch][context] non-decreasing in batch by a
// running maximum; returns one line per value raised ("batch 4, context
// 128: 0.0101 s raised to 0.0104 s (batch 1's)").
std::vector<std::string> EnforceNonDecreasingInBatch(
    const std::vector<int>& batch_sizes, const std::vector<int>& contexts,
    std::vector<std::vector<double>>* itl_s);

// "MODEL NAME (N threads)" from /proc/cpuinfo's text; "unknown CPU" parts
// when absent.
std::string CpuDescription(const std::string& cpuinfo);

// The value of the last --NAME=V in `args`, or `fallback`.
int LastIntFlag(const std::vector<std::string>& args, const std::string& name,
                int fallback);

// Parses "32,128" (as absl's vector<string> flag gives it) into positive
// ints; INVALID_ARGUMENT naming `flag` for an empty list, a non-number or a
// value <= 0. The result is sorted and without duplicates.
absl::StatusOr<std::vector<int>> ParseGrid(const std::string& flag,
                                           const std::vector<std::string>& v);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_PROFILE_H_
