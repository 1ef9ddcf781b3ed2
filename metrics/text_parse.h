// Reading the Prometheus text exposition format 0.0.4 on the client side:
// what `pdctl top` makes of a process's GET /metrics (text_format.h writes
// it).
//
// ParseText turns a scrape into families. A family is named by its TYPE
// line (or, without one, by the sample's own name, as "untyped"). Samples
// of counters, gauges, summaries and untyped families are kept as they are;
// a histogram's `_bucket`, `_sum` and `_count` lines are grouped into one
// ParsedHistogram per label set (the labels other than `le`), buckets in
// increasing order ending with +Inf.
//
// Malformed input is an INVALID_ARGUMENT naming the line ("line 12: ...")
// and never a crash: bad names, labels, escapes, values or timestamps, a
// second TYPE or HELP for one family, a TYPE after the family's samples, an
// unknown type, the same series twice, a bucket without a numeric `le`, a
// histogram without a +Inf bucket, with counts decreasing across buckets
// or a `_count` different from its +Inf bucket. Comments other than HELP
// and TYPE are ignored, as are timestamps (checked, not kept).
//
// Thread-safety: pure functions over plain values.
#ifndef PDSERVE_METRICS_TEXT_PARSE_H_
#define PDSERVE_METRICS_TEXT_PARSE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::metrics {

enum class ParsedType { kCounter, kGauge, kHistogram, kSummary, kUntyped };

// Label name -> value (unescaped); ordered, so equal sets compare equal.
using Labels = std::map<std::string, std::string>;

struct ParsedSample {
  // The sample's own name (a summary's `x_sum` keeps its suffix).
  std::string name;
  Labels labels;
  double value = 0;
};

struct ParsedBucket {
  double upper_bound = 0;  // +Inf for the last
  double cumulative_count = 0;
};

struct ParsedHistogram {
  Labels labels;  // without `le`
  // Increasing upper bounds, the last +Inf.
  std::vector<ParsedBucket> buckets;
  double sum = 0;
  // Equal to the +Inf bucket.
  double count = 0;
};

struct ParsedFamily {
  std::string name;
  std::string help;  // unescaped; empty without a HELP line
  ParsedType type = ParsedType::kUntyped;
  // Counters, gauges, summaries, untyped; in the order read.
  std::vector<ParsedSample> samples;
  // Histograms; in the order their first line was read.
  std::vector<ParsedHistogram> histograms;
};

struct ParsedMetrics {
  // In the order each family first appeared.
  std::vector<ParsedFamily> families;

  // The family named `name`, or nullptr.
  const ParsedFamily* Find(absl::string_view name) const;
};

absl::StatusOr<ParsedMetrics> ParseText(absl::string_view text);

// "counter", "gauge", "histogram", "summary", "untyped".
const char* ParsedTypeName(ParsedType type);

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_TEXT_PARSE_H_
