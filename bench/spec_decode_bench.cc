// spec_decode_bench: what speculative decoding buys a decode worker.
//
// The offline engine (the engine a decode worker runs), one forward-pass
// thread (serving runs a worker per core), the default model, greedy
// decoding. Three workloads (bench/spec_prompts/*.txt, prompts separated by
// "=====" lines, sent as chat):
//   code_edit  - the prompt holds code the answer rewrites (n-gram drafts
//                find the answer in the prompt);
//   summarize  - a passage the answer summarizes (some quoting);
//   chat       - open questions (little to copy: speculation must not cost).
// For every prompt, plain decoding and n-gram speculation alternate, --runs
// times each; a request's TPOT is (last token - first token) / (tokens - 1).
// Printed and written as JSON: per workload, the median over prompts of
// each prompt's median TPOT with and without speculation, their ratio, the
// acceptance rate, and whether every speculative answer equals the plain
// one token for token.
//
// The limit is the price of a verification pass: a pass over k + 1 tokens
// of one sequence costs more than a single-token pass (each token's
// products are computed; only the weight reads are shared). The "pass
// cost" table times one sequence's pass of 1..9 tokens at a 300-token
// context, relative to one token, in the same run.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/llm_engine.h"
#include "model/default_model.h"
#include "model/model.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "GGUF model (default: the default model)");
ABSL_FLAG(std::string, prompts_dir, "bench/spec_prompts",
          "directory of code_edit.txt, summarize.txt, chat.txt");
ABSL_FLAG(int32_t, threads, 1, "forward-pass threads");
ABSL_FLAG(int32_t, runs, 3, "runs per prompt and method (medians reported)");
ABSL_FLAG(int32_t, max_tokens, 320, "most tokens per answer");
ABSL_FLAG(int32_t, num_speculative_tokens, 6, "k, most tokens drafted");
ABSL_FLAG(int32_t, prompt_lookup_min, 3, "n-gram: shortest suffix looked up");
ABSL_FLAG(int32_t, prompt_lookup_max, 6, "n-gram: longest suffix looked up");
ABSL_FLAG(std::vector<std::string>, workloads,
          std::vector<std::string>({"code_edit", "summarize", "chat"}),
          "workloads to run (files in --prompts_dir)");
ABSL_FLAG(bool, pass_cost, true, "time the verification passes first");
ABSL_FLAG(std::string, json_out, "", "write the results here");

namespace pdserve {
namespace {

using engine::LlmEngine;
using Method = engine::SpeculativeOptions::Method;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::string> ReadPrompts(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<std::string> prompts;
  for (absl::string_view part : absl::StrSplit(ss.str(), "\n=====\n")) {
    std::string p(absl::StripAsciiWhitespace(part));
    if (!p.empty()) prompts.push_back(p);
  }
  return prompts;
}

struct Answer {
  std::vector<int32_t> tokens;
  double tpot_ms = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
};

Answer Run(LlmEngine& engine, const std::vector<int32_t>& prompt) {
  engine::EngineRequest request;
  request.prompt = prompt;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  Answer a;
  absl::Time first, last;
  request.on_output = [&](const engine::RequestOutput& out) {
    if (out.token_ids.empty()) return;
    if (a.tokens.empty()) first = absl::Now();
    last = absl::Now();
    a.tokens.insert(a.tokens.end(), out.token_ids.begin(), out.token_ids.end());
  };
  const engine::EngineStats before = engine.stats();
  if (!engine.AddRequest(std::move(request)).ok() ||
      !engine.RunUntilIdle().ok()) {
    std::cerr << "spec_decode_bench: a request failed\n";
    std::exit(1);
  }
  const engine::EngineStats after = engine.stats();
  a.drafted = after.spec_drafted_tokens - before.spec_drafted_tokens;
  a.accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
  if (a.tokens.size() > 1) {
    a.tpot_ms =
        absl::ToDoubleMilliseconds(last - first) / (a.tokens.size() - 1);
  }
  return a;
}

std::unique_ptr<LlmEngine> MakeEngine(const model::Model& m, Method method) {
  engine::EngineOptions o;
  o.runner.num_threads = absl::GetFlag(FLAGS_threads);
  o.runner.kv_cache_bytes = int64_t{128} << 20;
  // Each run recomputes its prompt, as a fresh request on a worker would.
  o.runner.enable_prefix_cache = false;
  o.speculative.method = method;
  o.speculative.num_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  o.speculative.ngram.min_ngram = absl::GetFlag(FLAGS_prompt_lookup_min);
  o.speculative.ngram.max_ngram = absl::GetFlag(FLAGS_prompt_lookup_max);
  auto e = LlmEngine::Create(m, o);
  if (!e.ok()) {
    std::cerr << "spec_decode_bench: " << e.status() << "\n";
    std::exit(1);
  }
  return std::move(*e);
}

// Median time of one sequence's pass over 1 + k tokens (k drafted) at a
// 300-token context, k = 0..8, interleaved over `rounds`.
std::vector<double> PassCostMs(const model::Model& m) {
  engine::ModelRunnerOptions o;
  o.num_threads = absl::GetFlag(FLAGS_threads);
  o.kv_cache_bytes = int64_t{64} << 20;
  o.enable_prefix_cache = false;
  auto runner = engine::ModelRunner::Create(m, o);
  if (!runner.ok()) std::exit(1);
  engine::ModelRunner& r = **runner;
  std::vector<int32_t> prompt(300);
  for (int i = 0; i < 300; ++i) prompt[i] = 1000 + (i * 7919) % 20000;
  if (!r.Prefill({{1, prompt}}).ok()) std::exit(1);
  constexpr int kMaxDraft = 8, kRounds = 15;
  std::vector<std::vector<double>> ms(kMaxDraft + 1);
  std::vector<float> logits;
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k <= kMaxDraft; ++k) {
      if (!r.AppendToken(1, 2000 + round).ok()) std::exit(1);
      std::vector<int32_t> draft(k, 3000 + k);
      if (k > 0 && !r.AppendDraft(1, draft).ok()) std::exit(1);
      const absl::Time start = absl::Now();
      if (!r.Run({{1, 1 + k, engine::LogitsMode::kAll}}, &logits).ok()) {
        std::exit(1);
      }
      ms[k].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      if (k > 0 && !r.ResolveDraft(1, 0).ok()) std::exit(1);
    }
  }
  std::vector<double> out;
  for (auto& v : ms) out.push_back(Median(v));
  return out;
}

int Main() {
  std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) path = model::FindDefaultModel();
  auto opened = model::Model::Open(path);
  if (!opened.ok()) {
    std::cerr << "spec_decode_bench: " << opened.status() << "\n";
    return 1;
  }
  const model::Model& m = **opened;
  const int runs = absl::GetFlag(FLAGS_runs);
  nlohmann::json out;
  out["model"] = m.name();
  out["threads"] = absl::GetFlag(FLAGS_threads);
  out["runs"] = runs;
  out["num_speculative_tokens"] = absl::GetFlag(FLAGS_num_speculative_tokens);
  out["max_tokens"] = absl::GetFlag(FLAGS_max_tokens);
  out["prompt_lookup"] = {absl::GetFlag(FLAGS_prompt_lookup_min),
                          absl::GetFlag(FLAGS_prompt_lookup_max)};

  const std::vector<double> pass =
      absl::GetFlag(FLAGS_pass_cost) ? PassCostMs(m) : std::vector<double>{1};
  std::cout << "pass cost, one sequence at context 300 (ms; x one token):\n";
  nlohmann::json pass_json = nlohmann::json::array();
  for (size_t k = 0; k < pass.size(); ++k) {
    std::cout << absl::StrFormat("  %zu token(s): %6.2f ms  %.2fx\n", k + 1,
                                 pass[k], pass[k] / pass[0]);
    pass_json.push_back({{"tokens", k + 1}, {"ms", pass[k]}});
  }
  out["pass_cost"] = pass_json;

  auto plain = MakeEngine(m, Method::kNone);
  auto spec = MakeEngine(m, Method::kNgram);
  nlohmann::json workloads = nlohmann::json::object();
  std::cout << absl::StrFormat("%-10s %8s %10s %10s %7s %10s %9s\n", "workload",
                               "prompts", "plain_ms", "ngram_ms", "ratio",
                               "accepted", "identical");
  for (const std::string& name : absl::GetFlag(FLAGS_workloads)) {
    const std::vector<std::string> prompts =
        ReadPrompts(absl::GetFlag(FLAGS_prompts_dir) + "/" + name + ".txt");
    if (prompts.empty()) {
      std::cerr << "spec_decode_bench: no prompts for " << name << "\n";
      return 1;
    }
    std::vector<double> plain_tpot, spec_tpot, ratios;
    int64_t drafted = 0, accepted = 0, tokens = 0;
    bool identical = true;
    nlohmann::json per_prompt = nlohmann::json::array();
    for (const std::string& text : prompts) {
      auto encoded = m.EncodeChat({{"user", text}});
      if (!encoded.ok()) return 1;
      std::vector<double> p_ms, s_ms;
      std::vector<int32_t> reference;
      for (int run = 0; run < runs; ++run) {
        // Alternate which goes first: drift in the machine's speed hits
        // both alike.
        for (int side = 0; side < 2; ++side) {
          const bool speculative = (side + run) % 2 == 1;
          const Answer a = Run(speculative ? *spec : *plain, *encoded);
          (speculative ? s_ms : p_ms).push_back(a.tpot_ms);
          if (!speculative && reference.empty()) reference = a.tokens;
          if (speculative) {
            drafted += a.drafted;
            accepted += a.accepted;
            tokens += a.tokens.size();
            if (!reference.empty() && a.tokens != reference) identical = false;
          }
        }
      }
      plain_tpot.push_back(Median(p_ms));
      spec_tpot.push_back(Median(s_ms));
      ratios.push_back(Median(p_ms) / Median(s_ms));
      per_prompt.push_back({{"plain_tpot_ms", p_ms},
                            {"ngram_tpot_ms", s_ms},
                            {"tokens", reference.size()}});
    }
    const double ratio = Median(plain_tpot) / Median(spec_tpot);
    const double acceptance = drafted ? double(accepted) / drafted : 0;
    std::cout << absl::StrFormat(
        "%-10s %8zu %10.2f %10.2f %6.2fx %9.0f%% %9s\n", name, prompts.size(),
        Median(plain_tpot), Median(spec_tpot), ratio, 100 * acceptance,
        identical ? "yes" : "NO");
    workloads[name] = {{"prompts", per_prompt},
                       {"plain_tpot_ms", Median(plain_tpot)},
                       {"ngram_tpot_ms", Median(spec_tpot)},
                       {"tpot_ratio", ratio},
                       {"median_prompt_ratio", Median(ratios)},
                       {"drafted_tokens", drafted},
                       {"accepted_tokens", accepted},
                       {"acceptance_rate", acceptance},
                       {"tokens_per_draft_pass",
                        drafted ? double(tokens) / (tokens - accepted) : 1.0},
                       {"identical_output", identical}};
    if (!identical) {
      std::cerr << "spec_decode_bench: speculative output differs from plain "
                   "decoding on "
                << name << "\n";
    }
  }
  out["workloads"] = workloads;
  if (const std::string json = absl::GetFlag(FLAGS_json_out); !json.empty()) {
    std::ofstream(json) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::Main();
}
