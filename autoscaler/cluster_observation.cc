#include "autoscaler/cluster_observation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "metrics/histogram_quantile.h"
#include "metrics/scrape_delta.h"

namespace pdserve::autoscaler {
namespace {

// Counter `family`'s increase over all routers.
double CounterIncrease(const ObservationInput& in, const char* family) {
  double sum = 0;
  for (const RouterScrapes& r : in.routers) {
    sum += metrics::CounterIncrease(r.before, *r.now, family).value_or(0);
  }
  return sum;
}

// Histogram `family`'s bucket increases over all routers, per bound. The
// routers' layouts are the same flags' (--ttft_buckets, --itl_buckets);
// where they differ, a router's cumulative count at a bound it lacks is
// the one at its largest bound below (all its observations known to be
// under it), so a mixed fleet stays a valid, cumulative histogram.
std::vector<metrics::ParsedBucket> BucketIncrease(const ObservationInput& in,
                                                  const char* family) {
  std::vector<std::vector<metrics::ParsedBucket>> each;
  std::vector<double> bounds;
  for (const RouterScrapes& r : in.routers) {
    each.push_back(metrics::BucketIncrease(r.before, *r.now, family));
    for (const metrics::ParsedBucket& b : each.back()) {
      bounds.push_back(b.upper_bound);
    }
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::vector<metrics::ParsedBucket> sum;
  for (double bound : bounds) {
    metrics::ParsedBucket merged{.upper_bound = bound};
    for (const std::vector<metrics::ParsedBucket>& buckets : each) {
      double below = 0;
      for (const metrics::ParsedBucket& b : buckets) {
        if (b.upper_bound > bound) break;
        below = b.cumulative_count;
      }
      merged.cumulative_count += below;
    }
    sum.push_back(merged);
  }
  return sum;
}

double HistogramSumIncrease(const ObservationInput& in, const char* family) {
  double sum = 0;
  for (const RouterScrapes& r : in.routers) {
    sum += metrics::HistogramSumIncrease(r.before, *r.now, family).value_or(0);
  }
  return sum;
}

// The interval's length histogram of `family` (a token-count histogram of
// the router), or an empty one when the router does not export it.
planner::LengthHistogram LengthsOf(const ObservationInput& in,
                                   const char* family) {
  const std::vector<metrics::ParsedBucket> buckets = BucketIncrease(in, family);
  if (buckets.size() < 2) return planner::LengthHistogram();
  std::vector<double> bounds, cumulative;
  for (const metrics::ParsedBucket& b : buckets) {
    if (!std::isinf(b.upper_bound)) bounds.push_back(b.upper_bound);
    cumulative.push_back(b.cumulative_count);
  }
  const double sum = HistogramSumIncrease(in, family);
  absl::StatusOr<planner::LengthHistogram> h =
      planner::LengthHistogram::FromCumulative(bounds, cumulative, sum);
  return h.ok() ? *std::move(h) : planner::LengthHistogram();
}

// Quantile q of latency histogram `family` over the interval, the bucket
// it fell in, and how many observations it had.
std::optional<double> LatencyQuantile(
    const ObservationInput& in, const char* family, double* samples,
    std::optional<planner::Observation::Bucket>* bucket) {
  const std::vector<metrics::ParsedBucket> buckets = BucketIncrease(in, family);
  *samples = buckets.empty() ? 0 : buckets.back().cumulative_count;
  if (*samples <= 0) return std::nullopt;
  const double q = metrics::HistogramQuantile(in.quantile, buckets);
  if (std::isnan(q)) return std::nullopt;
  // The first bucket whose cumulative count reaches the rank, as
  // histogram_quantile finds it.
  const double rank = in.quantile * *samples;
  double lower = 0;
  for (const metrics::ParsedBucket& b : buckets) {
    if (b.cumulative_count >= rank) {
      *bucket = planner::Observation::Bucket{lower, b.upper_bound};
      break;
    }
    lower = b.upper_bound;
  }
  return q;
}

}  // namespace

planner::Observation BuildObservation(const ObservationInput& in) {
  planner::Observation o;
  o.time_s = in.time_s;
  o.load.duration_s = in.duration_s;
  o.load.prompt = LengthsOf(in, "pdserve_request_prompt_tokens");
  o.load.output = LengthsOf(in, "pdserve_request_generation_tokens");
  o.load.requests = o.load.prompt.count();

  const double routed =
      CounterIncrease(in, "pdserve_routed_prompt_tokens_total");
  const double cached =
      CounterIncrease(in, "pdserve_routed_cached_prompt_tokens_total");
  o.cached_prompt_fraction = routed > 0 ? std::min(1.0, cached / routed) : 0;

  o.retries = CounterIncrease(in, "pdserve_request_retries_total");
  o.migrations = CounterIncrease(in, "pdserve_request_migrations_total");
  o.ttft_s = LatencyQuantile(in, "pdserve_time_to_first_token_seconds",
                             &o.ttft_samples, &o.ttft_bucket);
  o.itl_s = LatencyQuantile(in, "pdserve_inter_token_latency_seconds",
                            &o.itl_samples, &o.itl_bucket);
  if (o.itl_samples > 0) {
    o.itl_mean_s =
        HistogramSumIncrease(in, "pdserve_inter_token_latency_seconds") /
        o.itl_samples;
  }

  o.prefill.configured = in.prefill_configured;
  o.decode.configured = in.decode_configured;
  double kv_usage_sum = 0;
  if (in.workers != nullptr) {
    for (const v1::WorkerInfo& w : in.workers->workers()) {
      if (w.state() != v1::WORKER_STATE_SERVING) continue;
      const v1::WorkerLoad& load = w.load();
      if (w.role() == v1::WORKER_ROLE_PREFILL) {
        ++o.prefill.ready;
        o.prefill.queue_depth += load.queued_prefill_requests();
      } else if (w.role() == v1::WORKER_ROLE_DECODE) {
        ++o.decode.ready;
        o.decode.queue_depth += load.waiting_sequences();
        if (load.total_kv_blocks() > 0) {
          kv_usage_sum += 1.0 - static_cast<double>(load.free_kv_blocks()) /
                                    load.total_kv_blocks();
        }
      }
    }
  }
  o.decode.kv_usage = o.decode.ready > 0 ? kv_usage_sum / o.decode.ready : 0;
  return o;
}

}  // namespace pdserve::autoscaler
