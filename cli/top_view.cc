#include "cli/top_view.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "metrics/histogram_quantile.h"
#include "metrics/scrape_delta.h"
#include "proto/enum_names.h"

namespace pdserve::cli {
namespace {

bool Finite(std::optional<double> v) {
  return v.has_value() && std::isfinite(*v);
}

std::string FormatCount(std::optional<double> v) {
  return Finite(v) ? absl::StrFormat("%.0f", *v) : "-";
}
std::string FormatRate(std::optional<double> v) {
  return Finite(v) ? absl::StrFormat("%.1f", *v) : "-";
}
std::string FormatPercent(std::optional<double> ratio) {
  return Finite(ratio) ? absl::StrFormat("%.1f%%", *ratio * 100) : "-";
}

// The families `pdctl top` reads (the contract of issue 17).
constexpr char kRouterInFlight[] = "pdserve_requests_in_flight";
constexpr char kRouterRequests[] = "pdserve_requests_total";
constexpr char kRouterGenerated[] = "pdserve_generation_tokens_total";
constexpr char kRouterPrompt[] = "pdserve_prompt_tokens_total";
constexpr char kRouterTtft[] = "pdserve_time_to_first_token_seconds";
constexpr char kRouterItl[] = "pdserve_inter_token_latency_seconds";
constexpr char kWorkerRunning[] = "pdserve_worker_requests_running";
constexpr char kWorkerWaiting[] = "pdserve_worker_requests_waiting";
constexpr char kWorkerKvUsage[] = "pdserve_kv_cache_usage_ratio";
constexpr char kWorkerPromptTokens[] =
    "pdserve_worker_prompt_tokens_computed_total";
constexpr char kWorkerGenerated[] = "pdserve_worker_generated_tokens_total";
constexpr char kWorkerTtft[] = "pdserve_worker_time_to_first_token_seconds";
constexpr char kWorkerItl[] = "pdserve_worker_inter_token_latency_seconds";

bool IsPrefill(v1::WorkerRole role) { return role == v1::WORKER_ROLE_PREFILL; }

// The first line of a status message: rows stay one line.
std::string OneLine(const absl::Status& status) {
  const std::vector<absl::string_view> lines =
      absl::StrSplit(status.message(), '\n');
  return std::string(lines.front());
}

}  // namespace

void ScrapeHistory::Add(absl::Time time,
                        absl::StatusOr<metrics::ParsedMetrics> scrape) {
  if (!scrape.ok()) {
    last_error_ = scrape.status();
    return;
  }
  last_error_ = absl::OkStatus();
  scrapes_.push_back({time, *std::move(scrape)});
  while (scrapes_.front().time < time - window_) scrapes_.pop_front();
}

const TimedScrape* ScrapeHistory::oldest() const {
  return scrapes_.empty() ? nullptr : &scrapes_.front();
}

const TimedScrape* ScrapeHistory::newest() const {
  return scrapes_.empty() ? nullptr : &scrapes_.back();
}

absl::Duration ScrapeHistory::span() const {
  return scrapes_.size() < 2 ? absl::ZeroDuration()
                             : scrapes_.back().time - scrapes_.front().time;
}

std::optional<double> ScrapeHistory::Rate(absl::string_view family) const {
  const double seconds = absl::ToDoubleSeconds(span());
  if (seconds <= 0) return std::nullopt;
  const std::optional<double> increase =
      metrics::CounterIncrease(&oldest()->metrics, newest()->metrics, family);
  if (!increase.has_value()) return std::nullopt;
  return *increase / seconds;
}

std::optional<double> ScrapeHistory::Quantile(absl::string_view family,
                                              double q) const {
  if (span() <= absl::ZeroDuration()) return std::nullopt;
  const double value = metrics::HistogramQuantile(
      q,
      metrics::BucketIncrease(&oldest()->metrics, newest()->metrics, family));
  if (std::isnan(value)) return std::nullopt;
  return value;
}

std::optional<double> ScrapeHistory::GaugeSum(absl::string_view family) const {
  if (newest() == nullptr) return std::nullopt;
  return metrics::GaugeSum(newest()->metrics, family);
}

std::optional<double> ScrapeHistory::GaugeMax(absl::string_view family) const {
  if (newest() == nullptr) return std::nullopt;
  return metrics::GaugeMax(newest()->metrics, family);
}

RouterStats ComputeRouterStats(const ScrapeHistory& router) {
  RouterStats s;
  s.in_flight = router.GaugeSum(kRouterInFlight);
  s.requests_per_s = router.Rate(kRouterRequests);
  s.generated_per_s = router.Rate(kRouterGenerated);
  s.prompt_per_s = router.Rate(kRouterPrompt);
  s.ttft_p50 = router.Quantile(kRouterTtft, 0.5);
  s.ttft_p99 = router.Quantile(kRouterTtft, 0.99);
  s.itl_p50 = router.Quantile(kRouterItl, 0.5);
  s.itl_p99 = router.Quantile(kRouterItl, 0.99);
  return s;
}

WorkerStats ComputeWorkerStats(const ScrapeHistory& worker,
                               v1::WorkerRole role) {
  WorkerStats s;
  s.running = worker.GaugeSum(kWorkerRunning);
  s.waiting = worker.GaugeSum(kWorkerWaiting);
  s.kv_usage = worker.GaugeMax(kWorkerKvUsage);
  const char* tokens = IsPrefill(role) ? kWorkerPromptTokens : kWorkerGenerated;
  const char* latency = IsPrefill(role) ? kWorkerTtft : kWorkerItl;
  s.tokens_per_s = worker.Rate(tokens);
  s.latency_p50 = worker.Quantile(latency, 0.5);
  s.latency_p99 = worker.Quantile(latency, 0.99);
  return s;
}

ScrapeHistory& ClusterScrapes::worker(const std::string& id) {
  return workers_.try_emplace(id, window_).first->second;
}

const ScrapeHistory* ClusterScrapes::FindWorker(const std::string& id) const {
  const auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

void ClusterScrapes::Retain(const std::set<std::string>& ids) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    it = ids.count(it->first) ? std::next(it) : workers_.erase(it);
  }
}

std::string FormatLatency(std::optional<double> seconds) {
  if (!Finite(seconds)) return "-";
  const double ms = *seconds * 1000;
  if (ms < 10) return absl::StrFormat("%.2fms", ms);
  if (ms < 1000) return absl::StrFormat("%.1fms", ms);
  return absl::StrFormat("%.2fs", *seconds);
}

std::string RenderTopFrame(const TopFrameInput& input,
                           const ClusterScrapes& scrapes) {
  std::string out =
      absl::StrFormat("pdctl top  router %s  /metrics %s  window %.0f s\n",
                      input.router_control, input.router_http,
                      absl::ToDoubleSeconds(input.window));

  // The cluster, from the router's /metrics.
  const ScrapeHistory& router = scrapes.router();
  if (!router.last_error().ok()) {
    absl::StrAppend(&out, "cluster    router /metrics unreachable: ",
                    OneLine(router.last_error()), "\n");
  } else if (router.newest() == nullptr) {
    out += "cluster    router /metrics not scraped yet\n";
  } else {
    const RouterStats r = ComputeRouterStats(router);
    absl::StrAppendFormat(
        &out,
        "cluster    in flight %s  requests %s/s  tokens %s/s generated, %s/s "
        "prompt  (over %.1f s)\n"
        "           TTFT p50 %s p99 %s  ITL p50 %s p99 %s\n",
        FormatCount(r.in_flight),
        Finite(r.requests_per_s) ? absl::StrFormat("%.2f", *r.requests_per_s)
                                 : "-",
        FormatRate(r.generated_per_s), FormatRate(r.prompt_per_s),
        absl::ToDoubleSeconds(router.span()), FormatLatency(r.ttft_p50),
        FormatLatency(r.ttft_p99), FormatLatency(r.itl_p50),
        FormatLatency(r.itl_p99));
  }

  // The pools, from the router's admin API and each worker's /metrics.
  if (!input.workers.ok()) {
    absl::StrAppend(&out, "\nworkers: router admin API unreachable: ",
                    OneLine(input.workers.status()), "\n");
    return out;
  }
  std::map<int, std::vector<const v1::WorkerInfo*>> pools;
  for (const v1::WorkerInfo& w : input.workers->workers()) {
    pools[w.role()].push_back(&w);
  }
  if (pools.empty()) {
    out += "\n(no workers registered)\n";
    return out;
  }
  for (const v1::WorkerRole role :
       {v1::WORKER_ROLE_PREFILL, v1::WORKER_ROLE_DECODE, v1::WORKER_ROLE_BOTH,
        v1::WORKER_ROLE_UNSPECIFIED}) {
    auto it = pools.find(role);
    if (it == pools.end()) continue;
    std::vector<const v1::WorkerInfo*>& workers = it->second;
    std::sort(workers.begin(), workers.end(),
              [](const v1::WorkerInfo* a, const v1::WorkerInfo* b) {
                return a->worker_id() < b->worker_id();
              });
    const bool prefill = IsPrefill(role);
    const char* latency = prefill ? "TTFT" : "ITL";
    absl::StrAppendFormat(&out, "\n%s pool, %d worker%s\n", ShortRoleName(role),
                          workers.size(), workers.size() == 1 ? "" : "s");
    absl::StrAppendFormat(
        &out, "  %-20s %-9s %7s %7s %8s %13s %9s %9s\n", "WORKER", "STATE",
        "RUNNING", "WAITING", "KV USED", prefill ? "PROMPT TOK/S" : "GEN TOK/S",
        absl::StrCat(latency, " P50"), absl::StrCat(latency, " P99"));
    for (const v1::WorkerInfo* w : workers) {
      absl::StrAppendFormat(&out, "  %-20s %-9s ", w->worker_id(),
                            ShortStateName(w->state()));
      const ScrapeHistory* history = scrapes.FindWorker(w->worker_id());
      if (w->metrics_address().empty()) {
        out += "no metrics address registered\n";
        continue;
      }
      if (history != nullptr && !history->last_error().ok()) {
        absl::StrAppend(&out, "unreachable: ", OneLine(history->last_error()),
                        "\n");
        continue;
      }
      if (history == nullptr || history->newest() == nullptr) {
        out += "not scraped yet\n";
        continue;
      }
      const WorkerStats s = ComputeWorkerStats(*history, role);
      absl::StrAppendFormat(
          &out, "%7s %7s %8s %13s %9s %9s\n", FormatCount(s.running),
          FormatCount(s.waiting), FormatPercent(s.kv_usage),
          FormatRate(s.tokens_per_s), FormatLatency(s.latency_p50),
          FormatLatency(s.latency_p99));
    }
  }
  return out;
}

std::string FrameForOutput(absl::string_view frame, bool terminal, int index) {
  if (!terminal) return absl::StrCat(index > 0 ? "\n" : "", frame);
  // Home, then each line over the old one with the rest of that line
  // erased, then everything below erased: no blank flash between frames.
  std::string out = index == 0 ? "\x1b[2J\x1b[H" : "\x1b[H";
  absl::ConsumeSuffix(&frame, "\n");
  for (absl::string_view line : absl::StrSplit(frame, '\n')) {
    absl::StrAppend(&out, line, "\x1b[K\n");
  }
  out += "\x1b[J";
  return out;
}

}  // namespace pdserve::cli
