#include "cli/top_scrape.h"

#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "metrics/scrape_client.h"

namespace pdserve::cli {

absl::StatusOr<v1::ListWorkersResponse> ScrapeCluster(
    const ListWorkersFn& list_workers, const std::string& router_http,
    absl::Duration timeout, ClusterScrapes& scrapes) {
  absl::StatusOr<v1::ListWorkersResponse> workers = list_workers();
  std::vector<std::pair<std::string, std::string>> targets;  // id, address
  if (workers.ok()) {
    std::set<std::string> ids;
    for (const v1::WorkerInfo& w : workers->workers()) {
      ids.insert(w.worker_id());
      if (!w.metrics_address().empty()) {
        targets.emplace_back(w.worker_id(), w.metrics_address());
      }
    }
    scrapes.Retain(ids);
  }
  // At once, so a dead worker holds the round up by `timeout`, not by
  // `timeout` per dead worker.
  std::vector<absl::StatusOr<metrics::ParsedMetrics>> results(
      targets.size(), absl::UnknownError("not scraped"));
  std::vector<absl::Time> times(targets.size());
  std::vector<std::thread> threads;
  threads.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = metrics::ScrapeMetrics(targets[i].second, timeout);
      times[i] = absl::Now();
    });
  }
  absl::StatusOr<metrics::ParsedMetrics> router =
      metrics::ScrapeMetrics(router_http, timeout);
  scrapes.router().Add(absl::Now(), std::move(router));
  for (size_t i = 0; i < targets.size(); ++i) {
    threads[i].join();
    scrapes.worker(targets[i].first).Add(times[i], std::move(results[i]));
  }
  return workers;
}

}  // namespace pdserve::cli
