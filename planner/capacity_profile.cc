#include "planner/capacity_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

using json = nlohmann::json;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("capacity profile: ", field, " ", what));
}

const json* Find(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

absl::StatusOr<const json*> Object(const json& parent, const char* key,
                                   const std::string& where) {
  const json* v = Find(parent, key);
  if (v == nullptr || !v->is_object()) {
    return Bad(where + key, "must be an object");
  }
  return v;
}

// A finite number > 0 (>= 0 when zero_ok); `fallback` when absent and
// optional.
absl::StatusOr<double> Number(const json& parent, const char* key,
                              const std::string& where, bool zero_ok = false,
                              std::optional<double> fallback = std::nullopt) {
  const json* v = Find(parent, key);
  if (v == nullptr && fallback.has_value()) return *fallback;
  if (v == nullptr || !v->is_number()) {
    return Bad(where + key, "must be a number");
  }
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < 0 || (!zero_ok && x == 0)) {
    return Bad(where + key, absl::StrCat("must be ", zero_ok ? ">= 0" : "> 0",
                                         " (is ", v->dump(), ")"));
  }
  return x;
}

std::string Text(const json& parent, const char* key, std::string fallback) {
  const json* v = Find(parent, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : fallback;
}

absl::StatusOr<std::vector<double>> IncreasingNumbers(
    const json& parent, const char* key, const std::string& where) {
  const json* v = Find(parent, key);
  if (v == nullptr || !v->is_array() || v->empty()) {
    return Bad(where + key, "must be a non-empty array of numbers");
  }
  std::vector<double> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& x = (*v)[i];
    if (!x.is_number() || !std::isfinite(x.get<double>()) ||
        x.get<double>() <= 0) {
      return Bad(absl::StrCat(where, key, "[", i, "]"), "must be a number > 0");
    }
    if (!out.empty() && x.get<double>() <= out.back()) {
      return Bad(absl::StrCat(where, key, "[", i, "]"),
                 "must be larger than the one before (increasing)");
    }
    out.push_back(x.get<double>());
  }
  return out;
}

}  // namespace

namespace {

double InterpolateN(const double* xs, const double* ys, size_t n, double x) {
  if (n == 1 || x <= xs[0]) return ys[0];
  if (x >= xs[n - 1]) {
    const double slope = (ys[n - 1] - ys[n - 2]) / (xs[n - 1] - xs[n - 2]);
    return std::max(ys[n - 1], ys[n - 1] + slope * (x - xs[n - 1]));
  }
  const size_t i = std::upper_bound(xs, xs + n, x) - xs;
  const double t = (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
  return ys[i - 1] + t * (ys[i] - ys[i - 1]);
}

}  // namespace

double Interpolate(const std::vector<double>& xs, const std::vector<double>& ys,
                   double x) {
  return InterpolateN(xs.data(), ys.data(), xs.size(), x);
}

absl::StatusOr<CapacityProfile> CapacityProfile::Parse(
    const std::string& json_text) {
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(
        "capacity profile: not a JSON object (is the file JSON?)");
  }
  const json* version = Find(root, "version");
  if (version == nullptr || !version->is_number_integer() ||
      version->get<int>() != 1) {
    return Bad("version", "must be 1 (the only format this build reads)");
  }
  CapacityProfile p;
  p.model_ = Text(root, "model", "");
  p.hardware_ = Text(root, "hardware", "");
  p.source_ = Text(root, "source", "");
  p.cost_unit_ = Text(root, "cost_unit", "workers");

  PD_ASSIGN_OR_RETURN(const json* prefill, Object(root, "prefill", ""));
  PD_ASSIGN_OR_RETURN(p.prefill_cost_,
                      Number(*prefill, "cost", "prefill.", false, 1.0));
  PD_ASSIGN_OR_RETURN(p.prefill_load_time_s_,
                      Number(*prefill, "load_time_s", "prefill.", true, 0.0));
  const json* points = Find(*prefill, "points");
  if (points == nullptr || !points->is_array() || points->empty()) {
    return Bad("prefill.points", "must be a non-empty array");
  }
  for (size_t i = 0; i < points->size(); ++i) {
    const std::string where = absl::StrCat("prefill.points[", i, "].");
    const json& point = (*points)[i];
    if (!point.is_object()) return Bad(where, "must be an object");
    PrefillPoint pp;
    PD_ASSIGN_OR_RETURN(pp.prompt_tokens,
                        Number(point, "prompt_tokens", where));
    PD_ASSIGN_OR_RETURN(pp.tokens_per_s, Number(point, "tokens_per_s", where));
    PD_ASSIGN_OR_RETURN(pp.ttft_s, Number(point, "ttft_s", where));
    if (!p.prefill_points_.empty() &&
        pp.prompt_tokens <= p.prefill_points_.back().prompt_tokens) {
      return Bad(where + "prompt_tokens",
                 "must be larger than the point before's (increasing)");
    }
    p.prefill_points_.push_back(pp);
    p.prefill_tokens_.push_back(pp.prompt_tokens);
    p.prefill_busy_s_.push_back(pp.prompt_tokens / pp.tokens_per_s);
    p.prefill_ttft_s_.push_back(pp.ttft_s);
  }

  PD_ASSIGN_OR_RETURN(const json* decode, Object(root, "decode", ""));
  PD_ASSIGN_OR_RETURN(p.decode_cost_,
                      Number(*decode, "cost", "decode.", false, 1.0));
  PD_ASSIGN_OR_RETURN(p.decode_load_time_s_,
                      Number(*decode, "load_time_s", "decode.", true, 0.0));
  PD_ASSIGN_OR_RETURN(p.batch_sizes_,
                      IncreasingNumbers(*decode, "batch_sizes", "decode."));
  PD_ASSIGN_OR_RETURN(p.context_tokens_,
                      IncreasingNumbers(*decode, "context_tokens", "decode."));
  if (p.batch_sizes_.size() > 32) {
    return Bad("decode.batch_sizes", "may hold at most 32 sizes");
  }
  if (p.batch_sizes_.front() != 1) {
    return Bad("decode.batch_sizes", "must start at 1 (one stream's ITL)");
  }
  PD_ASSIGN_OR_RETURN(
      const double max_batch,
      Number(*decode, "max_batch", "decode.", false, p.batch_sizes_.back()));
  if (max_batch != std::floor(max_batch)) {
    return Bad("decode.max_batch", "must be a whole number");
  }
  p.max_batch_ = static_cast<int>(max_batch);
  PD_ASSIGN_OR_RETURN(p.kv_capacity_tokens_,
                      Number(*decode, "kv_capacity_tokens", "decode."));
  const json* itl = Find(*decode, "itl_s");
  if (itl == nullptr || !itl->is_array() ||
      itl->size() != p.batch_sizes_.size()) {
    return Bad("decode.itl_s",
               absl::StrCat("must be an array of ", p.batch_sizes_.size(),
                            " rows, one per batch size"));
  }
  for (size_t i = 0; i < itl->size(); ++i) {
    const json& row = (*itl)[i];
    if (!row.is_array() || row.size() != p.context_tokens_.size()) {
      return Bad(absl::StrCat("decode.itl_s[", i, "]"),
                 absl::StrCat("must hold ", p.context_tokens_.size(),
                              " numbers, one per context length"));
    }
    std::vector<double> values;
    for (size_t j = 0; j < row.size(); ++j) {
      const json& x = row[j];
      const std::string where = absl::StrCat("decode.itl_s[", i, "][", j, "]");
      if (!x.is_number() || !std::isfinite(x.get<double>()) ||
          x.get<double>() <= 0) {
        return Bad(where, "must be a number > 0 (seconds)");
      }
      // A larger batch's step cannot be faster than a smaller one's: a
      // profile saying so was mismeasured, and the planner would pack
      // batches on it.
      if (i > 0 && x.get<double>() < p.itl_s_[i - 1][j]) {
        return Bad(where, "is below the smaller batch's step time");
      }
      values.push_back(x.get<double>());
    }
    p.itl_s_.push_back(std::move(values));
  }
  return p;
}

absl::StatusOr<CapacityProfile> CapacityProfile::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read capacity profile ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto profile = Parse(text.str());
  if (!profile.ok()) {
    return absl::Status(profile.status().code(),
                        absl::StrCat(path, ": ", profile.status().message()));
  }
  return profile;
}

double CapacityProfile::PrefillSeconds(double tokens) const {
  // Below the first point: the first point's throughput (time in
  // proportion), so that short prompts are not all as slow as the
  // shortest measured one; above, times extrapolate.
  if (tokens < prefill_tokens_.front()) {
    return tokens / prefill_points_.front().tokens_per_s;
  }
  return Interpolate(prefill_tokens_, prefill_busy_s_, tokens);
}

double CapacityProfile::PrefillTokensPerSecond(double tokens) const {
  return tokens / std::max(PrefillSeconds(tokens), 1e-12);
}

double CapacityProfile::LoneTtftSeconds(double tokens) const {
  return Interpolate(prefill_tokens_, prefill_ttft_s_, tokens);
}

double CapacityProfile::DecodeStepSeconds(double batch,
                                          double context_tokens) const {
  // Along the context axis for each batch row, then along the batch axis
  // (no allocation: the simulator calls this once per decode step).
  constexpr size_t kRows = 32;
  double by_batch[kRows];
  const size_t rows = std::min(kRows, batch_sizes_.size());
  for (size_t i = 0; i < rows; ++i) {
    by_batch[i] = Interpolate(context_tokens_, itl_s_[i], context_tokens);
  }
  return InterpolateN(batch_sizes_.data(), by_batch, rows,
                      std::max(1.0, batch));
}

double CapacityProfile::MaxBatchForItl(double itl_s,
                                       double context_tokens) const {
  if (DecodeStepSeconds(1, context_tokens) > itl_s) return 0;
  double limit = max_batch_;
  if (context_tokens > 0) {
    limit = std::min(limit, kv_capacity_tokens_ / context_tokens);
  }
  if (limit < 1) return 0;
  if (DecodeStepSeconds(limit, context_tokens) <= itl_s) return limit;
  // Step time grows with the batch (Parse checks the grid), so bisect.
  double lo = 1, hi = limit;
  for (int i = 0; i < 60 && hi - lo > 1e-6; ++i) {
    const double mid = 0.5 * (lo + hi);
    (DecodeStepSeconds(mid, context_tokens) <= itl_s ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace pdserve::planner
