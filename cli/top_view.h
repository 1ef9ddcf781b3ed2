// What `pdctl top` computes and prints, apart from the terminal loop
// (pdctl_main.cc): the scrapes of each process kept over a window, the
// rates and latency quantiles taken from them, and the text of one frame.
//
// Each process (the router, each worker by id) has a ScrapeHistory: its
// successful scrapes of the last `window` (60 s in pdctl top), and whether
// the latest attempt failed. Rates and quantiles compare the oldest scrape
// in the window with the newest (metrics/scrape_delta.h): a rate is the
// counters' increase over the time between the two, a quantile is
// Prometheus' histogram_quantile over the increase of the buckets
// (metrics/histogram_quantile.h). With fewer than two scrapes there is no
// rate and no quantile ("-"); gauges come from the newest scrape.
//
// The frame (RenderTopFrame) is a function of its inputs only (no clock,
// no terminal), so the same scrapes always print the same text:
//
//   pdctl top  router 127.0.0.1:50051  /metrics 127.0.0.1:8000  window 60.0 s
//   cluster    in flight 3  requests 2.50/s  tokens 410.0/s generated, ...
//              TTFT p50 41.2ms p99 98.0ms  ITL p50 6.10ms p99 9.80ms
//
//   prefill pool, 1 worker
//     WORKER            STATE     RUNNING WAITING  KV USED  PROMPT TOK/S ...
//     prefill-0         SERVING         1       0    12.5%        1200.0 ...
//
// then the decode pool (generated tokens/s, ITL p50/p99) and the colocated
// pool (the same as decode: they stream the tokens). A worker whose
// /metrics cannot be read shows "unreachable" and why on its row.
//
// Thread-safety: none; one thread (the loop) owns these objects.
#ifndef PDSERVE_CLI_TOP_VIEW_H_
#define PDSERVE_CLI_TOP_VIEW_H_

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "metrics/text_parse.h"
#include "proto/admin.pb.h"

namespace pdserve::cli {

struct TimedScrape {
  absl::Time time;
  metrics::ParsedMetrics metrics;
};

// One process's scrapes within the window.
class ScrapeHistory {
 public:
  explicit ScrapeHistory(absl::Duration window) : window_(window) {}

  // Records the attempt made at `time` (increasing from call to call). A
  // success is kept, and scrapes more than `window` older than it are
  // dropped; a failure keeps what is there and is reported by last_error()
  // until the next success.
  void Add(absl::Time time, absl::StatusOr<metrics::ParsedMetrics> scrape);

  // Null when no scrape succeeded within the window.
  const TimedScrape* oldest() const;
  const TimedScrape* newest() const;
  size_t size() const { return scrapes_.size(); }
  // newest - oldest; zero with fewer than two.
  absl::Duration span() const;
  // OK, or why the latest attempt failed.
  const absl::Status& last_error() const { return last_error_; }

  // Per second over the window: the increase of counter `family`; nullopt
  // with fewer than two scrapes or when the newest lacks it.
  std::optional<double> Rate(absl::string_view family) const;
  // Quantile q of histogram `family` over the window; nullopt with fewer
  // than two scrapes or no observation in between.
  std::optional<double> Quantile(absl::string_view family, double q) const;
  // Sum (Max) of gauge `family` in the newest scrape.
  std::optional<double> GaugeSum(absl::string_view family) const;
  std::optional<double> GaugeMax(absl::string_view family) const;

 private:
  const absl::Duration window_;
  std::deque<TimedScrape> scrapes_;
  absl::Status last_error_;
};

// The router's figures for the cluster line.
struct RouterStats {
  std::optional<double> in_flight;           // pdserve_requests_in_flight
  std::optional<double> requests_per_s;      // pdserve_requests_total
  std::optional<double> generated_per_s;     // pdserve_generation_tokens_total
  std::optional<double> prompt_per_s;        // pdserve_prompt_tokens_total
  std::optional<double> ttft_p50, ttft_p99;  // seconds
  std::optional<double> itl_p50, itl_p99;    // seconds
};
RouterStats ComputeRouterStats(const ScrapeHistory& router);

// One worker's row. Prefill workers: prompt tokens computed per second and
// their TTFT (pdserve_worker_time_to_first_token_seconds); decode and
// colocated workers: tokens generated per second and their inter-token
// latency (pdserve_worker_inter_token_latency_seconds).
struct WorkerStats {
  std::optional<double> running;   // pdserve_worker_requests_running
  std::optional<double> waiting;   // pdserve_worker_requests_waiting
  std::optional<double> kv_usage;  // pdserve_kv_cache_usage_ratio, 0..1
  std::optional<double> tokens_per_s;
  std::optional<double> latency_p50, latency_p99;  // seconds
};
WorkerStats ComputeWorkerStats(const ScrapeHistory& worker,
                               v1::WorkerRole role);

// The router's and every worker's histories.
class ClusterScrapes {
 public:
  explicit ClusterScrapes(absl::Duration window)
      : window_(window), router_(window) {}

  ScrapeHistory& router() { return router_; }
  const ScrapeHistory& router() const { return router_; }
  // Worker `id`'s history, created empty on first use.
  ScrapeHistory& worker(const std::string& id);
  // Null for a worker never scraped.
  const ScrapeHistory* FindWorker(const std::string& id) const;
  // Forgets the workers not in `ids` (gone from the cluster).
  void Retain(const std::set<std::string>& ids);

 private:
  const absl::Duration window_;
  ScrapeHistory router_;
  std::map<std::string, ScrapeHistory> workers_;
};

struct TopFrameInput {
  // Shown in the title line.
  std::string router_control;
  std::string router_http;
  // The window the histories keep (the title shows it).
  absl::Duration window;
  // The router's answer to ListWorkers for this frame.
  absl::StatusOr<v1::ListWorkersResponse> workers;
};

// One frame, lines ending in '\n'.
std::string RenderTopFrame(const TopFrameInput& input,
                           const ClusterScrapes& scrapes);

// What to write for frame number `index` (0 first): on a terminal, the
// cursor home (the first frame clears the screen), each line followed by
// erase-to-end-of-line, and the rest of the screen erased, so the frame
// replaces the previous one in place; elsewhere the plain frame, separated
// from the previous one by a blank line.
std::string FrameForOutput(absl::string_view frame, bool terminal, int index);

// Seconds as "0.52ms", "41.2ms", "1.25s"; "-" for nullopt, NaN or +-Inf.
std::string FormatLatency(std::optional<double> seconds);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_TOP_VIEW_H_
