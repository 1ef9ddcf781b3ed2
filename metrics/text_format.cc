#include "metrics/text_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pdserve::metrics {
namespace {

void AppendValue(std::string* out, double v) {
  if (std::isnan(v)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(v)) {
    out->append(v > 0 ? "+Inf" : "-Inf");
    return;
  }
  // Go's strconv.FormatFloat(v, 'g', -1, 64), as Prometheus' own clients
  // write values and "le" bounds: the shortest digits that read back to the
  // same double, in exponent form when the exponent is below -4 or at least
  // 6 ("1e-05", "0.0005", "123456", "1.5e+06"). "le" is compared as a
  // string, so the same bound must be written the same way by every
  // exporter.
  char buf[64];
  std::to_chars_result r =
      std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const char* e = std::find(buf, r.ptr, 'e');
  int exponent = 0;
  std::from_chars(e + (e[1] == '+' ? 2 : 1), r.ptr, exponent);
  if (exponent < -4 || exponent >= 6) {
    out->append(buf, r.ptr);
    return;
  }
  r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
  out->append(buf, r.ptr);
}

void AppendEscaped(std::string* out, absl::string_view text, bool quotes) {
  for (char c : text) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (quotes && c == '"') {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

// `name{a="x",b="y"[,le="bound"]} `: the labels part is left out when
// there are none.
void AppendSeriesName(std::string* out, absl::string_view name,
                      absl::string_view suffix,
                      const std::vector<std::string>& label_names,
                      const std::vector<std::string>& label_values,
                      const std::string* le) {
  absl::StrAppend(out, name, suffix);
  if (!label_names.empty() || le != nullptr) {
    out->push_back('{');
    for (size_t i = 0; i < label_names.size(); ++i) {
      if (i > 0) out->push_back(',');
      absl::StrAppend(out, label_names[i], "=\"");
      AppendEscaped(out, label_values[i], /*quotes=*/true);
      out->push_back('"');
    }
    if (le != nullptr) {
      absl::StrAppend(out, label_names.empty() ? "" : ",", "le=\"", *le, "\"");
    }
    out->push_back('}');
  }
  out->push_back(' ');
}

void AppendHistogram(std::string* out, const FamilySnapshot& f,
                     const SeriesSnapshot& s) {
  std::vector<std::string> les;
  les.reserve(f.upper_bounds.size() + 1);
  for (double bound : f.upper_bounds) les.push_back(FormatValue(bound));
  les.push_back("+Inf");
  for (size_t i = 0; i < les.size() && i < s.cumulative_counts.size(); ++i) {
    AppendSeriesName(out, f.name, "_bucket", f.label_names, s.label_values,
                     &les[i]);
    absl::StrAppend(out, s.cumulative_counts[i], "\n");
  }
  AppendSeriesName(out, f.name, "_sum", f.label_names, s.label_values, nullptr);
  AppendValue(out, s.sum);
  out->push_back('\n');
  AppendSeriesName(out, f.name, "_count", f.label_names, s.label_values,
                   nullptr);
  absl::StrAppend(
      out, s.cumulative_counts.empty() ? 0 : s.cumulative_counts.back(), "\n");
}

}  // namespace

std::string FormatValue(double v) {
  std::string out;
  AppendValue(&out, v);
  return out;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  AppendEscaped(&out, value, /*quotes=*/true);
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  AppendEscaped(&out, help, /*quotes=*/false);
  return out;
}

std::string RenderText(absl::Span<const FamilySnapshot> families) {
  std::string out;
  for (const FamilySnapshot& f : families) {
    absl::StrAppend(&out, "# HELP ", f.name, " ");
    AppendEscaped(&out, f.help, /*quotes=*/false);
    absl::StrAppend(&out, "\n# TYPE ", f.name, " ", MetricTypeName(f.type),
                    "\n");
    for (const SeriesSnapshot& s : f.series) {
      if (f.type == MetricType::kHistogram) {
        AppendHistogram(&out, f, s);
        continue;
      }
      AppendSeriesName(&out, f.name, "", f.label_names, s.label_values,
                       nullptr);
      AppendValue(&out, s.value);
      out.push_back('\n');
    }
  }
  return out;
}

std::string RenderText(const Registry& registry) {
  return RenderText(registry.Collect());
}

}  // namespace pdserve::metrics
