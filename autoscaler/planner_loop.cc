#include "autoscaler/planner_loop.h"

#include <fstream>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "autoscaler/cluster_observation.h"
#include "cli/admin_client.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "metrics/scrape_client.h"
#include "worker/router_targets.h"

namespace pdserve::autoscaler {
namespace {

const char* const kPools[] = {"prefill", "decode"};

// Each router's /metrics that could be read (by address); `unread` gets the
// others' errors. `routers` is a list or dns:///NAME:PORT (worker/
// router_targets.h, the form workers take for --router), resolved on every
// call so routers that come and go are followed.
std::map<std::string, metrics::ParsedMetrics> ScrapeRouters(
    const std::string& routers, absl::Duration timeout,
    std::vector<std::string>* unread) {
  std::map<std::string, metrics::ParsedMetrics> read;
  absl::StatusOr<std::vector<std::string>> addresses =
      [&]() -> absl::StatusOr<std::vector<std::string>> {
    PD_ASSIGN_OR_RETURN(worker::RouterTargets targets,
                        worker::ParseRouterTargets(routers));
    return worker::ResolveRouterTargets(targets);
  }();
  if (!addresses.ok()) {
    unread->push_back(addresses.status().ToString());
    return read;
  }
  for (const std::string& address : *addresses) {
    absl::StatusOr<metrics::ParsedMetrics> scraped =
        metrics::ScrapeMetrics(address, timeout);
    if (scraped.ok()) {
      read[address] = *std::move(scraped);
    } else {
      unread->push_back(scraped.status().ToString());
    }
  }
  return read;
}

// Help text of every gauge the loop exports: Decision::Gauges() and the
// per-pool figures it adds.
struct GaugeHelp {
  const char* name;
  bool per_pool;
  const char* help;
};
constexpr GaugeHelp kGaugeHelp[] = {
    {"pdserve_planner_desired_replicas", true,
     "Replicas the planner asks for (what an HPA or KEDA scales on)."},
    {"pdserve_planner_needed_replicas", true,
     "Replicas the queueing model needs for the forecast load."},
    {"pdserve_planner_latency_correction", true,
     "Observed over predicted latency quantile, smoothed (1: the profile "
     "is right)."},
    {"pdserve_planner_predicted_latency_seconds", true,
     "The model's latency quantile at the forecast load and the desired "
     "replicas (TTFT for prefill, ITL for decode), in seconds."},
    {"pdserve_planner_manual_hold", true,
     "1 while the planner holds a replica count someone else set."},
    {"pdserve_planner_configured_replicas", true,
     "Replicas the pool was last set to (by the planner or an operator)."},
    {"pdserve_planner_ready_replicas", true,
     "Workers of the pool serving at the decision."},
    {"pdserve_planner_observed_latency_seconds", true,
     "The interval's latency quantile the planner read (TTFT for prefill, "
     "ITL for decode), in seconds; NaN when it had no samples."},
    {"pdserve_planner_observed_request_rate", false,
     "Requests per second arrived in the last interval."},
    {"pdserve_planner_forecast_request_rate", false,
     "Requests per second the planner sizes for."},
    {"pdserve_planner_cost", false,
     "Cost of the desired replicas, in the profile's unit (cores, GPUs)."},
    {"pdserve_planner_budget_clamped", false,
     "1 when the budget cut what the pools wanted."},
};

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerLoop>> PlannerLoop::Create(
    PlannerLoopOptions options, std::unique_ptr<planner::Planner> planner,
    std::unique_ptr<Scaler> scaler, metrics::Registry* registry) {
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the interval must be positive");
  }
  std::unique_ptr<PlannerLoop> loop(new PlannerLoop(
      std::move(options), std::move(planner), std::move(scaler)));
  PD_RETURN_IF_ERROR(loop->RegisterMetrics(registry));
  loop->actuator_ = std::thread([l = loop.get()] { l->ActuatorMain(); });
  return loop;
}

PlannerLoop::PlannerLoop(PlannerLoopOptions options,
                         std::unique_ptr<planner::Planner> planner,
                         std::unique_ptr<Scaler> scaler)
    : options_(std::move(options)),
      planner_(std::move(planner)),
      scaler_(std::move(scaler)) {}

PlannerLoop::~PlannerLoop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    pending_.clear();
  }
  if (actuator_.joinable()) actuator_.join();
}

absl::Status PlannerLoop::RegisterMetrics(metrics::Registry* registry) {
  for (const GaugeHelp& g : kGaugeHelp) {
    metrics::MetricOptions o;
    o.name = g.name;
    o.help = g.help;
    if (g.per_pool) o.label_names = {"pool"};
    PD_ASSIGN_OR_RETURN(metrics::GaugeFamily * family, registry->AddGauge(o));
    if (g.per_pool) {
      for (const char* pool : kPools) {
        PD_ASSIGN_OR_RETURN(
            exported_.pool_gauges[absl::StrCat(g.name, "/", pool)],
            family->WithLabels({pool}));
      }
    } else {
      PD_ASSIGN_OR_RETURN(exported_.gauges[g.name], family->WithLabels({}));
    }
  }
  metrics::MetricOptions o;
  o.name = "pdserve_planner_decisions_total";
  o.help = "Decisions the planner made (one per interval it could read).";
  PD_ASSIGN_OR_RETURN(metrics::CounterFamily * decisions,
                      registry->AddCounter(o));
  PD_ASSIGN_OR_RETURN(exported_.decisions, decisions->WithLabels({}));
  o.name = "pdserve_planner_errors_total";
  o.help =
      "Intervals skipped because the router's metrics or worker list could "
      "not be read.";
  PD_ASSIGN_OR_RETURN(metrics::CounterFamily * errors, registry->AddCounter(o));
  PD_ASSIGN_OR_RETURN(exported_.errors, errors->WithLabels({}));
  o.name = "pdserve_planner_scale_requests_total";
  o.help = "Scales the planner asked its scaler for, by pool and result.";
  o.label_names = {"pool", "result"};
  PD_ASSIGN_OR_RETURN(metrics::CounterFamily * scales, registry->AddCounter(o));
  for (const char* pool : kPools) {
    for (const char* result : {"ok", "failed"}) {
      PD_ASSIGN_OR_RETURN(exported_.scales[absl::StrCat(pool, "/", result)],
                          scales->WithLabels({pool, result}));
    }
  }
  return absl::OkStatus();
}

absl::Status PlannerLoop::Baseline() {
  std::vector<std::string> unread;
  std::map<std::string, metrics::ParsedMetrics> scraped =
      ScrapeRouters(options_.router_http, options_.rpc_timeout, &unread);
  if (scraped.empty()) {
    exported_.errors->Inc();
    return absl::UnavailableError(absl::StrCat(
        "no router's metrics could be read: ", absl::StrJoin(unread, "; ")));
  }
  for (const std::string& why : unread) {
    PD_LOG(WARNING) << "planner: left out of the interval: " << why;
  }
  baseline_ = std::move(scraped);
  baseline_time_ = absl::Now();
  return absl::OkStatus();
}

void PlannerLoop::Configured(int ready_prefill, int ready_decode, int* prefill,
                             int* decode) {
  std::optional<PoolSizes> sizes;
  if (absl::StatusOr<std::optional<PoolSizes>> c = scaler_->Configured();
      c.ok()) {
    sizes = *c;
  } else {
    PD_LOG(WARNING) << "planner: cannot read the pools' sizes: " << c.status();
  }
  absl::MutexLock lock(&mu_);
  for (const char* pool : kPools) {
    int* out = std::string(pool) == "prefill" ? prefill : decode;
    const int ready =
        std::string(pool) == "prefill" ? ready_prefill : ready_decode;
    const auto last = last_desired_.find(pool);
    if (const auto p = pending_.find(pool); p != pending_.end()) {
      *out = p->second;  // ours, not yet carried out
    } else if (running_.has_value() && running_->first == pool) {
      *out = running_->second;  // ours, being carried out
    } else if (sizes.has_value()) {
      *out = sizes->at(pool);
    } else {
      *out = last != last_desired_.end() ? last->second : ready;
    }
  }
}

absl::StatusOr<planner::Decision> PlannerLoop::Tick() {
  if (baseline_.empty()) {
    PD_RETURN_IF_ERROR(Baseline());
    return absl::FailedPreconditionError(
        "took the baseline scrape; the first decision comes an interval "
        "later");
  }
  std::vector<std::string> unread;
  std::map<std::string, metrics::ParsedMetrics> now =
      ScrapeRouters(options_.router_http, options_.rpc_timeout, &unread);
  absl::StatusOr<v1::ListWorkersResponse> workers =
      !now.empty()
          ? cli::ListWorkers(options_.router_control,
                             v1::WORKER_ROLE_UNSPECIFIED, options_.rpc_timeout,
                             options_.credential)
          : absl::StatusOr<v1::ListWorkersResponse>(absl::UnavailableError(
                absl::StrCat("no router's metrics could be read: ",
                             absl::StrJoin(unread, "; "))));
  const absl::Time scraped = absl::Now();
  if (!workers.ok()) {
    exported_.errors->Inc();
    const absl::Status why = workers.status();
    Log(absl::StrCat(
        "{\"time_s\":", absl::ToDoubleSeconds(scraped - absl::UnixEpoch()),
        ",\"skipped\":\"cannot read the router\"}"));
    return absl::Status(why.code(),
                        absl::StrCat("interval skipped: ", why.message()));
  }
  ObservationInput in;
  // Unix seconds: decisions line up with every other log.
  in.time_s = absl::ToDoubleSeconds(scraped - absl::UnixEpoch());
  in.duration_s = absl::ToDoubleSeconds(scraped - baseline_time_);
  // Routers read at both ends; one read only now (new, or back after a
  // miss) starts its measurement here.
  for (const auto& [address, scrape] : now) {
    if (auto before = baseline_.find(address); before != baseline_.end()) {
      in.routers.push_back({.before = &before->second, .now = &scrape});
    } else {
      PD_LOG(INFO) << "planner: router " << address
                   << " counts from the next interval";
    }
  }
  for (const std::string& why : unread) {
    PD_LOG(WARNING) << "planner: left out of the interval: " << why;
  }
  if (in.routers.empty()) {
    // Nothing measured over the whole interval: deciding on no load would
    // shrink the pools for no reason.
    baseline_ = std::move(now);
    baseline_time_ = scraped;
    return absl::UnavailableError(
        "interval skipped: no router was read at both of its ends");
  }
  in.workers = &*workers;
  in.quantile = planner_->options().quantile;
  // The ready counts (for a scaler that cannot say what it configured).
  const planner::Observation ready_only = BuildObservation(in);
  Configured(ready_only.prefill.ready, ready_only.decode.ready,
             &in.prefill_configured, &in.decode_configured);
  const planner::Observation observation = BuildObservation(in);
  const planner::Decision decision = planner_->Decide(observation);
  baseline_ = std::move(now);
  baseline_time_ = scraped;

  exported_.decisions->Inc();
  Export(decision);
  Log(decision.ToJson());
  for (const planner::PoolDecision* p : {&decision.prefill, &decision.decode}) {
    last_desired_[p->pool] = p->desired;
    if (options_.act && p->desired != p->configured) {
      RequestScale(p->pool, p->desired);
    }
  }
  return decision;
}

void PlannerLoop::Run(
    const std::function<bool(absl::Duration)>& stop_requested) {
  while (baseline_.empty()) {
    if (absl::Status s = Baseline(); !s.ok()) {
      PD_LOG(WARNING) << "planner: no baseline yet: " << s;
      if (stop_requested(options_.interval)) return;
    }
  }
  absl::Time next = baseline_time_ + options_.interval;
  while (!stop_requested(std::max(absl::ZeroDuration(), next - absl::Now()))) {
    next += options_.interval;
    absl::StatusOr<planner::Decision> d = Tick();
    if (!d.ok()) PD_LOG(WARNING) << "planner: " << d.status();
    // A slow tick (a router that timed out) does not make the next ones
    // come in a burst.
    if (next < absl::Now()) next = absl::Now() + options_.interval;
  }
}

void PlannerLoop::Export(const planner::Decision& decision) {
  for (const planner::Decision::Gauge& g : decision.Gauges()) {
    std::string key = g.name;
    for (const auto& [label, value] : g.labels) {
      if (label == "pool") absl::StrAppend(&key, "/", value);
    }
    if (auto it = exported_.pool_gauges.find(key);
        it != exported_.pool_gauges.end()) {
      it->second->Set(g.value);
    } else if (auto it = exported_.gauges.find(key);
               it != exported_.gauges.end()) {
      it->second->Set(g.value);
    }
  }
  for (const planner::PoolDecision* p : {&decision.prefill, &decision.decode}) {
    auto set = [&](const char* name, double value) {
      exported_.pool_gauges.at(absl::StrCat(name, "/", p->pool))->Set(value);
    };
    set("pdserve_planner_configured_replicas", p->configured);
    set("pdserve_planner_ready_replicas", p->ready);
    set("pdserve_planner_observed_latency_seconds",
        p->observed_latency_s.value_or(
            std::numeric_limits<double>::quiet_NaN()));
  }
}

void PlannerLoop::Log(const std::string& line) {
  std::cout << line << std::endl;
  if (options_.decision_log.empty()) return;
  std::ofstream out(options_.decision_log, std::ios::app);
  out << line << "\n";
}

void PlannerLoop::RequestScale(const std::string& pool, int replicas) {
  absl::MutexLock lock(&mu_);
  if (running_.has_value() && running_->first == pool &&
      running_->second == replicas) {
    return;  // already being done
  }
  pending_[pool] = replicas;
}

bool PlannerLoop::AwaitIdle(absl::Duration timeout) {
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return pending_.empty() && !running_.has_value();
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void PlannerLoop::ActuatorMain() {
  while (true) {
    std::pair<std::string, int> job;
    {
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pending_.empty();
      };
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      job = *pending_.begin();
      pending_.erase(pending_.begin());
      running_ = job;
    }
    const absl::Time began = absl::Now();
    absl::StatusOr<std::string> report = scaler_->Scale(job.first, job.second);
    const std::string took =
        absl::StrFormat("%.1f s", absl::ToDoubleSeconds(absl::Now() - began));
    if (report.ok()) {
      exported_.scales.at(job.first + "/ok")->Inc();
      PD_LOG(INFO) << "planner: scaled " << job.first << " to " << job.second
                   << " in " << took << ": " << *report;
    } else {
      exported_.scales.at(job.first + "/failed")->Inc();
      PD_LOG(WARNING) << "planner: scaling " << job.first << " to "
                      << job.second << " failed after " << took << ": "
                      << report.status();
    }
    absl::MutexLock lock(&mu_);
    running_.reset();
  }
}

std::string FormatDecision(const planner::Decision& d,
                           const planner::PlannerOptions& options) {
  auto latency = [](std::optional<double> s) {
    return s.has_value() ? absl::StrFormat("%.3f s", *s) : std::string("-");
  };
  std::string out = absl::StrFormat(
      "load      %.2f req/s observed; sizing for %.2f req/s (level %.2f, "
      "trend %+.2f per interval, %d samples%s)\n",
      d.observed_rate, d.forecast_rate, d.forecast_level, d.forecast_trend,
      d.forecast_samples, d.warm ? ", warm" : ", cold start");
  absl::StrAppendFormat(
      &out,
      "lengths   prompt p50 %.0f p90 %.0f mean %.0f; output p50 %.0f p90 %.0f "
      "mean %.0f tokens\n",
      d.prompt_p50, d.prompt_p90, d.prompt_mean, d.output_p50, d.output_p90,
      d.output_mean);
  absl::StrAppendFormat(
      &out,
      "latency   TTFT p%g %s (target %.3f s); ITL p%g %s (target %.3f s)\n",
      100 * options.quantile, latency(d.observed_ttft_s), options.ttft_target_s,
      100 * options.quantile, latency(d.observed_itl_s), options.itl_target_s);
  absl::StrAppendFormat(
      &out, "queue     %.0f prompts waiting; decode KV %.0f%% used\n",
      d.prefill_queue_depth, 100 * d.decode_kv_usage);
  absl::StrAppendFormat(&out, "%-8s %10s %6s %5s %8s %10s %10s\n", "POOL",
                        "CONFIGURED", "READY", "NEED", "DESIRED", "PREDICTED",
                        "CORRECTION");
  for (const planner::PoolDecision* p : {&d.prefill, &d.decode}) {
    absl::StrAppendFormat(&out, "%-8s %10d %6d %5d %8d %10s %10.2f\n", p->pool,
                          p->configured, p->ready, p->need, p->desired,
                          latency(p->predicted_latency_s), p->correction);
  }
  for (const planner::PoolDecision* p : {&d.prefill, &d.decode}) {
    absl::StrAppendFormat(&out, "%s: %s\n", p->pool,
                          absl::StrJoin(p->reasons, "; "));
  }
  if (!d.reasons.empty()) {
    absl::StrAppendFormat(&out, "cluster: %s\n",
                          absl::StrJoin(d.reasons, "; "));
  }
  absl::StrAppendFormat(&out, "cost      %.1f%s\n", d.cost,
                        d.budget_clamped ? " (clamped by the budget)" : "");
  return out;
}

}  // namespace pdserve::autoscaler
