// WorkerMetrics: the Prometheus families every worker exports, whatever its
// role (docs/metrics.md lists them), and the handles its serving core
// records to.
//
// Two kinds of value:
//   - events the serving core sees as they happen (an engine step, a token
//     streamed, a transfer finished or failed): recorded through the
//     handles below, on the serving path, with no lock and no allocation;
//   - state the core already keeps (requests waiting, KV blocks by state,
//     prefix-cache lookups, draining): read at scrape time from the
//     WorkerGauges callbacks the role supplies, so the serving path copies
//     nothing.
// Every series carries the labels model, role and worker_id (one process,
// one set of values), so a query across pods keeps them apart without
// relabelling and `pdctl top` knows whose numbers it reads.
//
// A serving core built without a registry (unit tests) records to
// WorkerMetrics::Unregistered(): real series that nobody exports.
//
// Thread-safety: the handles may be used from any thread; Create and
// AddGauges only at startup.
#ifndef PDSERVE_WORKER_WORKER_METRICS_H_
#define PDSERVE_WORKER_WORKER_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/buckets.h"
#include "metrics/counter.h"
#include "metrics/gauge.h"
#include "metrics/histogram.h"
#include "metrics/registry.h"

namespace pdserve::worker {

// Why a KV transfer failed, as the failure counter's reason label says.
enum class TransferFailure {
  kChecksum,  // the bytes that landed do not match the notice (decode)
  kDeadline,  // not complete in time: the writer's deadline, an expired
              // admission
  kPeerLost,  // the other side is unreachable or went away
  kCancelled,
  kOther,
};
inline constexpr int kNumTransferFailures = 5;

// The reason of a failed transfer's status: DATA_LOSS is a checksum
// mismatch, DEADLINE_EXCEEDED a deadline, UNAVAILABLE a lost peer,
// CANCELLED a cancel; anything else is "other".
TransferFailure TransferFailureOf(const absl::Status& status);

struct WorkerMetricsOptions {
  std::string model;  // the served model name
  std::string role;   // "prefill", "decode" or "colocated"
  std::string worker_id;
  // The engine's speculative decoding method ("ngram", "draft_model"), the
  // `method` label of the speculative-decoding counters; empty: off, and
  // those counters export nothing.
  std::string speculative_method;
  // Upper bounds of the latency histograms (see metrics/buckets.h):
  // per-token (inter-token latency, engine step, transfer) and
  // per-request (time to first token).
  metrics::LatencyBuckets buckets;
};

// What a role reads at scrape time. Unset callbacks export nothing.
struct WorkerGauges {
  struct Requests {
    double running = 0;  // in the batch being computed
    double waiting = 0;  // queued, preempted, or waiting for their KV
  };
  struct KvBlocks {
    double capacity = 0;
    double used = 0;         // held by sequences
    double free = 0;         // allocatable (evictable cache blocks count)
    double reserved = 0;     // held for transfers not yet complete
    double quarantined = 0;  // of reserved: late writes may still land
  };
  struct PrefixCache {
    double query_tokens = 0;  // prompt tokens looked up
    double hit_tokens = 0;    // of those, found cached
  };
  std::function<Requests()> requests;
  std::function<KvBlocks()> kv_blocks;
  std::function<PrefixCache()> prefix_cache;
  std::function<bool()> draining;
};

class WorkerMetrics {
 public:
  // Registers the worker families in `registry` (which must outlive the
  // result) with one series each for the options' labels.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(
      metrics::Registry* registry, const WorkerMetricsOptions& options);

  // Series registered nowhere, for serving cores built without a registry.
  static WorkerMetrics* Unregistered();

  // Registers the scrape-time families from the role's callbacks; once.
  absl::Status AddGauges(WorkerGauges gauges);

  // ---- Recorded by the serving core ----------------------------------
  // One engine step (decode) or forward pass (prefill): its duration and
  // the sequences it computed.
  metrics::Histogram* step_duration = nullptr;
  metrics::Histogram* batch_sequences = nullptr;
  // Prompt tokens this worker computed (prefix-cache hits excluded) and
  // tokens it sampled and sent on (a prefill worker's first tokens, a
  // decode worker's stream).
  metrics::Counter* prompt_tokens_computed = nullptr;
  metrics::Counter* generated_tokens = nullptr;
  // Prefill worker: request received -> first token sampled. Decode
  // worker: StartDecode -> first token streamed.
  metrics::Histogram* time_to_first_token = nullptr;
  // Decode worker: the gap between two tokens of one stream.
  metrics::Histogram* inter_token_latency = nullptr;
  // KV transfers: bytes moved (sent by a prefill worker, received and
  // verified by a decode worker), how long a successful one took, and the
  // failures by reason.
  metrics::Counter* transfer_bytes = nullptr;
  metrics::Histogram* transfer_duration = nullptr;
  metrics::Counter* transfer_failures(TransferFailure reason) {
    return transfer_failures_[static_cast<int>(reason)];
  }
  // Decode worker: admissions whose transfer never completed in time.
  metrics::Counter* admissions_expired = nullptr;
  // Speculative decoding: draft tokens the target verified, and of those
  // accepted. Series exist only when options.speculative_method is set
  // (otherwise these count into nothing).
  metrics::Counter* spec_draft_tokens = nullptr;
  metrics::Counter* spec_accepted_tokens = nullptr;

 private:
  WorkerMetrics(metrics::Registry* registry, WorkerMetricsOptions options);
  absl::Status Register();

  metrics::Registry* const registry_;
  const WorkerMetricsOptions options_;
  // model, role, worker_id: every family's leading labels.
  const std::vector<std::string> labels_;
  std::array<metrics::Counter*, kNumTransferFailures> transfer_failures_{};
  // What the speculative-decoding counters point at when nothing exports
  // them.
  metrics::Counter unexported_[2];
  bool gauges_added_ = false;
};

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_WORKER_METRICS_H_
