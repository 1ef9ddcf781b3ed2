// pd-generate: offline generation with the engine, no cluster involved.
//
//   pd-generate --prompt "The capital of France is"
//   pd-generate --chat --prompt "Write a haiku about the sea"
//
// Streams the generated text to stdout as it is produced, then prints to
// stderr the prompt size, time to first token, decode speed and the
// process's resident memory. --json prints the same as one JSON object
// (with the token ids) instead, for scripts that compare against other
// engines.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/llm_engine.h"
#include "kernels/matmul.h"
#include "model/default_model.h"
#include "model/model.h"
#include "worker/speculative_flags.h"

ABSL_FLAG(std::string, model, "",
          "GGUF model file (default: the default model, see "
          "scripts/setup.sh)");
ABSL_FLAG(std::string, prompt, "", "Prompt text (required)");
ABSL_FLAG(bool, chat, false,
          "Render the prompt as a user message with the model's chat "
          "template");
ABSL_FLAG(std::string, system, "",
          "With --chat: a system message (default: the template's own)");
ABSL_FLAG(bool, add_special, true,
          "Without --chat: add BOS/EOS as the model file says");
ABSL_FLAG(int32_t, max_tokens, 128, "Most tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 is greedy");
ABSL_FLAG(int32_t, top_k, 0, "Top-k (0: off)");
ABSL_FLAG(double, top_p, 1.0, "Top-p (1: off)");
ABSL_FLAG(double, min_p, 0.0, "Min-p (0: off)");
ABSL_FLAG(double, repetition_penalty, 1.0, "Repetition penalty (1: off)");
ABSL_FLAG(int64_t, seed, -1, "Sampling seed (-1: random)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "Stop strings, comma-separated");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past EOS");
ABSL_FLAG(int32_t, threads, 0, "Threads (0: the CPUs this process may use)");
ABSL_FLAG(int32_t, kv_cache_mib, 256, "KV cache size in MiB");
ABSL_FLAG(std::string, matmul_arithmetic, "ggml",
          "how quantized matrix products add up: ggml (llama.cpp's "
          "arithmetic bit for bit) or block_sums (faster prompts and batched "
          "decode on AVX-512 VNNI; logits a few ulps apart)");
ABSL_FLAG(int32_t, batch_tokens, 512, "Most tokens per forward pass");
ABSL_FLAG(int32_t, attention_sinks, 0,
          "Attention sinks (StreamingLLM): leading tokens always attended; "
          "needs --sink_window. Changes outputs (docs/engine.md)");
ABSL_FLAG(int32_t, sink_window, 0,
          "With attention sinks: recent tokens attended; > 0 turns sinks on "
          "and lets generation run past the context in bounded KV");
ABSL_FLAG(int32_t, logprobs, 0,
          "With --json: the N most likely alternatives (with log-probabilities "
          "of the raw logits) for every generated token, 0..20");
ABSL_FLAG(std::string, prompt_ids, "",
          "Comma-separated token ids to use as the prompt instead of --prompt");
ABSL_FLAG(bool, json, false,
          "Print one JSON object (text, token ids, timings) instead of "
          "streaming");

namespace pdserve {
namespace {

// Resident and peak resident memory from /proc, in KiB.
std::pair<int64_t, int64_t> ResidentKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t rss = -1, hwm = -1;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::atoll(line.c_str() + 6);
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::atoll(line.c_str() + 6);
  }
  return {rss, hwm};
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out;
}

// " | ngram: 40/52 drafted tokens accepted" when speculating.
std::string SpeculationSummary(const engine::EngineStats& stats) {
  if (stats.spec_method.empty()) return "";
  return absl::StrCat(" | ", stats.spec_method, ": ",
                      stats.spec_accepted_tokens, "/",
                      stats.spec_drafted_tokens, " drafted tokens accepted");
}

int Main() {
  std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) path = model::DefaultModelPath();
  const std::string prompt_text = absl::GetFlag(FLAGS_prompt);
  if (prompt_text.empty() && absl::GetFlag(FLAGS_prompt_ids).empty()) {
    std::cerr << "pd-generate: --prompt (or --prompt_ids) is required\n";
    return 2;
  }
  const absl::Time load_start = absl::Now();
  absl::StatusOr<std::unique_ptr<model::Model>> loaded =
      model::Model::Open(path);
  if (!loaded.ok()) {
    std::cerr << "pd-generate: " << loaded.status().message() << "\n";
    return 1;
  }
  const model::Model& m = **loaded;
  const model::Tokenizer& tok = m.tokenizer();

  std::vector<int32_t> prompt;
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    for (absl::string_view id :
         absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',')) {
      int32_t v;
      if (!absl::SimpleAtoi(id, &v)) {
        std::cerr << "pd-generate: bad token id '" << id << "'\n";
        return 2;
      }
      prompt.push_back(v);
    }
  } else if (absl::GetFlag(FLAGS_chat)) {
    if (!m.chat_template().ok()) {
      std::cerr << "pd-generate: --chat: "
                << m.chat_template().status().message() << "\n";
      return 1;
    }
    std::vector<model::ChatMessage> messages;
    if (!absl::GetFlag(FLAGS_system).empty()) {
      messages.push_back({"system", absl::GetFlag(FLAGS_system)});
    }
    messages.push_back({"user", prompt_text});
    absl::StatusOr<std::vector<int32_t>> encoded = m.EncodeChat(messages);
    if (!encoded.ok()) {
      std::cerr << "pd-generate: " << encoded.status().message() << "\n";
      return 1;
    }
    prompt = *std::move(encoded);
  } else {
    prompt = absl::GetFlag(FLAGS_add_special)
                 ? m.EncodePrompt(prompt_text)
                 : tok.Encode(prompt_text, /*add_special=*/false,
                              /*parse_special=*/false);
  }

  if (absl::GetFlag(FLAGS_max_tokens) <= 0 || absl::GetFlag(FLAGS_top_k) < 0) {
    std::cerr << "pd-generate: --max_tokens must be positive and --top_k "
                 "non-negative\n";
    return 2;
  }
  engine::EngineOptions options;
  options.runner.num_threads = absl::GetFlag(FLAGS_threads);
  options.runner.kv_cache_bytes = int64_t{absl::GetFlag(FLAGS_kv_cache_mib)}
                                  << 20;
  options.runner.max_batch_tokens = absl::GetFlag(FLAGS_batch_tokens);
  absl::StatusOr<kernels::PackedArithmetic> arithmetic =
      kernels::ParsePackedArithmetic(absl::GetFlag(FLAGS_matmul_arithmetic));
  if (!arithmetic.ok()) {
    std::cerr << "pd-generate: " << arithmetic.status().message() << "\n";
    return 2;
  }
  options.runner.matmul_arithmetic = *arithmetic;
  std::unique_ptr<model::Model> draft_model;  // outlives the engine
  if (absl::Status spec = worker::SpeculativeOptionsFromFlags(
          &options.speculative, &draft_model);
      !spec.ok()) {
    std::cerr << "pd-generate: " << spec.message() << "\n";
    return 2;
  }
  options.runner.attention_sinks = absl::GetFlag(FLAGS_attention_sinks);
  options.runner.sink_window = absl::GetFlag(FLAGS_sink_window);
  absl::StatusOr<std::unique_ptr<engine::LlmEngine>> created =
      engine::LlmEngine::Create(m, options);
  if (!created.ok()) {
    std::cerr << "pd-generate: " << created.status().message() << "\n";
    return 1;
  }
  engine::LlmEngine& eng = **created;
  const absl::Duration load_time = absl::Now() - load_start;

  engine::EngineRequest request;
  request.prompt = prompt;
  engine::SamplingParams& sp = request.sampling;
  sp.temperature = absl::GetFlag(FLAGS_temperature);
  sp.top_k = absl::GetFlag(FLAGS_top_k);
  sp.top_p = absl::GetFlag(FLAGS_top_p);
  sp.min_p = absl::GetFlag(FLAGS_min_p);
  sp.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  if (absl::GetFlag(FLAGS_seed) >= 0) sp.seed = absl::GetFlag(FLAGS_seed);
  sp.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  sp.stop = absl::GetFlag(FLAGS_stop);
  sp.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  if (absl::GetFlag(FLAGS_logprobs) > 0) {
    sp.logprobs = true;
    sp.top_logprobs = absl::GetFlag(FLAGS_logprobs);
  }

  const bool json = absl::GetFlag(FLAGS_json);
  std::string text;
  std::vector<int32_t> generated;
  std::string logprobs_json;
  absl::Time start, first, last;
  engine::RequestFinish finish = engine::RequestFinish::kNone;
  absl::Status error;
  int32_t cached = 0;
  request.on_output = [&](const engine::RequestOutput& out) {
    if (!out.token_ids.empty() && generated.empty()) first = absl::Now();
    last = absl::Now();
    generated.insert(generated.end(), out.token_ids.begin(),
                     out.token_ids.end());
    text += out.text;
    for (const engine::SampleResult& lp : out.logprobs) {
      absl::StrAppend(&logprobs_json, logprobs_json.empty() ? "" : ", ", "[");
      for (size_t i = 0; i < lp.top_logprobs.size(); ++i) {
        absl::StrAppend(&logprobs_json, i ? ", " : "", "[",
                        lp.top_logprobs[i].token_id, ", ",
                        lp.top_logprobs[i].logprob, "]");
      }
      absl::StrAppend(&logprobs_json, "]");
    }
    if (!json) {
      std::cout << out.text << std::flush;
    }
    if (out.finish != engine::RequestFinish::kNone) {
      finish = out.finish;
      error = out.error;
      cached = out.cached_tokens;
    }
  };
  start = absl::Now();
  absl::StatusOr<engine::RequestId> id = eng.AddRequest(std::move(request));
  if (!id.ok()) {
    std::cerr << "pd-generate: " << id.status().message() << "\n";
    return 1;
  }
  absl::Status run = eng.RunUntilIdle();
  if (!run.ok() || finish == engine::RequestFinish::kError) {
    std::cerr << "\npd-generate: " << (run.ok() ? error : run).message()
              << "\n";
    return 1;
  }
  const double ttft_ms = absl::ToDoubleMilliseconds(first - start);
  const double decode_s = absl::ToDoubleSeconds(last - first);
  const double decode_tps = generated.size() > 1 && decode_s > 0
                                ? (generated.size() - 1) / decode_s
                                : 0;
  const auto [rss_kib, hwm_kib] = ResidentKib();
  const char* why = finish == engine::RequestFinish::kStop ? "stop" : "length";
  if (json) {
    std::cout << "{\"model\": \"" << JsonEscape(m.name()) << "\", "
              << "\"prompt_token_ids\": [" << absl::StrJoin(prompt, ", ")
              << "], \"token_ids\": [" << absl::StrJoin(generated, ", ")
              << "], \"text\": \"" << JsonEscape(text) << "\", "
              << "\"finish_reason\": \"" << why << "\", "
              << "\"top_logprobs\": [" << logprobs_json << "], "
              << "\"ttft_ms\": " << ttft_ms << ", "
              << "\"decode_tokens_per_s\": " << decode_tps << ", "
              << "\"rss_kib\": " << rss_kib << ", \"peak_rss_kib\": " << hwm_kib
              << "}\n";
  } else {
    std::cout << "\n";
    std::fprintf(stderr,
                 "\n[%s] load %.0f ms | prompt %zu tokens (%d cached) | "
                 "TTFT %.1f ms | %zu tokens, decode %.1f tokens/s | "
                 "finish %s | %d threads | RSS %.1f MiB (peak %.1f MiB)%s\n",
                 m.name().c_str(), absl::ToDoubleMilliseconds(load_time),
                 prompt.size(), cached, ttft_ms, generated.size(), decode_tps,
                 why, eng.runner().num_threads(), rss_kib / 1024.0,
                 hwm_kib / 1024.0, SpeculationSummary(eng.stats()).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Offline generation: pd-generate [--model FILE] --prompt TEXT [--chat]");
  absl::ParseCommandLine(argc, argv);
  return pdserve::Main();
}
