#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pdserve::loadgen {

using json = nlohmann::json;

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = q * (values.size() - 1);
  const size_t lo = std::floor(rank);
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - lo);
}

Distribution Describe(std::vector<double> values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  d.p50 = Percentile(values, 0.50);
  d.p90 = Percentile(values, 0.90);
  d.p99 = Percentile(values, 0.99);
  d.max = values.back();
  return d;
}

double LongestGapMs(const RequestRecord& r) {
  return r.itl_ms.empty() ? 0
                          : *std::max_element(r.itl_ms.begin(), r.itl_ms.end());
}

bool Slo::Met(const RequestRecord& r) const {
  if (!r.ok()) return false;
  if (ttft_ms > 0 && absl::ToDoubleMilliseconds(r.ttft) > ttft_ms) return false;
  if (tpot_ms > 0 && absl::ToDoubleMilliseconds(r.tpot()) > tpot_ms) {
    return false;
  }
  if (max_itl_ms > 0 && LongestGapMs(r) > max_itl_ms) return false;
  return true;
}

LoadSummary Summarize(const LoadResult& result, const Slo& slo,
                      double offered_rate, int32_t max_concurrency) {
  LoadSummary s;
  s.offered_rate = offered_rate;
  s.max_concurrency = max_concurrency;
  s.slo = slo;
  s.sent = result.records.size();
  s.duration_s = absl::ToDoubleSeconds(result.duration);
  std::vector<double> ttft, tpot, itl, e2e, max_itl;
  int64_t input_tokens = 0, output_tokens = 0;
  for (const RequestRecord& r : result.records) {
    if (!r.ok()) {
      ++s.failed;
      ++s.failures[r.error_kind];
      continue;
    }
    ++s.completed;
    s.met_slo += slo.Met(r);
    input_tokens += r.prompt_tokens;
    output_tokens += r.output_tokens;
    ttft.push_back(absl::ToDoubleMilliseconds(r.ttft));
    if (r.output_tokens > 1)
      tpot.push_back(absl::ToDoubleMilliseconds(r.tpot()));
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    if (!r.itl_ms.empty()) max_itl.push_back(LongestGapMs(r));
    e2e.push_back(absl::ToDoubleMilliseconds(r.e2e));
  }
  if (s.duration_s > 0) {
    s.request_throughput = s.completed / s.duration_s;
    s.input_token_throughput = input_tokens / s.duration_s;
    s.output_token_throughput = output_tokens / s.duration_s;
    s.goodput = s.met_slo / s.duration_s;
  }
  if (s.sent > 0) s.slo_attainment = double(s.met_slo) / s.sent;
  s.ttft_ms = Describe(std::move(ttft));
  s.tpot_ms = Describe(std::move(tpot));
  s.itl_ms = Describe(std::move(itl));
  s.e2e_ms = Describe(std::move(e2e));
  s.max_itl_ms = Describe(std::move(max_itl));
  return s;
}

namespace {

std::string Rate(double rate) {
  return std::isfinite(rate) ? absl::StrFormat("%.2f", rate) : "inf";
}

void AppendDistribution(std::string* out, const char* name,
                        const Distribution& d) {
  absl::StrAppendFormat(out,
                        "%-5s (ms)   mean %9.2f  p50 %9.2f  p90 %9.2f  "
                        "p99 %9.2f  max %9.2f\n",
                        name, d.mean, d.p50, d.p90, d.p99, d.max);
}

json ToJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"p50", d.p50},
          {"p90", d.p90},     {"p99", d.p99},   {"max", d.max}};
}

}  // namespace

std::string FormatSummary(const LoadSummary& s) {
  std::string out;
  absl::StrAppendFormat(
      &out,
      "request rate %s/s (max concurrency %s): %d sent, %d completed, %d "
      "failed in %.2f s\n",
      Rate(s.offered_rate),
      s.max_concurrency > 0 ? absl::StrCat(s.max_concurrency) : "none", s.sent,
      s.completed, s.failed, s.duration_s);
  for (const auto& [kind, count] : s.failures) {
    absl::StrAppendFormat(&out, "  failed %-20s %d\n", kind, count);
  }
  absl::StrAppendFormat(&out,
                        "throughput    %.2f req/s, %.1f input tok/s, %.1f "
                        "output tok/s\n",
                        s.request_throughput, s.input_token_throughput,
                        s.output_token_throughput);
  AppendDistribution(&out, "TTFT", s.ttft_ms);
  AppendDistribution(&out, "TPOT", s.tpot_ms);
  AppendDistribution(&out, "ITL", s.itl_ms);
  AppendDistribution(&out, "E2E", s.e2e_ms);
  AppendDistribution(&out, "ITLmx", s.max_itl_ms);
  auto target = [](double ms) {
    return ms > 0 ? absl::StrCat(ms) : std::string("any");
  };
  absl::StrAppendFormat(
      &out,
      "goodput       %.2f req/s (SLO: TTFT <= %s ms, TPOT <= %s ms, longest "
      "gap <= %s ms; %.1f%% of requests met it)\n",
      s.goodput, target(s.slo.ttft_ms), target(s.slo.tpot_ms),
      target(s.slo.max_itl_ms), 100.0 * s.slo_attainment);
  return out;
}

json ToJson(const LoadSummary& s) {
  json failures = json::object();
  for (const auto& [kind, count] : s.failures) failures[kind] = count;
  return {
      {"request_rate",
       std::isfinite(s.offered_rate) ? json(s.offered_rate) : json("inf")},
      {"max_concurrency", s.max_concurrency},
      {"sent", s.sent},
      {"completed", s.completed},
      {"failed", s.failed},
      {"failures", failures},
      {"duration_s", s.duration_s},
      {"request_throughput", s.request_throughput},
      {"input_token_throughput", s.input_token_throughput},
      {"output_token_throughput", s.output_token_throughput},
      {"ttft_ms", ToJson(s.ttft_ms)},
      {"tpot_ms", ToJson(s.tpot_ms)},
      {"itl_ms", ToJson(s.itl_ms)},
      {"e2e_ms", ToJson(s.e2e_ms)},
      {"max_itl_ms", ToJson(s.max_itl_ms)},
      {"slo_ttft_ms", s.slo.ttft_ms},
      {"slo_tpot_ms", s.slo.tpot_ms},
      {"slo_max_itl_ms", s.slo.max_itl_ms},
      {"met_slo", s.met_slo},
      {"goodput", s.goodput},
      {"slo_attainment", s.slo_attainment},
  };
}

std::string DumpJson(const json& value) {
  return value.dump(1, ' ', false, json::error_handler_t::replace);
}

json ToJson(const std::vector<RequestRecord>& records) {
  json out = json::array();
  for (const RequestRecord& r : records) {
    json one = {{"index", r.index},
                {"prompt_tokens", r.prompt_tokens},
                {"output_tokens", r.output_tokens},
                {"sent_at_ms", absl::ToDoubleMilliseconds(r.sent_at)},
                {"ok", r.ok()}};
    if (r.ok()) {
      one["ttft_ms"] = absl::ToDoubleMilliseconds(r.ttft);
      one["tpot_ms"] = absl::ToDoubleMilliseconds(r.tpot());
      one["e2e_ms"] = absl::ToDoubleMilliseconds(r.e2e);
      one["itl_ms"] = r.itl_ms;
      if (r.server_queue_ms + r.server_prefill_ms > 0) {
        one["server_queue_ms"] = r.server_queue_ms;
        one["server_prefill_ms"] = r.server_prefill_ms;
        one["server_transfer_tail_ms"] = r.server_transfer_tail_ms;
      }
    } else {
      one["error_kind"] = r.error_kind;
      one["error"] = r.error;
    }
    out.push_back(std::move(one));
  }
  return out;
}

}  // namespace pdserve::loadgen
