// Metrics of a load run: latency distributions, throughput, SLO attainment
// and goodput, as text and JSON.
//
// Definitions (vLLM's and DistServe's):
//   TTFT  send -> first output token;  TPOT  (e2e - TTFT) / (tokens - 1);
//   ITL   gaps between output chunks;  E2E   send -> end of the stream;
//   goodput  completed requests per second whose TTFT <= slo_ttft_ms,
//            TPOT <= slo_tpot_ms and longest inter-token gap <=
//            slo_max_itl_ms (an unset SLO holds for every request): a stream
//            that stalls for a whole prefill chunk misses the last one
//            however good its mean TPOT;
//   SLO attainment  the fraction of all requests sent that met them all.
// Distributions are over successful requests only; percentiles interpolate
// linearly between order statistics (numpy's default).
#ifndef PDSERVE_LOADGEN_METRICS_H_
#define PDSERVE_LOADGEN_METRICS_H_

#include <map>
#include <string>
#include <vector>

#include "loadgen/runner.h"
#include "nlohmann/json.hpp"

namespace pdserve::loadgen {

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution Describe(std::vector<double> values);
// q in [0, 1]; 0 for no values.
double Percentile(std::vector<double> values, double q);

// A request's longest gap between two output chunks, ms (0 for none).
double LongestGapMs(const RequestRecord& r);

struct Slo {
  double ttft_ms = 0;     // 0: no TTFT target
  double tpot_ms = 0;     // 0: no TPOT target
  double max_itl_ms = 0;  // 0: no target for a request's longest gap
  bool Met(const RequestRecord& r) const;
};

struct LoadSummary {
  double offered_rate = 0;  // requests/s asked for (inf: all at once)
  int32_t max_concurrency = 0;
  int64_t sent = 0, completed = 0, failed = 0;
  std::map<std::string, int64_t> failures;  // by kind
  double duration_s = 0;
  double request_throughput = 0;  // completed / duration
  double input_token_throughput = 0;
  double output_token_throughput = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
  // Each request's longest inter-token gap (what slo_max_itl_ms judges).
  Distribution max_itl_ms;
  Slo slo;
  int64_t met_slo = 0;
  double goodput = 0;         // requests/s
  double slo_attainment = 0;  // of sent
};

LoadSummary Summarize(const LoadResult& result, const Slo& slo,
                      double offered_rate, int32_t max_concurrency);

// A table for people (vLLM's layout, plus goodput and failures).
std::string FormatSummary(const LoadSummary& summary);

nlohmann::json ToJson(const LoadSummary& summary);
// Text for a JSON file: error messages cut at 200 bytes (or sent so by a
// server) may hold broken UTF-8, which is replaced rather than thrown on.
std::string DumpJson(const nlohmann::json& value);
nlohmann::json ToJson(const std::vector<RequestRecord>& records);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_LOADGEN_METRICS_H_
