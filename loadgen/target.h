// Targets for the load generator: where a benchmark request goes and how its
// answer is timed.
//
//   grpc://HOST:PORT   the router's Generation service (token-id prompt,
//                      streamed chunks; tokens counted exactly per chunk);
//   http://HOST:PORT   any OpenAI-compatible server: POST /v1/completions
//                      with a token-id prompt, "stream": true,
//                      "ignore_eos": true and stream_options.include_usage,
//                      so pdserve, vLLM and SGLang are measured alike.
//
// Timing follows vLLM's benchmark: TTFT is send -> first chunk carrying
// output; ITLs are the gaps between output-carrying chunks; TPOT is
// (e2e - TTFT) / (output tokens - 1).
//
// Thread-safety: Send may be called from many threads at once.
#ifndef PDSERVE_LOADGEN_TARGET_H_
#define PDSERVE_LOADGEN_TARGET_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loadgen/workload.h"

namespace pdserve::loadgen {

struct RequestRecord {
  int64_t index = 0;
  int32_t prompt_tokens = 0;
  int32_t expected_output_tokens = 0;
  int32_t output_tokens = 0;  // received
  absl::Duration sent_at;     // since the run began
  absl::Duration ttft = absl::InfiniteDuration();
  absl::Duration e2e = absl::InfiniteDuration();
  std::vector<double> itl_ms;
  // Where the server says the time went (gRPC targets, which ask the router
  // for its timing breakdown): queue, prefill compute, and KV transfer
  // not hidden behind the compute. Milliseconds; 0 when not reported.
  double server_queue_ms = 0;
  double server_prefill_ms = 0;
  double server_transfer_tail_ms = 0;
  // Empty when the request succeeded; else a short kind ("UNAVAILABLE",
  // "RESOURCE_EXHAUSTED", "HTTP 503", "CONNECT", "SHORT_OUTPUT", ...) and
  // the message.
  std::string error_kind;
  std::string error;

  bool ok() const { return error_kind.empty(); }
  // Time per output token after the first; 0 for one-token answers.
  absl::Duration tpot() const;
};

class Target {
 public:
  virtual ~Target() = default;
  // Sends one request and waits for its whole answer (or `timeout`).
  // `run_start` is when the run began (sent_at is measured from it).
  virtual RequestRecord Send(const BenchRequest& request, absl::Time run_start,
                             absl::Duration timeout) = 0;
  virtual std::string Describe() const = 0;
};

struct TargetOptions {
  // grpc://HOST:PORT or http://HOST:PORT (https is not supported).
  std::string url;
  // The "model" field of HTTP requests (OpenAI servers may require it).
  std::string model;
  // Greedy by default (temperature 0), as benchmarks usually are.
  double temperature = 0;
};

// INVALID_ARGUMENT for a URL of another scheme or without a port.
absl::StatusOr<std::unique_ptr<Target>> MakeTarget(
    const TargetOptions& options);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_LOADGEN_TARGET_H_
