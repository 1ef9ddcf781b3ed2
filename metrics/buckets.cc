#include "metrics/buckets.h"

#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace pdserve::metrics {

absl::Status CheckBuckets(absl::Span<const double> upper_bounds) {
  if (upper_bounds.empty()) {
    return absl::InvalidArgumentError("a histogram needs at least one bucket");
  }
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket bound ", upper_bounds[i],
                       " is not finite (the +Inf bucket is implicit)"));
    }
    if (i > 0 && !(upper_bounds[i] > upper_bounds[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket bounds must increase: ", upper_bounds[i],
                       " follows ", upper_bounds[i - 1]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ExponentialBuckets(double start,
                                                       double factor,
                                                       int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("exponential buckets need start > 0, factor > 1 and "
                     "count >= 1; got ",
                     start, ", ", factor, ", ", count));
  }
  std::vector<double> out(count);
  for (int i = 0; i < count; ++i) out[i] = start * std::pow(factor, i);
  PD_RETURN_IF_ERROR(CheckBuckets(out));
  return out;
}

absl::StatusOr<std::vector<double>> ExponentialBucketsRange(double min,
                                                            double max,
                                                            int count) {
  if (!(min > 0) || !(max > min) || count < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("exponential bucket range needs 0 < min < max and "
                     "count >= 2; got ",
                     min, ", ", max, ", ", count));
  }
  absl::StatusOr<std::vector<double>> out =
      ExponentialBuckets(min, std::pow(max / min, 1.0 / (count - 1)), count);
  // Rounding must not leave the last bound a hair off the asked maximum.
  if (out.ok()) out->back() = max;
  return out;
}

absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width,
                                                  int count) {
  if (!(width > 0) || count < 1 || !std::isfinite(start)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "linear buckets need a finite start, width > 0 and count >= 1; got ",
        start, ", ", width, ", ", count));
  }
  std::vector<double> out(count);
  for (int i = 0; i < count; ++i) out[i] = start + width * i;
  PD_RETURN_IF_ERROR(CheckBuckets(out));
  return out;
}

absl::StatusOr<std::vector<double>> ParseBuckets(absl::string_view text) {
  std::vector<double> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    double v = 0;
    if (!absl::SimpleAtod(item, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket bound '", item, "' in '", text, "' is not a number"));
    }
    out.push_back(v);
  }
  PD_RETURN_IF_ERROR(CheckBuckets(out));
  return out;
}

std::vector<double> DefaultItlBuckets() {
  return ExponentialBuckets(0.0005, 2, 14).value();
}

std::vector<double> DefaultTtftBuckets() {
  return ExponentialBucketsRange(0.001, 600, 30).value();
}

}  // namespace pdserve::metrics
