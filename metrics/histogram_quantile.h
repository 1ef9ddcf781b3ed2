// histogram_quantile as Prometheus computes it (promql/quantile.go,
// bucketQuantile), for clients that read cumulative buckets themselves
// (`pdctl top`, from the bucket increases of scrape_delta.h).
//
// Buckets are sorted by upper bound; the last must be +Inf, otherwise the
// answer is NaN. Buckets with the same bound are merged, and counts that go
// down from one bucket to the next are raised to the one before (as
// Prometheus does for buckets read at slightly different times). With fewer
// than two buckets or no observations the answer is NaN; q < 0 is -Inf,
// q > 1 is +Inf, NaN q is NaN. Otherwise the rank q * count falls in the
// first bucket whose cumulative count reaches it, and the answer is
// interpolated linearly between that bucket's lower bound (the bound before
// it, or 0 for the first bucket unless its bound is <= 0, when the bound is
// the answer) and its upper bound. A rank in the +Inf bucket answers the
// highest finite bound.
//
// Thread-safety: a pure function.
#ifndef PDSERVE_METRICS_HISTOGRAM_QUANTILE_H_
#define PDSERVE_METRICS_HISTOGRAM_QUANTILE_H_

#include <vector>

#include "metrics/text_parse.h"

namespace pdserve::metrics {

double HistogramQuantile(double q, std::vector<ParsedBucket> buckets);

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_HISTOGRAM_QUANTILE_H_
