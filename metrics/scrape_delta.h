// What moved between two scrapes of one process: the increase of counters
// and of histogram buckets from an older scrape to a newer one, and a
// gauge's value in one scrape. `pdctl top` turns these into rates and, with
// HistogramQuantile (histogram_quantile.h), into quantiles over a window.
//
// An increase is taken per series, as Prometheus' increase() over exactly
// those two samples (without its extrapolation to the window's edges):
// newer - older, or newer when the series went down (a counter reset: the
// process restarted between the scrapes). A series missing from the older
// scrape (created since) counts from 0. A histogram series counts as reset
// when any of its buckets went down, and then its newer buckets are the
// increase. Families are summed over all their series; histograms per
// bucket bound, as `sum by (le)`.
//
// Thread-safety: pure functions over plain values.
#ifndef PDSERVE_METRICS_SCRAPE_DELTA_H_
#define PDSERVE_METRICS_SCRAPE_DELTA_H_

#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "metrics/text_parse.h"

namespace pdserve::metrics {

// The increase of every series of `family` (a counter, or untyped) from
// `older` (nullptr: nothing before) to `newer`, summed; nullopt when
// `newer` has no sample of it.
std::optional<double> CounterIncrease(const ParsedMetrics* older,
                                      const ParsedMetrics& newer,
                                      absl::string_view family);

// The buckets of histogram `family`, summed over its series per bound, as
// increases from `older` (nullptr: nothing before) to `newer`; empty when
// `newer` has no series of it.
std::vector<ParsedBucket> BucketIncrease(const ParsedMetrics* older,
                                         const ParsedMetrics& newer,
                                         absl::string_view family);

// The increase of histogram `family`'s `_sum`, summed over its series (with
// BucketIncrease's reset rule); nullopt when `newer` has no series of it.
std::optional<double> HistogramSumIncrease(const ParsedMetrics* older,
                                           const ParsedMetrics& newer,
                                           absl::string_view family);

// The sum (or the largest value) of the samples of `family` (a gauge, or
// untyped) in one scrape; nullopt when it has none.
std::optional<double> GaugeSum(const ParsedMetrics& metrics,
                               absl::string_view family);
std::optional<double> GaugeMax(const ParsedMetrics& metrics,
                               absl::string_view family);

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_SCRAPE_DELTA_H_
