// Workloads for the load generator (pdctl bench): the requests a benchmark
// sends, as prompt token ids and output lengths, plus their arrival times
// when a trace dictates them.
//
// Prompts are token ids (not text) so that a request's length is exact on
// any server that takes OpenAI token-id prompts (pdserve, vLLM, SGLang) and
// needs no tokenizer here. Ids are drawn from [min_token_id, vocab_size),
// by default away from the special tokens at the start of GGUF
// vocabularies.
//
//   fixed          every prompt prompt_tokens long, every output
//                  output_tokens long;
//   uniform        lengths uniform in [(1 - range_ratio) x, (1 + range_ratio)
//                  x] around those (vLLM's random dataset);
//   shared_prefix  num_prefixes system prompts of prefix_tokens each; request
//                  i starts with prefix i % num_prefixes and adds
//                  prompt_tokens of its own (SGLang's generated-shared-prefix);
//   trace          a JSONL trace: one object per line with "timestamp" (ms
//                  since the trace began), "input_length", "output_length",
//                  and optionally "hash_ids" (Mooncake's format: each id
//                  names a block of trace_block_tokens prompt tokens, equal
//                  ids are equal blocks, so prefix reuse is replayed).
//
// Everything is a function of the options and the seed: two runs with the
// same options send the same requests.
#ifndef PDSERVE_LOADGEN_WORKLOAD_H_
#define PDSERVE_LOADGEN_WORKLOAD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::loadgen {

struct BenchRequest {
  int64_t index = 0;
  std::vector<uint32_t> prompt;
  int32_t output_tokens = 0;
  // Set for trace replay: when to send it, from the start of the run.
  std::optional<absl::Duration> arrival;
};

enum class WorkloadKind { kFixed, kUniform, kSharedPrefix, kTrace };

// "fixed", "uniform", "shared_prefix", "trace".
absl::StatusOr<WorkloadKind> ParseWorkloadKind(const std::string& name);

struct WorkloadOptions {
  WorkloadKind kind = WorkloadKind::kFixed;
  int32_t num_requests = 100;
  int32_t prompt_tokens = 256;
  int32_t output_tokens = 64;
  double range_ratio = 0.5;  // uniform only, in [0, 1)
  // Uniform only: the outputs' own range ratio; < 0: range_ratio.
  double output_range_ratio = -1;
  int32_t num_prefixes = 4;  // shared_prefix only
  int32_t prefix_tokens = 512;
  std::string trace_path;  // trace only
  int32_t trace_block_tokens = 16;
  // Trace time runs this many times faster (2: twice the rate).
  double trace_speedup = 1.0;
  int32_t vocab_size = 49152;
  int32_t min_token_id = 256;
  uint64_t seed = 0;
};

// INVALID_ARGUMENT for bad options; for a trace, NOT_FOUND or
// INVALID_ARGUMENT naming the file and line that is wrong. A trace yields
// the earliest num_requests requests when num_requests > 0.
absl::StatusOr<std::vector<BenchRequest>> MakeWorkload(
    const WorkloadOptions& options);

// A synthetic trace shaped like public chat traces (ShareGPT, Azure LLM
// inference, Mooncake): log-normal prompt and output lengths (long right
// tails, clipped to [min, max]), Poisson arrivals at `rate` requests/s, and
// one of a few shared system prompts (as hash_ids) on about half the
// requests. JSONL, one request per line, readable by MakeWorkload.
struct SyntheticTraceOptions {
  int32_t num_requests = 200;
  double rate = 2.0;
  double prompt_median = 200;  // tokens
  double prompt_sigma = 0.9;   // of the log
  double output_median = 80;
  double output_sigma = 0.8;
  int32_t min_tokens = 4;
  int32_t max_prompt_tokens = 1500;
  int32_t max_output_tokens = 400;
  int32_t block_tokens = 16;
  uint64_t seed = 0;
};
std::string SyntheticChatTrace(const SyntheticTraceOptions& options);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_LOADGEN_WORKLOAD_H_
