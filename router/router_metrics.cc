#include "router/router_metrics.h"

#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "common/status_macros.h"

namespace pdserve::router {
namespace {

constexpr const char* kEndpointNames[kNumEndpoints] = {
    "generate", "completions", "chat_completions"};

metrics::MetricOptions FamilyOptions(const char* name, const char* help,
                                     std::vector<std::string> extra = {}) {
  metrics::MetricOptions o;
  o.name = name;
  o.help = help;
  o.label_names = {"model"};
  for (std::string& l : extra) o.label_names.push_back(std::move(l));
  return o;
}

}  // namespace

std::vector<double> TokenLengthBuckets() {
  std::vector<double> bounds = {1, 2, 4};
  for (double b = 8; b <= 131072.5; b *= std::sqrt(2.0)) {
    bounds.push_back(std::round(b));
  }
  return bounds;
}

RouterMetrics::RouterMetrics(metrics::Registry* registry,
                             RouterMetricsOptions options)
    : registry_(registry), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<RouterMetrics>> RouterMetrics::Create(
    metrics::Registry* registry, const RouterMetricsOptions& options) {
  std::unique_ptr<RouterMetrics> m(new RouterMetrics(registry, options));
  PD_RETURN_IF_ERROR(m->Register());
  return m;
}

RouterMetrics* RouterMetrics::Unregistered() {
  static metrics::Registry* const registry = new metrics::Registry();
  static RouterMetrics* const metrics =
      Create(registry, RouterMetricsOptions()).value().release();
  return metrics;
}

void RouterMetrics::RecordRequest(Endpoint endpoint,
                                  const absl::Status& status) {
  int code = static_cast<int>(status.code());
  if (code < 0 || code >= kNumCodes) {
    code = static_cast<int>(absl::StatusCode::kUnknown);
  }
  requests_[static_cast<int>(endpoint)][code]->Inc();
}

absl::Status RouterMetrics::Register() {
  const absl::string_view model = options_.model;
  auto counter = [&](const char* name,
                     const char* help) -> absl::StatusOr<metrics::Counter*> {
    PD_ASSIGN_OR_RETURN(metrics::CounterFamily * family,
                        registry_->AddCounter(FamilyOptions(name, help)));
    return family->WithLabels({model});
  };
  auto histogram = [&](const char* name, const char* help,
                       const std::vector<double>& bounds)
      -> absl::StatusOr<metrics::Histogram*> {
    PD_ASSIGN_OR_RETURN(
        metrics::HistogramFamily * family,
        registry_->AddHistogram(FamilyOptions(name, help), bounds));
    return family->WithLabels({model});
  };
  // A counter family with one more label, and a series per value.
  auto labelled = [&](const char* name, const char* help, const char* label,
                      std::vector<const char*> values,
                      metrics::Counter** out) -> absl::Status {
    PD_ASSIGN_OR_RETURN(
        metrics::CounterFamily * family,
        registry_->AddCounter(FamilyOptions(name, help, {label})));
    for (size_t i = 0; i < values.size(); ++i) {
      PD_ASSIGN_OR_RETURN(out[i], family->WithLabels({model, values[i]}));
    }
    return absl::OkStatus();
  };

  {
    metrics::MetricOptions o = FamilyOptions(
        "pdserve_requests_total",
        "Requests ended, by endpoint (generate is the gRPC API) and final "
        "status (ok, or the lower-case gRPC code of the error).",
        {"endpoint", "status"});
    o.max_series = kNumEndpoints * kNumCodes;
    PD_ASSIGN_OR_RETURN(metrics::CounterFamily * family,
                        registry_->AddCounter(o));
    for (int e = 0; e < kNumEndpoints; ++e) {
      for (int c = 0; c < kNumCodes; ++c) {
        const std::string status = absl::AsciiStrToLower(
            absl::StatusCodeToString(static_cast<absl::StatusCode>(c)));
        PD_ASSIGN_OR_RETURN(
            requests_[e][c],
            family->WithLabels({model, kEndpointNames[e], status}));
      }
    }
  }
  metrics::Counter* success[2];
  PD_RETURN_IF_ERROR(
      labelled("pdserve_request_success_total",
               "Requests that ended with their last token, by finish reason.",
               "finished_reason", {"stop", "length"}, success));
  success_stop_ = success[0];
  success_length_ = success[1];

  PD_ASSIGN_OR_RETURN(
      time_to_first_token,
      histogram("pdserve_time_to_first_token_seconds",
                "Arrival at the router to the first token sent to the "
                "client, in seconds.",
                options_.buckets.ttft));
  PD_ASSIGN_OR_RETURN(
      inter_token_latency,
      histogram("pdserve_inter_token_latency_seconds",
                "Time between two consecutive chunks of tokens sent to a "
                "client, in seconds.",
                options_.buckets.itl));
  PD_ASSIGN_OR_RETURN(
      time_per_output_token,
      histogram("pdserve_time_per_output_token_seconds",
                "Per request with two or more tokens: first to last token "
                "over the tokens after the first, in seconds.",
                options_.buckets.itl));
  PD_ASSIGN_OR_RETURN(
      e2e_latency,
      histogram("pdserve_e2e_request_latency_seconds",
                "Arrival at the router to the last token, of requests that "
                "finished, in seconds.",
                options_.buckets.ttft));
  PD_ASSIGN_OR_RETURN(
      queue_time,
      histogram("pdserve_request_queue_time_seconds",
                "Time a request waited before its prefill began: at the "
                "router and in the prefill worker's queue, in seconds.",
                options_.buckets.ttft));
  PD_ASSIGN_OR_RETURN(
      prefill_time,
      histogram("pdserve_request_prefill_time_seconds",
                "Prefill compute of the request's prompt (on a prefill "
                "worker, or locally on the decode worker), in seconds.",
                options_.buckets.ttft));
  PD_ASSIGN_OR_RETURN(
      kv_transfer_tail,
      histogram("pdserve_request_kv_transfer_tail_seconds",
                "Disaggregated requests: the KV transfer's time after the "
                "prefill compute ended (the part not hidden behind "
                "compute), in seconds.",
                options_.buckets.itl));
  PD_ASSIGN_OR_RETURN(
      request_prompt_tokens,
      histogram("pdserve_request_prompt_tokens",
                "Prompt tokens per request, observed when the router "
                "accepts it (its _count is the arrival count).",
                TokenLengthBuckets()));
  PD_ASSIGN_OR_RETURN(
      request_generation_tokens,
      histogram("pdserve_request_generation_tokens",
                "Tokens generated per request that ended with its last "
                "token (finish reason stop or length).",
                TokenLengthBuckets()));
  PD_ASSIGN_OR_RETURN(prompt_tokens,
                      counter("pdserve_prompt_tokens_total",
                              "Prompt tokens of requests that got their "
                              "first token."));
  PD_ASSIGN_OR_RETURN(generation_tokens,
                      counter("pdserve_generation_tokens_total",
                              "Generated tokens sent to clients."));
  {
    PD_ASSIGN_OR_RETURN(metrics::GaugeFamily * family,
                        registry_->AddGauge(FamilyOptions(
                            "pdserve_requests_in_flight",
                            "Requests the router is running (admitted under "
                            "--max_inflight, not yet ended).")));
    PD_ASSIGN_OR_RETURN(requests_in_flight, family->WithLabels({model}));
  }
  PD_RETURN_IF_ERROR(
      labelled("pdserve_overload_rejections_total",
               "Requests refused for overload (RESOURCE_EXHAUSTED, HTTP 503): "
               "max_inflight (the router's limit), no_kv_capacity (no decode "
               "worker had room for the KV).",
               "reason", {"max_inflight", "no_kv_capacity"}, overload_.data()));
  PD_ASSIGN_OR_RETURN(retries,
                      counter("pdserve_request_retries_total",
                              "Tries of a request on other workers after a "
                              "worker failed before the first token."));
  PD_ASSIGN_OR_RETURN(migrations,
                      counter("pdserve_request_migrations_total",
                              "Streams moved to another worker pair after "
                              "a worker failed mid-stream."));
  PD_ASSIGN_OR_RETURN(
      capacity_waits,
      counter("pdserve_request_capacity_waits_total",
              "Tries of a request that found no worker with room (KV blocks "
              "on a decode worker, a place in a prefill queue) and waited "
              "(--capacity_wait_ms)."));
  PD_ASSIGN_OR_RETURN(cancellations,
                      counter("pdserve_request_cancellations_total",
                              "Requests ended because the client cancelled "
                              "or went away."));
  PD_RETURN_IF_ERROR(
      labelled("pdserve_routing_decisions_total",
               "Routing decisions (one per try of a request), by path: "
               "disaggregated (a prefill worker, then a decode worker) or "
               "local_prefill (conditional disaggregation).",
               "path", {"disaggregated", "local_prefill"}, routing_.data()));
  PD_ASSIGN_OR_RETURN(routed_prompt_tokens_,
                      counter("pdserve_routed_prompt_tokens_total",
                              "Prompt tokens of routing decisions."));
  PD_ASSIGN_OR_RETURN(
      routed_cached_prompt_tokens_,
      counter("pdserve_routed_cached_prompt_tokens_total",
              "Of the routed prompt tokens, those already in the prefix "
              "cache of the worker that computes the prompt (as its "
              "published block hashes say)."));
  return absl::OkStatus();
}

absl::Status RouterMetrics::AddWorkerPools(
    std::function<int(v1::WorkerRole, v1::WorkerState)> count) {
  metrics::MetricOptions o;
  o.name = "pdserve_workers";
  o.help =
      "Registered workers by pool (prefill, decode, colocated) and state "
      "(starting, serving, draining).";
  o.label_names = {"model", "pool", "state"};
  const std::string model = options_.model;
  return registry_->AddGaugeCallback(o, [count = std::move(count), model] {
    std::vector<metrics::Sample> out;
    const std::pair<v1::WorkerRole, const char*> pools[] = {
        {v1::WORKER_ROLE_PREFILL, "prefill"},
        {v1::WORKER_ROLE_DECODE, "decode"},
        {v1::WORKER_ROLE_BOTH, "colocated"}};
    const std::pair<v1::WorkerState, const char*> states[] = {
        {v1::WORKER_STATE_STARTING, "starting"},
        {v1::WORKER_STATE_SERVING, "serving"},
        {v1::WORKER_STATE_DRAINING, "draining"}};
    for (const auto& [role, pool] : pools) {
      for (const auto& [state, state_name] : states) {
        out.push_back(metrics::Sample{{model, pool, state_name},
                                      static_cast<double>(count(role, state))});
      }
    }
    return out;
  });
}

}  // namespace pdserve::router
