// One round of `pdctl top`'s scraping: the router's list of workers, then
// the router's and every worker's GET /metrics at once, each recorded in
// its ScrapeHistory (top_view.h). Kept apart from the terminal loop so it
// can be tested against in-process metrics servers.
//
// Thread-safety: a round runs one thread per worker and joins them before
// it returns; `scrapes` is touched only by the calling thread.
#ifndef PDSERVE_CLI_TOP_SCRAPE_H_
#define PDSERVE_CLI_TOP_SCRAPE_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/top_view.h"
#include "proto/admin.pb.h"

namespace pdserve::cli {

// The router's Admin ListWorkers (admin_client.h in pdctl).
using ListWorkersFn = std::function<absl::StatusOr<v1::ListWorkersResponse>()>;

// Lists the workers (forgetting the histories of those gone), scrapes the
// router at `router_http` and each worker at its metrics_address, each
// bounded by `timeout`, and records every outcome. Returns the worker list
// (or why it failed: then only the router is scraped).
absl::StatusOr<v1::ListWorkersResponse> ScrapeCluster(
    const ListWorkersFn& list_workers, const std::string& router_http,
    absl::Duration timeout, ClusterScrapes& scrapes);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_TOP_SCRAPE_H_
