#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pdserve::loadgen {
namespace {

using json = nlohmann::json;

class TokenSource {
 public:
  TokenSource(const WorkloadOptions& o, uint64_t seed)
      : rng_(seed), ids_(o.min_token_id, o.vocab_size - 1) {}
  void Append(int32_t n, std::vector<uint32_t>* out) {
    for (int32_t i = 0; i < n; ++i) out->push_back(ids_(rng_));
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::uniform_int_distribution<uint32_t> ids_;
};

absl::Status ValidateCommon(const WorkloadOptions& o) {
  if (o.min_token_id < 0 || o.vocab_size <= o.min_token_id + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ids from ", o.min_token_id, " below vocab_size ",
                     o.vocab_size, " leave no choice"));
  }
  if (o.kind != WorkloadKind::kTrace) {
    if (o.num_requests <= 0) {
      return absl::InvalidArgumentError("num_requests must be positive");
    }
    if (o.prompt_tokens <= 0 || o.output_tokens <= 0) {
      return absl::InvalidArgumentError(
          "prompt_tokens and output_tokens must be positive");
    }
  }
  if (o.range_ratio < 0 || o.range_ratio >= 1 || o.output_range_ratio >= 1) {
    return absl::InvalidArgumentError("range ratios must be in [0, 1)");
  }
  return absl::OkStatus();
}

// Uniform in [(1 - ratio) x, (1 + ratio) x], at least 1.
int32_t Around(int32_t x, double ratio, std::mt19937_64& rng) {
  const int32_t lo = std::max<int32_t>(1, std::floor(x * (1 - ratio)));
  const int32_t hi = std::max<int32_t>(lo, std::ceil(x * (1 + ratio)));
  return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
}

// At most `max`: a trace line asking for 1e30 tokens is an error, not an
// allocation.
absl::StatusOr<int64_t> NonNegativeInt(const json& line, const char* key,
                                       double max, const std::string& where) {
  auto it = line.find(key);
  if (it == line.end() || !it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" must be a number"));
  }
  const double v = it->get<double>();
  if (v < 0 || v != std::floor(v) || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": \"", key, "\" must be a whole number in [0, ", max, "]"));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<std::vector<BenchRequest>> LoadTrace(const WorkloadOptions& o) {
  std::ifstream in(o.trace_path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read trace ", o.trace_path));
  }
  if (o.trace_speedup <= 0 || o.trace_block_tokens <= 0) {
    return absl::InvalidArgumentError(
        "trace_speedup and trace_block_tokens must be positive");
  }
  TokenSource tokens(o, o.seed);
  std::vector<BenchRequest> requests;
  std::string text;
  int line_number = 0;
  while (std::getline(in, text)) {
    ++line_number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(o.trace_path, ":", line_number);
    const json line = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!line.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not a JSON object"));
    }
    BenchRequest r;
    r.index = requests.size();
    // A year of milliseconds; lengths far past any context window.
    auto timestamp = NonNegativeInt(line, "timestamp", 3.2e10, where);
    auto input = NonNegativeInt(line, "input_length", 1 << 24, where);
    auto output = NonNegativeInt(line, "output_length", 1 << 24, where);
    for (const auto* s : {&timestamp, &input, &output}) {
      if (!s->ok()) return s->status();
    }
    if (*input == 0 || *output == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input_length and output_length must be > 0"));
    }
    r.arrival = absl::Milliseconds(*timestamp / o.trace_speedup);
    r.output_tokens = *output;
    // Blocks named by hash_ids first: equal ids give equal tokens, in any
    // request, so shared prefixes are shared here too.
    if (auto ids = line.find("hash_ids"); ids != line.end()) {
      if (!ids->is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"hash_ids\" must be an array"));
      }
      for (const json& id : *ids) {
        if (!id.is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \"hash_ids\" must hold integers"));
        }
        if (r.prompt.size() >= size_t(*input)) break;
        TokenSource block(
            o, o.seed ^ (0x9e3779b97f4a7c15ULL * (id.get<uint64_t>() + 1)));
        block.Append(std::min<int64_t>(o.trace_block_tokens,
                                       *input - int64_t(r.prompt.size())),
                     &r.prompt);
      }
    }
    tokens.Append(*input - int64_t(r.prompt.size()), &r.prompt);
    requests.push_back(std::move(r));
  }
  if (requests.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace ", o.trace_path, " holds no requests"));
  }
  std::stable_sort(requests.begin(), requests.end(),
                   [](const BenchRequest& a, const BenchRequest& b) {
                     return *a.arrival < *b.arrival;
                   });
  // The earliest num_requests, whatever the file's order.
  if (o.num_requests > 0 && requests.size() > size_t(o.num_requests)) {
    requests.resize(o.num_requests);
  }
  for (size_t i = 0; i < requests.size(); ++i) requests[i].index = i;
  return requests;
}

}  // namespace

absl::StatusOr<WorkloadKind> ParseWorkloadKind(const std::string& name) {
  if (name == "fixed") return WorkloadKind::kFixed;
  if (name == "uniform") return WorkloadKind::kUniform;
  if (name == "shared_prefix") return WorkloadKind::kSharedPrefix;
  if (name == "trace") return WorkloadKind::kTrace;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown workload '", name,
                   "' (fixed, uniform, shared_prefix or trace)"));
}

absl::StatusOr<std::vector<BenchRequest>> MakeWorkload(
    const WorkloadOptions& o) {
  if (absl::Status s = ValidateCommon(o); !s.ok()) return s;
  if (o.kind == WorkloadKind::kTrace) return LoadTrace(o);
  if (o.kind == WorkloadKind::kSharedPrefix &&
      (o.num_prefixes <= 0 || o.prefix_tokens <= 0)) {
    return absl::InvalidArgumentError(
        "num_prefixes and prefix_tokens must be positive");
  }
  TokenSource tokens(o, o.seed);
  std::vector<std::vector<uint32_t>> prefixes;
  if (o.kind == WorkloadKind::kSharedPrefix) {
    prefixes.resize(o.num_prefixes);
    for (auto& p : prefixes) tokens.Append(o.prefix_tokens, &p);
  }
  std::vector<BenchRequest> requests(o.num_requests);
  for (int32_t i = 0; i < o.num_requests; ++i) {
    BenchRequest& r = requests[i];
    r.index = i;
    int32_t prompt = o.prompt_tokens;
    r.output_tokens = o.output_tokens;
    if (o.kind == WorkloadKind::kUniform) {
      prompt = Around(o.prompt_tokens, o.range_ratio, tokens.rng());
      r.output_tokens = Around(
          o.output_tokens,
          o.output_range_ratio >= 0 ? o.output_range_ratio : o.range_ratio,
          tokens.rng());
    }
    if (o.kind == WorkloadKind::kSharedPrefix) {
      r.prompt = prefixes[i % prefixes.size()];
    }
    tokens.Append(prompt, &r.prompt);
  }
  return requests;
}

std::string SyntheticChatTrace(const SyntheticTraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::lognormal_distribution<double> prompt(std::log(o.prompt_median),
                                             o.prompt_sigma);
  std::lognormal_distribution<double> output(std::log(o.output_median),
                                             o.output_sigma);
  std::exponential_distribution<double> gap(o.rate);
  // A few system prompts of 4-16 blocks; about half the requests start
  // with one of them.
  constexpr int kSystemPrompts = 4;
  std::uniform_int_distribution<int> system(0, 2 * kSystemPrompts - 1);
  auto clip = [&](double v, int32_t max) {
    return std::clamp<int32_t>(std::lround(v), o.min_tokens, max);
  };
  std::string out;
  double t_ms = 0;
  int64_t next_hash = 1000;
  for (int32_t i = 0; i < o.num_requests; ++i) {
    const int32_t input = clip(prompt(rng), o.max_prompt_tokens);
    json line = {{"timestamp", std::llround(t_ms)},
                 {"input_length", input},
                 {"output_length", clip(output(rng), o.max_output_tokens)}};
    json hashes = json::array();
    const int32_t blocks = (input + o.block_tokens - 1) / o.block_tokens;
    int32_t b = 0;
    if (const int s = system(rng); s < kSystemPrompts) {
      for (; b < std::min(blocks, 4 + 4 * s); ++b)
        hashes.push_back(s * 100 + b);
    }
    for (; b < blocks; ++b) hashes.push_back(next_hash++);
    line["hash_ids"] = std::move(hashes);
    absl::StrAppend(&out, line.dump(), "\n");
    t_ms += 1000.0 * gap(rng);
  }
  return out;
}

}  // namespace pdserve::loadgen
