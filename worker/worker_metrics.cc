#include "worker/worker_metrics.h"

#include <utility>

#include "common/status_macros.h"
#include "metrics/buckets.h"

namespace pdserve::worker {
namespace {

constexpr const char* kTransferFailureNames[kNumTransferFailures] = {
    "checksum", "deadline", "peer_lost", "cancelled", "other"};

// A worker family: the labels every series has (model, role, worker_id),
// then `extra_labels`.
metrics::MetricOptions FamilyOptions(
    const char* name, const char* help,
    std::vector<std::string> extra_labels = {}) {
  metrics::MetricOptions o;
  o.name = name;
  o.help = help;
  o.label_names = {"model", "role", "worker_id"};
  for (std::string& l : extra_labels) o.label_names.push_back(std::move(l));
  return o;
}

std::vector<absl::string_view> Views(const std::vector<std::string>& v) {
  return std::vector<absl::string_view>(v.begin(), v.end());
}

}  // namespace

TransferFailure TransferFailureOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDataLoss:
      return TransferFailure::kChecksum;
    case absl::StatusCode::kDeadlineExceeded:
      return TransferFailure::kDeadline;
    case absl::StatusCode::kUnavailable:
      return TransferFailure::kPeerLost;
    case absl::StatusCode::kCancelled:
      return TransferFailure::kCancelled;
    default:
      return TransferFailure::kOther;
  }
}

WorkerMetrics::WorkerMetrics(metrics::Registry* registry,
                             WorkerMetricsOptions options)
    : registry_(registry),
      options_(std::move(options)),
      labels_({options_.model, options_.role, options_.worker_id}) {}

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    metrics::Registry* registry, const WorkerMetricsOptions& options) {
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics(registry, options));
  PD_RETURN_IF_ERROR(m->Register());
  return m;
}

WorkerMetrics* WorkerMetrics::Unregistered() {
  static metrics::Registry* const registry = new metrics::Registry();
  static WorkerMetrics* const metrics = [] {
    WorkerMetricsOptions options;
    options.role = "unregistered";
    return Create(registry, options).value().release();
  }();
  return metrics;
}

absl::Status WorkerMetrics::Register() {
  auto counter = [&](const char* name,
                     const char* help) -> absl::StatusOr<metrics::Counter*> {
    PD_ASSIGN_OR_RETURN(metrics::CounterFamily * family,
                        registry_->AddCounter(FamilyOptions(name, help)));
    return family->WithLabels(Views(labels_));
  };
  auto histogram = [&](const char* name, const char* help,
                       const std::vector<double>& bounds)
      -> absl::StatusOr<metrics::Histogram*> {
    PD_ASSIGN_OR_RETURN(
        metrics::HistogramFamily * family,
        registry_->AddHistogram(FamilyOptions(name, help), bounds));
    return family->WithLabels(Views(labels_));
  };

  PD_ASSIGN_OR_RETURN(
      step_duration,
      histogram("pdserve_engine_step_duration_seconds",
                "Duration of one engine step (decode) or forward pass "
                "(prefill), in seconds.",
                options_.buckets.itl));
  PD_ASSIGN_OR_RETURN(std::vector<double> batch_bounds,
                      metrics::ExponentialBuckets(1, 2, 10));
  PD_ASSIGN_OR_RETURN(
      batch_sequences,
      histogram("pdserve_engine_batch_sequences",
                "Sequences computed in one engine step or forward pass.",
                batch_bounds));
  PD_ASSIGN_OR_RETURN(
      prompt_tokens_computed,
      counter("pdserve_worker_prompt_tokens_computed_total",
              "Prompt tokens this worker computed (prefix-cache hits "
              "excluded; recomputed tokens of preempted sequences "
              "included)."));
  PD_ASSIGN_OR_RETURN(
      generated_tokens,
      counter("pdserve_worker_generated_tokens_total",
              "Tokens this worker sampled and sent on: a prefill worker's "
              "first tokens, a decode worker's streamed tokens."));
  PD_ASSIGN_OR_RETURN(
      time_to_first_token,
      histogram("pdserve_worker_time_to_first_token_seconds",
                "Prefill worker: request received to first token sampled. "
                "Decode worker: StartDecode to first token streamed. In "
                "seconds.",
                options_.buckets.ttft));
  PD_ASSIGN_OR_RETURN(
      inter_token_latency,
      histogram("pdserve_worker_inter_token_latency_seconds",
                "Decode worker: time between two tokens of one stream, in "
                "seconds.",
                options_.buckets.itl));
  {
    PD_ASSIGN_OR_RETURN(
        metrics::CounterFamily * family,
        registry_->AddCounter(FamilyOptions(
            "pdserve_kv_transfer_bytes_total",
            "KV cache bytes moved between workers: sent by a prefill "
            "worker, received and verified by a decode worker.",
            {"direction"})));
    std::vector<absl::string_view> values = Views(labels_);
    values.push_back(options_.role == "prefill" ? "sent" : "received");
    PD_ASSIGN_OR_RETURN(transfer_bytes, family->WithLabels(values));
  }
  PD_ASSIGN_OR_RETURN(
      transfer_duration,
      histogram("pdserve_kv_transfer_duration_seconds",
                "Successful KV transfers: prefill worker, first layer "
                "posted to the decode worker's acknowledgement; decode "
                "worker, admission to verified KV. In seconds.",
                options_.buckets.itl));
  {
    PD_ASSIGN_OR_RETURN(
        metrics::CounterFamily * family,
        registry_->AddCounter(FamilyOptions(
            "pdserve_kv_transfer_failures_total",
            "KV transfers that failed, by reason: checksum (the bytes "
            "that landed do not match), deadline, peer_lost, cancelled, "
            "other.",
            {"reason"})));
    for (int i = 0; i < kNumTransferFailures; ++i) {
      std::vector<absl::string_view> values = Views(labels_);
      values.push_back(kTransferFailureNames[i]);
      PD_ASSIGN_OR_RETURN(transfer_failures_[i], family->WithLabels(values));
    }
  }
  PD_ASSIGN_OR_RETURN(
      admissions_expired,
      counter("pdserve_kv_admissions_expired_total",
              "Decode worker: admissions whose KV transfer did not "
              "complete before the admission's time to live."));
  if (options_.speculative_method.empty()) {
    spec_draft_tokens = &unexported_[0];
    spec_accepted_tokens = &unexported_[1];
    return absl::OkStatus();
  }
  auto method_counter =
      [&](const char* name,
          const char* help) -> absl::StatusOr<metrics::Counter*> {
    PD_ASSIGN_OR_RETURN(
        metrics::CounterFamily * family,
        registry_->AddCounter(FamilyOptions(name, help, {"method"})));
    std::vector<absl::string_view> values = Views(labels_);
    values.push_back(options_.speculative_method);
    return family->WithLabels(values);
  };
  PD_ASSIGN_OR_RETURN(
      spec_draft_tokens,
      method_counter("pdserve_spec_decode_draft_tokens_total",
                     "Speculative decoding: draft tokens the target model "
                     "verified, by drafting method."));
  PD_ASSIGN_OR_RETURN(
      spec_accepted_tokens,
      method_counter("pdserve_spec_decode_accepted_tokens_total",
                     "Speculative decoding: verified draft tokens the "
                     "target accepted (the acceptance rate is this over "
                     "draft tokens), by drafting method."));
  return absl::OkStatus();
}

absl::Status WorkerMetrics::AddGauges(WorkerGauges gauges) {
  if (gauges_added_) {
    return absl::FailedPreconditionError("worker gauges are already added");
  }
  gauges_added_ = true;
  const std::vector<std::string> labels = labels_;
  // One sample with this worker's labels (plus `extra`).
  auto sample = [labels](double value, std::vector<std::string> extra = {}) {
    metrics::Sample s{labels, value};
    for (std::string& e : extra) s.label_values.push_back(std::move(e));
    return s;
  };
  using Samples = std::vector<metrics::Sample>;

  if (gauges.requests) {
    auto read = gauges.requests;
    PD_RETURN_IF_ERROR(registry_->AddGaugeCallback(
        FamilyOptions("pdserve_worker_requests_running",
                      "Requests in the batch being computed (decode: sequences "
                      "in the running batch; prefill: prompts in the pass)."),
        [read, sample] { return Samples{sample(read().running)}; }));
    PD_RETURN_IF_ERROR(registry_->AddGaugeCallback(
        FamilyOptions("pdserve_worker_requests_waiting",
                      "Requests waiting on this worker: queued prompts, "
                      "preempted sequences, local prefills not yet scheduled."),
        [read, sample] { return Samples{sample(read().waiting)}; }));
  }
  if (gauges.kv_blocks) {
    auto read = gauges.kv_blocks;
    PD_RETURN_IF_ERROR(registry_->AddGaugeCallback(
        FamilyOptions(
            "pdserve_kv_cache_blocks",
            "KV cache blocks by state: used (held by sequences), free "
            "(allocatable; cached blocks nobody holds count), reserved "
            "(held for transfers not yet complete), quarantined (of "
            "reserved: late writes may still land).",
            {"state"}),
        [read, sample] {
          const WorkerGauges::KvBlocks kv = read();
          return Samples{sample(kv.used, {"used"}), sample(kv.free, {"free"}),
                         sample(kv.reserved, {"reserved"}),
                         sample(kv.quarantined, {"quarantined"})};
        }));
    PD_RETURN_IF_ERROR(registry_->AddGaugeCallback(
        FamilyOptions("pdserve_kv_cache_capacity_blocks",
                      "KV cache blocks in the pool."),
        [read, sample] { return Samples{sample(read().capacity)}; }));
    PD_RETURN_IF_ERROR(registry_->AddGaugeCallback(
        FamilyOptions("pdserve_kv_cache_usage_ratio",
                      "Share of the KV cache not free (1 - free / capacity), "
                      "0 to 1."),
        [read, sample] {
          const WorkerGauges::KvBlocks kv = read();
          return Samples{
              sample(kv.capacity > 0 ? 1.0 - kv.free / kv.capacity : 0.0)};
        }));
  }
  if (gauges.prefix_cache) {
    auto read = gauges.prefix_cache;
    PD_RETURN_IF_ERROR(registry_->AddCounterCallback(
        FamilyOptions("pdserve_prefix_cache_query_tokens_total",
                      "Prompt tokens looked up in this worker's prefix cache."),
        [read, sample] { return Samples{sample(read().query_tokens)}; }));
    PD_RETURN_IF_ERROR(registry_->AddCounterCallback(
        FamilyOptions("pdserve_prefix_cache_hit_tokens_total",
                      "Of the prompt tokens looked up, those found in the "
                      "prefix cache (not computed again)."),
        [read, sample] { return Samples{sample(read().hit_tokens)}; }));
  }
  if (gauges.draining) {
    auto read = gauges.draining;
    PD_RETURN_IF_ERROR(registry_->AddGaugeCallback(
        FamilyOptions("pdserve_worker_draining",
                      "1 while the worker drains (finishes its work, takes no "
                      "new work), else 0."),
        [read, sample] { return Samples{sample(read() ? 1 : 0)}; }));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::worker
