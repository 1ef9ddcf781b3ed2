// RouterMetrics: the Prometheus families the router exports about the
// requests it serves and the cluster it routes to (docs/metrics.md lists
// them), and the handles its request path records to.
//
// The router sees every request from arrival to its last token, so the
// client-facing latencies live here: time to first token, inter-token
// latency, time per output token, end-to-end, and the breakdown the gRPC
// Timing carries (queueing, prefill compute, the KV-transfer tail after
// compute). Every series carries the label model (the served model name);
// the request counters add the endpoint and the final status.
//
// Every series a request can touch is created at startup, so recording is
// a relaxed atomic on a held pointer: no lock, no allocation, and every
// series is exported (as 0) before its first event, so rate() works from
// the first scrape.
//
// Thread-safety: the recording methods may be called from any thread;
// Create and AddWorkerPools only at startup.
#ifndef PDSERVE_ROUTER_ROUTER_METRICS_H_
#define PDSERVE_ROUTER_ROUTER_METRICS_H_

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "metrics/buckets.h"
#include "metrics/counter.h"
#include "metrics/gauge.h"
#include "metrics/histogram.h"
#include "metrics/registry.h"
#include "proto/common.pb.h"

namespace pdserve::router {

// Where a request came in: the label endpoint.
enum class Endpoint { kGenerate, kCompletions, kChatCompletions };
inline constexpr int kNumEndpoints = 3;

// Why a request was refused for overload: the label reason.
enum class Overload {
  kMaxInflight,   // the router's --max_inflight
  kNoKvCapacity,  // no decode worker had room for the request's KV
};

// The path a routing decision chose: the label path.
enum class RoutingPath { kDisaggregated, kLocalPrefill };

// Bounds of the token-length histograms: 1, 2, 4, then powers of sqrt(2)
// rounded (8, 11, 16, 23, ...) to 131072: every length within 41 %.
std::vector<double> TokenLengthBuckets();

struct RouterMetricsOptions {
  std::string model;  // the served model name
  metrics::LatencyBuckets buckets;
};

class RouterMetrics {
 public:
  // Registers the router families in `registry` (which must outlive the
  // result).
  static absl::StatusOr<std::unique_ptr<RouterMetrics>> Create(
      metrics::Registry* registry, const RouterMetricsOptions& options);

  // Series registered nowhere, for a router core built without a registry
  // (tests).
  static RouterMetrics* Unregistered();

  // Workers by pool and state, counted at scrape time from `count`, which
  // returns how many serving workers of (role, state) there are.
  absl::Status AddWorkerPools(
      std::function<int(v1::WorkerRole, v1::WorkerState)> count);

  // ---- Recorded on the request path -----------------------------------
  // A request's end, by endpoint and final status (also requests refused
  // before they reached the core: malformed, too large).
  void RecordRequest(Endpoint endpoint, const absl::Status& status);
  // A request that ended with its last token, by finish reason (stop,
  // length).
  void RecordSuccess(v1::FinishReason reason) {
    (reason == v1::FINISH_REASON_LENGTH ? success_length_ : success_stop_)
        ->Inc();
  }
  void RecordOverload(Overload reason) {
    overload_[static_cast<int>(reason)]->Inc();
  }
  void RecordRoute(RoutingPath path, int64_t prompt_tokens,
                   int64_t cached_prompt_tokens) {
    routing_[static_cast<int>(path)]->Inc();
    routed_prompt_tokens_->Inc(prompt_tokens);
    routed_cached_prompt_tokens_->Inc(cached_prompt_tokens);
  }

  metrics::Histogram* time_to_first_token = nullptr;
  metrics::Histogram* inter_token_latency = nullptr;
  metrics::Histogram* time_per_output_token = nullptr;
  metrics::Histogram* e2e_latency = nullptr;
  metrics::Histogram* queue_time = nullptr;
  metrics::Histogram* prefill_time = nullptr;
  metrics::Histogram* kv_transfer_tail = nullptr;
  // Length distributions (what a planner sizes pools from, not only the
  // means the token counters give): every accepted request's prompt tokens,
  // observed at arrival (its _count is the arrival count), and the tokens
  // generated for each request that ended with its last token.
  metrics::Histogram* request_prompt_tokens = nullptr;
  metrics::Histogram* request_generation_tokens = nullptr;
  // Prompt tokens of requests that got their first token; tokens sent to
  // clients.
  metrics::Counter* prompt_tokens = nullptr;
  metrics::Counter* generation_tokens = nullptr;
  metrics::Gauge* requests_in_flight = nullptr;
  metrics::Counter* retries = nullptr;
  metrics::Counter* migrations = nullptr;
  // Tries that found no worker with room and waited
  // (GenerationCoreOptions::capacity_wait).
  metrics::Counter* capacity_waits = nullptr;
  // Requests that ended because their client went away or cancelled.
  metrics::Counter* cancellations = nullptr;

 private:
  // absl::StatusCode values 0..16.
  static constexpr int kNumCodes = 17;

  RouterMetrics(metrics::Registry* registry, RouterMetricsOptions options);
  absl::Status Register();

  metrics::Registry* const registry_;
  const RouterMetricsOptions options_;
  std::array<std::array<metrics::Counter*, kNumCodes>, kNumEndpoints>
      requests_{};
  metrics::Counter* success_stop_ = nullptr;
  metrics::Counter* success_length_ = nullptr;
  std::array<metrics::Counter*, 2> overload_{};
  std::array<metrics::Counter*, 2> routing_{};
  metrics::Counter* routed_prompt_tokens_ = nullptr;
  metrics::Counter* routed_cached_prompt_tokens_ = nullptr;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_ROUTER_METRICS_H_
