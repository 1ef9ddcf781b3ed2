#include "metrics/naming.h"

#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pdserve::metrics {
namespace {

// promtool's list (client_golang's promlint): name parts that abbreviate a
// unit.
constexpr absl::string_view kUnitAbbreviations[] = {
    "s",  "ms", "us", "ns", "sec", "b", "kb",
    "mb", "gb", "tb", "pb", "m",   "h", "d",
};

struct NonBaseUnit {
  absl::string_view unit;
  absl::string_view base;
};
constexpr NonBaseUnit kNonBaseUnits[] = {
    {"nanoseconds", "seconds"},  {"microseconds", "seconds"},
    {"milliseconds", "seconds"}, {"minutes", "seconds"},
    {"hours", "seconds"},        {"days", "seconds"},
    {"weeks", "seconds"},        {"bits", "bytes"},
    {"kilobytes", "bytes"},      {"megabytes", "bytes"},
    {"gigabytes", "bytes"},      {"terabytes", "bytes"},
    {"petabytes", "bytes"},      {"exabytes", "bytes"},
    {"kibibytes", "bytes"},      {"mebibytes", "bytes"},
    {"gibibytes", "bytes"},      {"percent", "ratio"},
    {"kilograms", "grams"},      {"fahrenheit", "celsius"},
};

constexpr absl::string_view kTypeWords[] = {"counter", "gauge", "histogram",
                                            "summary"};

bool IsStandardProcessMetric(absl::string_view name) {
  for (absl::string_view standard : kStandardProcessMetrics) {
    if (name == standard) return true;
  }
  return false;
}

absl::Status Invalid(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("metric name '", name, "': ", why));
}

}  // namespace

absl::Status CheckMetricName(absl::string_view name, MetricType type) {
  if (name.empty()) return Invalid(name, "empty");
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok =
        (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) {
      return Invalid(name,
                     "use snake_case: [a-z_][a-z0-9_]* (no capitals, "
                     "no colons)");
    }
  }
  if (!absl::StartsWith(name, kMetricPrefix) &&
      !IsStandardProcessMetric(name)) {
    return Invalid(name, absl::StrCat("must start with '", kMetricPrefix, "'"));
  }
  bool total = absl::EndsWith(name, "_total");
  if (type == MetricType::kCounter && !total) {
    return Invalid(name, "a counter's name ends in _total");
  }
  if (type != MetricType::kCounter && total) {
    return Invalid(name, "only counters end in _total");
  }
  if (type == MetricType::kHistogram &&
      (absl::EndsWith(name, "_bucket") || absl::EndsWith(name, "_sum") ||
       absl::EndsWith(name, "_count"))) {
    return Invalid(name,
                   "a histogram's series add _bucket, _sum and _count; its "
                   "name must not end in one");
  }
  std::vector<absl::string_view> parts = absl::StrSplit(name, '_');
  for (absl::string_view part : parts) {
    for (absl::string_view abbreviation : kUnitAbbreviations) {
      if (part == abbreviation) {
        return Invalid(name, absl::StrCat("'", part,
                                          "' abbreviates a unit; spell out "
                                          "the base unit (seconds, bytes)"));
      }
    }
    for (const NonBaseUnit& unit : kNonBaseUnits) {
      if (part == unit.unit) {
        return Invalid(name, absl::StrCat("use the base unit '", unit.base,
                                          "' instead of '", unit.unit, "'"));
      }
    }
    for (absl::string_view word : kTypeWords) {
      if (part == word) {
        return Invalid(name, absl::StrCat("the type word '", word,
                                          "' does not belong in a name"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLabelNames(absl::Span<const std::string> label_names) {
  std::set<absl::string_view> seen;
  for (const std::string& label : label_names) {
    bool ok = !label.empty();
    for (size_t i = 0; ok && i < label.size(); ++i) {
      char c = label[i];
      ok = absl::ascii_isalpha(c) || c == '_' ||
           (i > 0 && absl::ascii_isdigit(c));
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label name '", label, "' is not [a-zA-Z_][a-zA-Z0-9_]*"));
    }
    if (absl::StartsWith(label, "__")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label name '", label, "': names starting with __ are reserved"));
    }
    if (label == "le" || label == "quantile") {
      return absl::InvalidArgumentError(
          absl::StrCat("label name '", label,
                       "' is reserved for histogram and summary buckets"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("label name '", label, "' appears twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve::metrics
