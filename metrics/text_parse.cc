#include "metrics/text_parse.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pdserve::metrics {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

void SkipBlanks(absl::string_view* s) {
  while (!s->empty() && IsBlank(s->front())) s->remove_prefix(1);
}

// Up to the next blank or the end.
absl::string_view NextToken(absl::string_view* s) {
  size_t n = 0;
  while (n < s->size() && !IsBlank((*s)[n])) ++n;
  absl::string_view token = s->substr(0, n);
  s->remove_prefix(n);
  return token;
}

bool IsNameStart(char c, bool colon) {
  return absl::ascii_isalpha(c) || c == '_' || (colon && c == ':');
}
bool IsNameChar(char c, bool colon) {
  return IsNameStart(c, colon) || absl::ascii_isdigit(c);
}

// A metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or label name (no colons) at the
// start of `s`; empty when there is none.
absl::string_view ReadName(absl::string_view* s, bool colon) {
  if (s->empty() || !IsNameStart(s->front(), colon)) return {};
  size_t n = 1;
  while (n < s->size() && IsNameChar((*s)[n], colon)) ++n;
  absl::string_view name = s->substr(0, n);
  s->remove_prefix(n);
  return name;
}

// Go's strconv.ParseFloat as Prometheus reads values: decimal or exponent
// forms with an optional sign, and Inf / NaN in any case.
bool ParseFloat(absl::string_view token, double* out) {
  const std::string lower = absl::AsciiStrToLower(token);
  if (lower == "nan") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (lower == "inf" || lower == "+inf") {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (lower == "-inf") {
    *out = -std::numeric_limits<double>::infinity();
    return true;
  }
  absl::string_view digits = token;
  if (absl::StartsWith(digits, "+")) digits.remove_prefix(1);
  if (digits.empty() || digits.front() == '+' ||
      absl::StartsWithIgnoreCase(digits, "inf") ||
      absl::StartsWithIgnoreCase(digits, "-inf") ||
      absl::StartsWithIgnoreCase(digits, "nan") ||
      absl::StartsWithIgnoreCase(digits, "-nan")) {
    return false;
  }
  const std::from_chars_result r =
      std::from_chars(digits.data(), digits.data() + digits.size(), *out,
                      std::chars_format::general);
  return r.ec == std::errc() && r.ptr == digits.data() + digits.size();
}

bool ParseTimestamp(absl::string_view token) {
  if (absl::StartsWith(token, "+")) token.remove_prefix(1);
  int64_t ms = 0;
  const std::from_chars_result r =
      std::from_chars(token.data(), token.data() + token.size(), ms);
  return !token.empty() && r.ec == std::errc() &&
         r.ptr == token.data() + token.size();
}

std::string LabelsText(const Labels& labels) {
  if (labels.empty()) return "";
  return absl::StrCat("{",
                      absl::StrJoin(labels, ",",
                                    [](std::string* out, const auto& kv) {
                                      absl::StrAppend(out, kv.first, "=\"",
                                                      kv.second, "\"");
                                    }),
                      "}");
}

class Parser {
 public:
  absl::StatusOr<ParsedMetrics> Parse(absl::string_view text) {
    int line_number = 0;
    while (!text.empty()) {
      ++line_number;
      const size_t end = text.find('\n');
      absl::string_view line = text.substr(0, end);
      text.remove_prefix(end == absl::string_view::npos ? text.size()
                                                        : end + 1);
      line_ = line_number;
      const absl::Status status = ParseLine(line);
      if (!status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_number, ": ", status.message()));
      }
    }
    if (absl::Status status = Finish(); !status.ok()) return status;
    return std::move(out_);
  }

 private:
  struct FamilyState {
    bool typed = false;
    bool helped = false;
    bool sampled = false;
  };
  struct HistogramBuilder {
    Labels labels;
    int first_line = 0;
    std::map<double, double> buckets;  // upper bound -> cumulative count
    bool has_count = false;
    double count = 0;
    double sum = 0;
  };

  absl::Status ParseLine(absl::string_view line) {
    SkipBlanks(&line);
    while (!line.empty() && IsBlank(line.back())) line.remove_suffix(1);
    if (line.empty()) return absl::OkStatus();
    if (line.front() == '#') {
      line.remove_prefix(1);
      return ParseComment(line);
    }
    return ParseSample(line);
  }

  // "# HELP name text", "# TYPE name type"; any other comment is ignored.
  absl::Status ParseComment(absl::string_view rest) {
    SkipBlanks(&rest);
    const absl::string_view keyword = NextToken(&rest);
    if (keyword != "HELP" && keyword != "TYPE") return absl::OkStatus();
    SkipBlanks(&rest);
    const absl::string_view name = ReadName(&rest, /*colon=*/true);
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(keyword, " line without a valid metric name"));
    }
    if (!rest.empty() && !IsBlank(rest.front())) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid metric name in ", keyword, " line"));
    }
    SkipBlanks(&rest);
    size_t index = FamilyIndex(std::string(name));
    ParsedFamily& family = out_.families[index];
    FamilyState& state = states_[index];
    if (keyword == "HELP") {
      if (state.helped) {
        return absl::InvalidArgumentError(
            absl::StrCat("second HELP line for ", name));
      }
      state.helped = true;
      std::string help;
      for (size_t i = 0; i < rest.size(); ++i) {
        if (rest[i] != '\\') {
          help.push_back(rest[i]);
          continue;
        }
        if (i + 1 < rest.size() && rest[i + 1] == '\\') {
          help.push_back('\\');
        } else if (i + 1 < rest.size() && rest[i + 1] == 'n') {
          help.push_back('\n');
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("invalid escape sequence in HELP of ", name));
        }
        ++i;
      }
      family.help = std::move(help);
      return absl::OkStatus();
    }
    if (state.typed) {
      return absl::InvalidArgumentError(
          absl::StrCat("second TYPE line for ", name));
    }
    if (state.sampled) {
      return absl::InvalidArgumentError(
          absl::StrCat("TYPE line for ", name, " after its samples"));
    }
    const absl::string_view type = NextToken(&rest);
    SkipBlanks(&rest);
    static const auto* const kTypes = new std::map<std::string, ParsedType>{
        {"counter", ParsedType::kCounter},
        {"gauge", ParsedType::kGauge},
        {"histogram", ParsedType::kHistogram},
        {"summary", ParsedType::kSummary},
        {"untyped", ParsedType::kUntyped}};
    const auto it = kTypes->find(std::string(type));
    if (it == kTypes->end() || !rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown type '", type,
                                                     rest.empty() ? "" : " ",
                                                     rest, "' for ", name));
    }
    state.typed = true;
    family.type = it->second;
    return absl::OkStatus();
  }

  absl::Status ParseSample(absl::string_view line) {
    const absl::string_view name_view = ReadName(&line, /*colon=*/true);
    if (name_view.empty()) {
      return absl::InvalidArgumentError(
          "a sample must start with a metric name");
    }
    const std::string name(name_view);
    if (!line.empty() && !IsBlank(line.front()) && line.front() != '{') {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid character '", line.substr(0, 1),
                       "' after metric name ", name));
    }
    SkipBlanks(&line);
    Labels labels;
    if (!line.empty() && line.front() == '{') {
      line.remove_prefix(1);
      if (absl::Status s = ParseLabels(&line, name, &labels); !s.ok()) {
        return s;
      }
      SkipBlanks(&line);
    }
    const absl::string_view value_token = NextToken(&line);
    if (value_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", name, " has no value"));
    }
    double value = 0;
    if (!ParseFloat(value_token, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid value '", value_token, "' for ", name));
    }
    SkipBlanks(&line);
    if (!line.empty()) {
      const absl::string_view timestamp = NextToken(&line);
      SkipBlanks(&line);
      if (!ParseTimestamp(timestamp) || !line.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "invalid timestamp or trailing text after the value of ", name));
      }
    }
    if (!seen_series_.emplace(name, labels).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate series ", name, LabelsText(labels)));
    }
    return AddSample(name, std::move(labels), value);
  }

  // After the '{': `name="value"` pairs separated by commas (one trailing
  // comma allowed), up to and past the '}'.
  absl::Status ParseLabels(absl::string_view* line, const std::string& metric,
                           Labels* labels) {
    while (true) {
      SkipBlanks(line);
      if (line->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("unterminated label set of ", metric));
      }
      if (line->front() == '}') {
        line->remove_prefix(1);
        return absl::OkStatus();
      }
      const absl::string_view label = ReadName(line, /*colon=*/false);
      if (label.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid label name in ", metric));
      }
      SkipBlanks(line);
      if (line->empty() || line->front() != '=') {
        return absl::InvalidArgumentError(
            absl::StrCat("expected '=' after label ", label, " of ", metric));
      }
      line->remove_prefix(1);
      SkipBlanks(line);
      if (line->empty() || line->front() != '"') {
        return absl::InvalidArgumentError(absl::StrCat(
            "label ", label, " of ", metric, " needs a quoted value"));
      }
      line->remove_prefix(1);
      std::string value;
      bool closed = false;
      while (!line->empty()) {
        const char c = line->front();
        line->remove_prefix(1);
        if (c == '"') {
          closed = true;
          break;
        }
        if (c != '\\') {
          value.push_back(c);
          continue;
        }
        const char next = line->empty() ? '\0' : line->front();
        if (next == '\\' || next == '"') {
          value.push_back(next);
        } else if (next == 'n') {
          value.push_back('\n');
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "invalid escape sequence in label ", label, " of ", metric));
        }
        line->remove_prefix(1);
      }
      if (!closed) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unterminated value of label ", label, " of ", metric));
      }
      if (!labels->emplace(std::string(label), std::move(value)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("label ", label, " twice in ", metric));
      }
      SkipBlanks(line);
      if (!line->empty() && line->front() == ',') {
        line->remove_prefix(1);
      } else if (line->empty() || line->front() != '}') {
        return absl::InvalidArgumentError(absl::StrCat(
            "expected ',' or '}' after label ", label, " of ", metric));
      }
    }
  }

  absl::Status AddSample(const std::string& name, Labels labels, double value) {
    // A histogram's or summary's suffixed series belong to the family TYPE
    // named; any other name is a family of its own.
    for (const absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
      if (!absl::EndsWith(name, suffix)) continue;
      const std::string base = name.substr(0, name.size() - suffix.size());
      const auto it = index_.find(base);
      if (it == index_.end()) continue;
      ParsedFamily& family = out_.families[it->second];
      if (family.type == ParsedType::kHistogram) {
        states_[it->second].sampled = true;
        return AddHistogramSample(it->second, suffix, std::move(labels), value);
      }
      if (family.type == ParsedType::kSummary && suffix != "_bucket") {
        states_[it->second].sampled = true;
        family.samples.push_back({name, std::move(labels), value});
        return absl::OkStatus();
      }
    }
    const size_t index = FamilyIndex(name);
    ParsedFamily& family = out_.families[index];
    if (family.type == ParsedType::kHistogram) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram ", name, " has a sample without _bucket, _sum or _count"));
    }
    states_[index].sampled = true;
    family.samples.push_back({name, std::move(labels), value});
    return absl::OkStatus();
  }

  absl::Status AddHistogramSample(size_t index, absl::string_view suffix,
                                  Labels labels, double value) {
    const std::string& name = out_.families[index].name;
    double bound = 0;
    if (suffix == "_bucket") {
      const auto le = labels.find("le");
      if (le == labels.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "_bucket without an le label"));
      }
      if (!ParseFloat(le->second, &bound) || std::isnan(bound)) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, "_bucket has an invalid le \"", le->second, "\""));
      }
      labels.erase(le);
    }
    std::map<Labels, HistogramBuilder>& series = histograms_[index];
    auto [it, inserted] = series.try_emplace(labels);
    HistogramBuilder& h = it->second;
    if (inserted) {
      h.labels = labels;
      h.first_line = line_;
      histogram_order_[index].push_back(labels);
    }
    if (suffix == "_bucket") {
      if (!h.buckets.emplace(bound, value).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "two buckets with the same bound in ", name, LabelsText(labels)));
      }
    } else if (suffix == "_sum") {
      h.sum = value;
    } else {
      h.has_count = true;
      h.count = value;
    }
    return absl::OkStatus();
  }

  // Checks each histogram and moves it into its family.
  absl::Status Finish() {
    for (auto& [index, order] : histogram_order_) {
      ParsedFamily& family = out_.families[index];
      for (const Labels& labels : order) {
        HistogramBuilder& h = histograms_[index][labels];
        const std::string where =
            absl::StrCat("line ", h.first_line, ": histogram ", family.name,
                         LabelsText(labels));
        if (h.buckets.empty() || !std::isinf(h.buckets.rbegin()->first) ||
            h.buckets.rbegin()->first < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, " has no le=\"+Inf\" bucket"));
        }
        ParsedHistogram out;
        out.labels = labels;
        out.sum = h.sum;
        double previous = 0;
        for (const auto& [bound, count] : h.buckets) {
          if (count < previous || std::isnan(count)) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, ": bucket counts decrease at le=", bound));
          }
          previous = count;
          out.buckets.push_back({bound, count});
        }
        out.count = previous;
        if (h.has_count && h.count != previous) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": _count ", h.count,
                           " differs from the +Inf bucket ", previous));
        }
        family.histograms.push_back(std::move(out));
      }
    }
    return absl::OkStatus();
  }

  size_t FamilyIndex(const std::string& name) {
    const auto [it, inserted] = index_.try_emplace(name, out_.families.size());
    if (inserted) {
      out_.families.push_back({});
      out_.families.back().name = name;
      states_.push_back({});
    }
    return it->second;
  }

  int line_ = 0;
  ParsedMetrics out_;
  std::vector<FamilyState> states_;  // parallel to out_.families
  std::map<std::string, size_t> index_;
  std::set<std::pair<std::string, Labels>> seen_series_;
  std::map<size_t, std::map<Labels, HistogramBuilder>> histograms_;
  std::map<size_t, std::vector<Labels>> histogram_order_;
};

}  // namespace

const ParsedFamily* ParsedMetrics::Find(absl::string_view name) const {
  for (const ParsedFamily& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

absl::StatusOr<ParsedMetrics> ParseText(absl::string_view text) {
  return Parser().Parse(text);
}

const char* ParsedTypeName(ParsedType type) {
  switch (type) {
    case ParsedType::kCounter:
      return "counter";
    case ParsedType::kGauge:
      return "gauge";
    case ParsedType::kHistogram:
      return "histogram";
    case ParsedType::kSummary:
      return "summary";
    case ParsedType::kUntyped:
      return "untyped";
  }
  return "untyped";
}

}  // namespace pdserve::metrics
