// What the live planner sees of a cluster in one interval, as the planner
// core takes it (planner::Observation): made from two scrapes of each
// router's GET /metrics an interval apart and a router's list of workers.
//
// Every router counts only the requests it served, so the load and the
// latency are those of all routers together: increases are taken per
// router (each has its own counters and restarts on its own) and then
// summed, histograms per bucket bound (as Prometheus' `sum by (le)` over
// `increase()`), before any quantile is read.
//
// From the routers' metrics (docs/metrics.md), as increases between the
// two scrapes (metrics/scrape_delta.h; a router restart between them reads
// as a counter reset, not a negative load):
//   - arrivals and prompt lengths: pdserve_request_prompt_tokens (observed
//     when a request arrives; its count is the arrival count);
//   - output lengths: pdserve_request_generation_tokens (finished requests);
//   - retries and migrations (pdserve_request_retries_total,
//     pdserve_request_migrations_total): intervals with either do not
//     correct the profile;
//   - the prefix cache's share of prompt tokens:
//     pdserve_routed_cached_prompt_tokens_total over
//     pdserve_routed_prompt_tokens_total;
//   - TTFT and ITL at the planner's quantile, with their sample counts and
//     the bucket each fell in (the quantile is known to that bucket only):
//     pdserve_time_to_first_token_seconds,
//     pdserve_inter_token_latency_seconds (histogram_quantile).
// From the router's Admin ListWorkers (each worker's heartbeat), per pool:
// the workers serving (ready), the requests waiting (prefill: prompts
// queued; decode: sequences admitted but not running) and, for decode, the
// mean KV cache usage.
//
// Thread-safety: a pure function over plain values.
#ifndef PDSERVE_AUTOSCALER_CLUSTER_OBSERVATION_H_
#define PDSERVE_AUTOSCALER_CLUSTER_OBSERVATION_H_

#include <vector>

#include "metrics/text_parse.h"
#include "planner/planner.h"
#include "proto/admin.pb.h"

namespace pdserve::autoscaler {

// One router's two scrapes.
struct RouterScrapes {
  // The interval's first scrape; nullptr when there is none (everything
  // the router has counted since it started is then the interval's).
  const metrics::ParsedMetrics* before = nullptr;
  const metrics::ParsedMetrics* now = nullptr;  // never nullptr
};

struct ObservationInput {
  double time_s = 0;      // when the routers were last scraped (planner clock)
  double duration_s = 0;  // since they were scraped before
  // Every router read in both scrapes.
  std::vector<RouterScrapes> routers;
  const v1::ListWorkersResponse* workers = nullptr;
  // The replicas each pool was last asked for (the scaler's answer).
  int prefill_configured = 0;
  int decode_configured = 0;
  double quantile = 0.99;
};

planner::Observation BuildObservation(const ObservationInput& input);

}  // namespace pdserve::autoscaler

#endif  // PDSERVE_AUTOSCALER_CLUSTER_OBSERVATION_H_
