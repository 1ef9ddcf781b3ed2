// engine_bench: how fast the engine runs a model on this machine, next to
// the machine's own limit.
//
//   bazel run --config=opt //bench:engine_bench -- [--model FILE]
//
// Measures, each as the median of --runs runs:
//   - read bandwidth of this machine's memory with the engine's threads (a
//     parallel sum over a buffer much larger than the caches);
//   - the thread pool's hand-off (an empty parallel loop), first and last:
//     how far apart the host has put the threads' CPUs while the figures
//     were taken (see PoolHandOffNs);
//   - prefill tokens/s for prompts of 128 and 512 tokens (no prefix cache);
//   - the products' compute ceiling: a token's matrix products (every
//     layer's and the output head's multiply-adds) at the multiply pipes'
//     limit for the arithmetic's instruction mix, measured on every thread
//     at once (bench/pipe_ceiling.h): what no batched decode step can
//     beat, since it does every token's products (an upper bound:
//     attention, norms and quantization come on top; prefill takes the
//     output head once per prompt and can pass it);
//   - single-stream decode tokens/s (128 tokens after a 16-token prompt;
//     --decode_prompt_tokens for a longer context), and its ratio to the decode
//     roofline: bandwidth / bytes of weights one decode step reads;
//   - batched decode: aggregate tokens/s of B sequences decoding together,
//     B in {1, 8, 32, 64};
//   - a batch sweep (B in {1, 2, 4, 8, 16}, 32 steps after the same prompt):
//     aggregate tokens/s and the ratio to B = 1; run with --threads=1 for
//     the one-thread figures serving workers see (part "sweep");
//   - speculative verification passes (part "verify"): one sequence at a
//     context of --verify_context tokens runs passes of k = 1..9 tokens (a
//     k-token draft, all logits, then the draft dropped), median ms per pass
//     and its ratio to k single-token passes;
//   - the cost of metrics: single-stream and batch-32 decode with and
//     without recording what a decode worker records per step and per token
//     (worker/worker_metrics.h: step time, batch size, inter-token latency,
//     tokens), runs alternated so that drift hits both alike.
// Prints a table and writes JSON (--json_out). Token ids are synthetic
// (valid ids spread over the vocabulary); speed does not depend on them.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/pipe_ceiling.h"
#include "common/thread_pool.h"
#include "engine/model_runner.h"
#include "kernels/matmul.h"
#include "metrics/registry.h"
#include "model/default_model.h"
#include "model/model.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, model, "", "GGUF model (default: the default model)");
ABSL_FLAG(int32_t, threads, 0, "Threads (0: the CPUs this process may use)");
ABSL_FLAG(int32_t, runs, 5, "Runs per measurement (the median is reported)");
ABSL_FLAG(std::string, matmul_arithmetic, "ggml",
          "how packed matrix products add up: ggml (llama.cpp's order) or "
          "block_sums (kernels::PackedArithmetic)");
ABSL_FLAG(std::string, json_out, "", "Write the results as JSON here");
ABSL_FLAG(int32_t, decode_prompt_tokens, 16,
          "Prompt length before the decode measures (single stream and "
          "batched): decode attention grows with the context, so a long "
          "prompt shows its share");
ABSL_FLAG(std::string, only, "",
          "Run only these parts (comma-separated: prefill, decode, batched, "
          "metrics, sweep, verify), e.g. to profile one; the table then "
          "shows 0 for the others (sweep and verify run only when named)");
ABSL_FLAG(std::vector<std::string>, sweep_batches,
          std::vector<std::string>({"1", "2", "4", "8", "16"}),
          "Batch sizes of the sweep (part \"sweep\"; the first is the one "
          "the others' ratios divide by), e.g. one size to profile it");
ABSL_FLAG(int32_t, verify_context, 300,
          "Context (tokens already computed) before each verification pass "
          "of the verify part");
ABSL_FLAG(std::vector<std::string>, verify_tokens,
          std::vector<std::string>({"1", "2", "3", "4", "5", "6", "7", "8",
                                    "9"}),
          "Pass sizes k of the verify part");
ABSL_FLAG(int32_t, repeat_passes, 20,
          "Verification passes per run of the verify part");

namespace pdserve {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Sum of v[begin, end) read as wide as the CPU allows: the read bandwidth
// of a scalar loop is bound by the core, not by memory (here it measured
// half of what the kernels stream).
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t SumAvx512(const uint64_t* v,
                                                      int64_t begin,
                                                      int64_t end) {
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512(), _mm512_setzero_si512()};
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm512_add_epi64(acc[k], _mm512_loadu_si512(v + i + 8 * k));
    }
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]),
                                             _mm512_add_epi64(acc[2], acc[3])));
  uint64_t sum = 0;
  for (uint64_t l : lanes) sum += l;
  for (; i < end; ++i) sum += v[i];
  return sum;
}
#endif

uint64_t Sum(const uint64_t* v, int64_t begin, int64_t end) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return SumAvx512(v, begin, end);
#endif
  uint64_t s[4] = {};
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    for (int k = 0; k < 4; ++k) s[k] += v[i + k];
  }
  for (; i < end; ++i) s[0] += v[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// GB/s of parallel reads over 512 MiB, one sample per pass over a buffer
// written once beforehand (as the engine reads weights that are already
// mapped), median of `runs` passes.
double ReadBandwidthGbps(common::ThreadPool& pool, int runs) {
  const int64_t n = (int64_t{512} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buffer(n + 8, 1);
  // Cache-line aligned: wide loads that straddle two lines read slower.
  const uint64_t* data = buffer.data();
  while (reinterpret_cast<uintptr_t>(data) % 64 != 0) ++data;
  std::vector<double> samples;
  for (int i = 0; i < runs; ++i) {
    std::atomic<uint64_t> total{0};
    const absl::Time start = absl::Now();
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      // Kept: the sum is checked, so the reads cannot be optimized away.
      total.fetch_add(Sum(data, begin, end));
    });
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (total.load() != static_cast<uint64_t>(n)) std::cerr << "bad sum\n";
    samples.push_back(n * sizeof(uint64_t) / seconds / 1e9);
  }
  return Median(samples);
}

// Median ns of an empty ParallelFor on `pool` (one item per thread): what
// handing a loop to the workers and waiting for them costs, a few
// cache-line transfers between the threads' CPUs (the published loop, the
// caller's function object, the count of unfinished chunks). A decode step
// runs a few hundred such loops. On a VM the host places the vCPUs near
// each other (sharing an L3) or far apart, and moves them over seconds to
// minutes: on the Zen 4 VM of bench/results a cache line crossed between
// the two vCPUs in about 55 ns or about 330 ns, and the default model's
// two-thread batch 8 ran about 1600 or about 1190 tokens/s with it, while
// two one-thread processes side by side ran at full speed either way. So
// every run reports this, first and last, beside its two-thread figures.
// 0 with one thread.
double PoolHandOffNs(common::ThreadPool& pool) {
  if (pool.num_threads() < 2) return 0;
  constexpr int kCalls = 20000;
  std::vector<double> samples;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    for (int call = 0; call < kCalls; ++call) {
      pool.ParallelFor(pool.num_threads(), [](int64_t, int64_t) {});
    }
    samples.push_back(absl::ToDoubleNanoseconds(absl::Now() - start) / kCalls);
  }
  return Median(samples);
}

std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>(
        (int64_t{i} * 7919 + int64_t{salt} * 104729 + 17) % vocab);
  }
  return t;
}

// The first index of the largest of v[0, n) (NaN-free), as
// std::max_element gives it, in two passes: max_element's loop carries its
// dependency through a load of the best element, about 6 cycles per logit
// on Zen 4, and at batch 8 on the default model that was 7 % of the step
// this benchmark times; here 16 independent maxima, then a search.
int32_t Argmax(const float* v, int n) {
  float lanes[16];
  std::fill(std::begin(lanes), std::end(lanes), v[0]);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] = std::max(lanes[k], v[i + k]);
  }
  float best = *std::max_element(std::begin(lanes), std::end(lanes));
  for (; i < n; ++i) best = std::max(best, v[i]);
  return static_cast<int32_t>(std::find(v, v + n, best) - v);
}

struct Results {
  double bandwidth_gbps = 0;
  double handoff_first_ns = 0, handoff_last_ns = 0;
  double prefill_128 = 0, prefill_512 = 0;
  double decode_single = 0;
  std::vector<std::pair<int, double>> batched;
  double roofline = 0;
  bench::ProductsCeiling ceiling;
  // Decode tokens/s with metrics recorded and without, by batch size.
  struct MetricsCost {
    int batch = 0;
    double with_metrics = 0;
    double without = 0;
  };
  std::vector<MetricsCost> metrics_cost;
  std::vector<std::pair<int, double>> sweep;   // batch, tokens/s
  std::vector<std::pair<int, double>> verify;  // k, ms per pass
};

int Main() {
  std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) path = model::DefaultModelPath();
  auto loaded = model::Model::Open(path);
  if (!loaded.ok()) {
    std::cerr << "engine_bench: " << loaded.status().message() << "\n";
    return 1;
  }
  const model::Model& m = **loaded;
  const int vocab = m.config().vocab_size;
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));

  engine::ModelRunnerOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  const std::string arithmetic = absl::GetFlag(FLAGS_matmul_arithmetic);
  if (absl::StatusOr<kernels::PackedArithmetic> parsed =
          kernels::ParsePackedArithmetic(arithmetic);
      parsed.ok()) {
    options.matmul_arithmetic = *parsed;
  } else {
    std::cerr << "engine_bench: " << parsed.status().message() << "\n";
    return 1;
  }
  options.enable_prefix_cache = false;
  options.kv_cache_bytes = int64_t{512} << 20;
  auto created = engine::ModelRunner::Create(m, options);
  if (!created.ok()) {
    std::cerr << "engine_bench: " << created.status().message() << "\n";
    return 1;
  }
  engine::ModelRunner& runner = **created;
  common::ThreadPool pool(options.num_threads);
  Results r;
  engine::SeqId next_id = 1;

  std::vector<double> samples;
  r.handoff_first_ns = PoolHandOffNs(pool);
  r.bandwidth_gbps = ReadBandwidthGbps(pool, runs);
  // Bytes one decode step reads: every matrix once, plus an embedding row.
  const double step_bytes =
      m.weights().matrix_bytes + m.weights().token_embedding.row_bytes;
  r.roofline = r.bandwidth_gbps * 1e9 / step_bytes;
  r.ceiling = bench::MeasureProductsCeiling(m.weights(),
                                            options.matmul_arithmetic, pool);

  const std::string only = absl::GetFlag(FLAGS_only);
  const std::vector<std::string> parts = absl::StrSplit(only, ',');
  auto wanted = [&](const std::string& part) {
    return only.empty() ||
           std::find(parts.begin(), parts.end(), part) != parts.end();
  };
  for (int len : {128, 512}) {
    if (!wanted("prefill")) break;
    samples.clear();
    for (int i = 0; i < runs; ++i) {
      const std::vector<int32_t> prompt = Tokens(len, i, vocab);
      const engine::SeqId id = next_id++;
      const absl::Time start = absl::Now();
      auto out = runner.Prefill({{id, prompt}});
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      if (!out.ok()) {
        std::cerr << "engine_bench: " << out.status().message() << "\n";
        return 1;
      }
      runner.Release(id);
      samples.push_back(len / s);
    }
    (len == 128 ? r.prefill_128 : r.prefill_512) = Median(samples);
  }

  // Decode: B sequences with --decode_prompt_tokens-token prompts, then
  // `steps` greedy steps all in one batch per step.
  const int decode_prompt_tokens =
      std::max(1, absl::GetFlag(FLAGS_decode_prompt_tokens));
  if (decode_prompt_tokens + 128 >= m.config().context_length) {
    std::cerr << "engine_bench: --decode_prompt_tokens=" << decode_prompt_tokens
              << " leaves no room for 128 decode steps in the context of "
              << m.config().context_length << " tokens\n";
    return 1;
  }
  // `recorder` (may be null) records each step as a decode worker does.
  // A failed run says why and fails the benchmark at the end: its -1 must
  // not sit unnoticed among the samples a median is taken of.
  bool decode_failed = false;
  auto failed = [&](const absl::Status& status) {
    std::cerr << "engine_bench: a decode run failed: " << status << "\n";
    decode_failed = true;
    return -1.0;
  };
  auto decode = [&](int batch, int steps, int salt,
                    worker::WorkerMetrics* recorder = nullptr) -> double {
    std::vector<engine::SeqId> ids;
    std::vector<int32_t> next;
    for (int b = 0; b < batch; ++b) {
      const engine::SeqId id = next_id++;
      const std::vector<int32_t> prompt =
          Tokens(decode_prompt_tokens, salt * 1000 + b, vocab);
      auto out = runner.Prefill({{id, prompt}});
      if (!out.ok()) return failed(out.status());
      ids.push_back(id);
      next.push_back(Argmax((*out)[0].logits.data(), vocab));
    }
    std::vector<float> logits;
    const absl::Time start = absl::Now();
    absl::Time last_step = start;
    for (int s = 0; s < steps; ++s) {
      if (absl::Status status = runner.Decode(ids, next, &logits);
          !status.ok()) {
        return failed(status);
      }
      for (int b = 0; b < batch; ++b) {
        next[b] = Argmax(logits.data() + int64_t{b} * vocab, vocab);
      }
      if (recorder != nullptr) {
        // DecodeWorker::EngineLoop per step, OnOutput per token.
        const absl::Time now = absl::Now();
        recorder->step_duration->Observe(
            absl::ToDoubleSeconds(now - last_step));
        recorder->batch_sequences->Observe(batch);
        recorder->prompt_tokens_computed->Inc(0);
        for (int b = 0; b < batch; ++b) {
          recorder->inter_token_latency->Observe(
              absl::ToDoubleSeconds(now - last_step));
          recorder->generated_tokens->Inc(1);
        }
        last_step = now;
      }
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    for (engine::SeqId id : ids) runner.Release(id);
    return batch * steps / seconds;
  };
  samples.clear();
  for (int i = 0; i < runs && wanted("decode"); ++i) {
    samples.push_back(decode(1, 128, i));
  }
  if (!samples.empty()) r.decode_single = Median(samples);
  for (int batch : {1, 8, 32, 64}) {
    if (!wanted("batched")) break;
    samples.clear();
    for (int i = 0; i < runs; ++i) samples.push_back(decode(batch, 32, i));
    r.batched.push_back({batch, Median(samples)});
  }
  const auto named = [&](const std::string& part) {
    return std::find(parts.begin(), parts.end(), part) != parts.end();
  };
  for (const std::string& size : absl::GetFlag(FLAGS_sweep_batches)) {
    if (!named("sweep")) break;
    int batch = 0;
    if (!absl::SimpleAtoi(size, &batch) || batch < 1) {
      std::cerr << "engine_bench: bad --sweep_batches entry " << size << "\n";
      return 1;
    }
    samples.clear();
    for (int i = 0; i < runs; ++i) samples.push_back(decode(batch, 32, i));
    r.sweep.push_back({batch, Median(samples)});
  }
  // Verification passes: a sequence at --verify_context tokens; each pass
  // appends a k-token draft (k - 1 drafts plus the token the last pass
  // sampled, as the engine verifies), computes all k logits rows and drops
  // the draft again, so every pass runs at the same positions.
  const int verify_context = absl::GetFlag(FLAGS_verify_context);
  const int repeat_passes = std::max(1, absl::GetFlag(FLAGS_repeat_passes));
  std::vector<int> verify_tokens;
  for (const std::string& k : absl::GetFlag(FLAGS_verify_tokens)) {
    int value = 0;
    if (!absl::SimpleAtoi(k, &value) || value < 1) {
      std::cerr << "engine_bench: bad --verify_tokens entry " << k << "\n";
      return 1;
    }
    verify_tokens.push_back(value);
  }
  for (int k : verify_tokens) {
    if (!named("verify")) break;
    samples.clear();
    for (int i = 0; i < runs; ++i) {
      const engine::SeqId id = next_id++;
      auto out = runner.Prefill({{id, Tokens(verify_context, i, vocab)}});
      if (!out.ok()) {
        std::cerr << "engine_bench: " << out.status().message() << "\n";
        return 1;
      }
      const std::vector<int32_t> draft = Tokens(k, 77 + i, vocab);
      std::vector<float> logits;
      const absl::Time start = absl::Now();
      for (int p = 0; p < repeat_passes; ++p) {
        absl::Status st = runner.AppendDraft(id, draft);
        if (st.ok()) {
          st = runner.Run({{id, k, engine::LogitsMode::kAll}}, &logits);
        }
        if (st.ok()) st = runner.ResolveDraft(id, 0);
        if (!st.ok()) {
          std::cerr << "engine_bench: " << st.message() << "\n";
          return 1;
        }
      }
      samples.push_back(absl::ToDoubleMilliseconds(absl::Now() - start) /
                        repeat_passes);
      runner.Release(id);
    }
    r.verify.push_back({k, Median(samples)});
  }
  // Metrics on and off, alternated run by run.
  metrics::Registry registry;
  worker::WorkerMetricsOptions metrics_options;
  metrics_options.model = m.name();
  metrics_options.role = "decode";
  metrics_options.worker_id = "engine_bench";
  std::unique_ptr<worker::WorkerMetrics> recorder =
      worker::WorkerMetrics::Create(&registry, metrics_options).value();
  for (int batch : {1, 32}) {
    if (!wanted("metrics")) break;
    std::vector<double> with, without;
    const int steps = batch == 1 ? 128 : 32;
    for (int i = 0; i < runs; ++i) {
      without.push_back(decode(batch, steps, i));
      with.push_back(decode(batch, steps, i, recorder.get()));
    }
    r.metrics_cost.push_back({batch, Median(with), Median(without)});
  }
  if (decode_failed) return 1;
  r.handoff_last_ns = PoolHandOffNs(pool);

  std::cout << absl::StrFormat(
      "model %s (%s), %d threads, %s arithmetic, median of %d runs, decode "
      "after a %d-token prompt\n"
      "memory read bandwidth      %8.1f GB/s\n"
      "pool hand-off              %8.0f ns first, %.0f ns last (an empty "
      "parallel loop)\n"
      "decode roofline            %8.1f tokens/s (%.1f MB read per token)\n"
      "products' compute ceiling  %8.1f tokens/s (%.0f M multiply-adds per "
      "token at %.1f GMAC/s)\n"
      "prefill, 128-token prompt  %8.1f tokens/s\n"
      "prefill, 512-token prompt  %8.1f tokens/s\n"
      "decode, single stream      %8.1f tokens/s (%.2f of the roofline)\n",
      m.name(), m.quantization(), runner.num_threads(), arithmetic, runs,
      decode_prompt_tokens, r.bandwidth_gbps, r.handoff_first_ns,
      r.handoff_last_ns, r.roofline, step_bytes / 1e6, r.ceiling.tokens_per_s,
      r.ceiling.macs_per_token / 1e6, r.ceiling.gmacs, r.prefill_128,
      r.prefill_512, r.decode_single, r.decode_single / r.roofline);
  for (const auto& [batch, tps] : r.batched) {
    std::cout << absl::StrFormat(
        "decode, batch %-3d          %8.1f tokens/s aggregate (%.1fx batch "
        "1)\n",
        batch, tps, tps / r.batched[0].second);
  }
  for (const auto& [batch, tps] : r.sweep) {
    std::cout << absl::StrFormat(
        "sweep, batch %-3d           %8.1f tokens/s aggregate (%.2fx batch "
        "1)\n",
        batch, tps, tps / r.sweep[0].second);
  }
  for (const auto& [k, ms] : r.verify) {
    std::cout << absl::StrFormat(
        "verify, %d-token pass        %8.3f ms (%.2fx the first size's "
        "pass; context %d)\n",
        k, ms, ms / r.verify[0].second, verify_context);
  }
  for (const Results::MetricsCost& c : r.metrics_cost) {
    std::cout << absl::StrFormat(
        "decode, batch %-3d metrics  %8.1f tokens/s with, %8.1f without "
        "(%.3f)\n",
        c.batch, c.with_metrics, c.without, c.with_metrics / c.without);
  }
  const std::string json_path = absl::GetFlag(FLAGS_json_out);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << absl::StrFormat(
        "{\"model\": \"%s\", \"quantization\": \"%s\", \"threads\": %d, "
        "\"matmul_arithmetic\": \"%s\", \"runs\": %d, "
        "\"decode_prompt_tokens\": %d, \"bandwidth_gbps\": "
        "%.3f, \"pool_handoff_first_ns\": %.1f, \"pool_handoff_last_ns\": "
        "%.1f, \"decode_roofline_tps\": "
        "%.3f, \"bytes_per_decode_step\": %.0f, \"prefill_128_tps\": %.3f, "
        "\"prefill_512_tps\": %.3f, \"decode_single_tps\": %.3f, "
        "\"decode_roofline_ratio\": %.4f, \"macs_per_token\": %.0f, "
        "\"products_ceiling_gmacs\": %.3f, \"products_ceiling_tps\": %.3f, "
        "\"batched_decode_tps\": {",
        m.name(), m.quantization(), runner.num_threads(), arithmetic, runs,
        decode_prompt_tokens, r.bandwidth_gbps, r.handoff_first_ns,
        r.handoff_last_ns, r.roofline, step_bytes, r.prefill_128, r.prefill_512,
        r.decode_single, r.decode_single / r.roofline, r.ceiling.macs_per_token,
        r.ceiling.gmacs, r.ceiling.tokens_per_s);
    std::vector<std::string> parts;
    for (const auto& [batch, tps] : r.batched) {
      parts.push_back(absl::StrFormat("\"%d\": %.3f", batch, tps));
    }
    out << absl::StrJoin(parts, ", ") << "}, \"metrics_cost\": {";
    parts.clear();
    for (const Results::MetricsCost& c : r.metrics_cost) {
      parts.push_back(absl::StrFormat(
          "\"%d\": {\"with_metrics_tps\": %.3f, \"without_tps\": %.3f, "
          "\"ratio\": %.4f}",
          c.batch, c.with_metrics, c.without, c.with_metrics / c.without));
    }
    out << absl::StrJoin(parts, ", ") << "}, \"sweep_tps\": {";
    parts.clear();
    for (const auto& [batch, tps] : r.sweep) {
      parts.push_back(absl::StrFormat("\"%d\": %.3f", batch, tps));
    }
    out << absl::StrJoin(parts, ", ")
        << "}, \"verify_context\": " << verify_context
        << ", \"verify_pass_ms\": {";
    parts.clear();
    for (const auto& [k, ms] : r.verify) {
      parts.push_back(absl::StrFormat("\"%d\": %.4f", k, ms));
    }
    out << absl::StrJoin(parts, ", ") << "}}\n";
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::Main();
}
