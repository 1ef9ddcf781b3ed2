#include "worker/engine_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "kernels/matmul.h"
#include "proto/common.pb.h"

ABSL_FLAG(int32_t, kv_cache_mb, 256, "KV cache size in MiB");
ABSL_FLAG(int32_t, kv_block_size, 16, "tokens per KV block");
ABSL_FLAG(int32_t, max_batch_tokens, 512,
          "most new tokens in one forward pass (the chunked-prefill budget)");
ABSL_FLAG(int32_t, max_running, 64, "most sequences decoding at once");
ABSL_FLAG(int32_t, threads, 0,
          "forward-pass threads (0: the CPUs this process may use)");
ABSL_FLAG(bool, prefix_cache, true, "reuse KV of shared prompt prefixes");
ABSL_FLAG(int32_t, attention_sinks, 0,
          "attention sinks (StreamingLLM): leading tokens every query keeps "
          "attending; needs --sink_window. Changes outputs (docs/engine.md)");
ABSL_FLAG(int32_t, sink_window, 0,
          "with attention sinks: recent tokens each query attends; > 0 turns "
          "sinks on, KV stays bounded and sequences may generate past the "
          "context length (0: off, the default)");
ABSL_FLAG(int32_t, testing_pass_delay_us, 0,
          "testing only: every forward pass also sleeps this long (stands in "
          "for hardware whose capacity grows with the number of workers)");
ABSL_FLAG(int32_t, testing_token_delay_us, 0,
          "testing only: every forward pass also sleeps this long per token "
          "it computes");

namespace pdserve::worker {

// --kv_cache_dtype's value; a bad one is refused when flags are parsed.
struct KvCacheDtypeFlag {
  v1::KvDtype dtype = v1::KV_DTYPE_F16;
};

bool AbslParseFlag(absl::string_view text, KvCacheDtypeFlag* flag,
                   std::string* error) {
  if (text == "fp16" || text == "auto") {
    flag->dtype = v1::KV_DTYPE_F16;
  } else if (text == "fp8" || text == "fp8_e4m3") {
    flag->dtype = v1::KV_DTYPE_FP8_E4M3;
  } else {
    *error = "expected fp16 or fp8_e4m3";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(const KvCacheDtypeFlag& flag) {
  return flag.dtype == v1::KV_DTYPE_FP8_E4M3 ? "fp8_e4m3" : "fp16";
}

}  // namespace pdserve::worker

namespace pdserve::worker {

// --matmul_arithmetic's value; a bad one is refused when flags are parsed.
struct MatmulArithmeticFlag {
  kernels::PackedArithmetic arithmetic = kernels::PackedArithmetic::kGgml;
};

bool AbslParseFlag(absl::string_view text, MatmulArithmeticFlag* flag,
                   std::string* error) {
  absl::StatusOr<kernels::PackedArithmetic> parsed =
      kernels::ParsePackedArithmetic(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  flag->arithmetic = *parsed;
  return true;
}

std::string AbslUnparseFlag(const MatmulArithmeticFlag& flag) {
  return kernels::PackedArithmeticName(flag.arithmetic);
}

}  // namespace pdserve::worker

ABSL_FLAG(
    pdserve::worker::MatmulArithmeticFlag, matmul_arithmetic, {},
    "how quantized matrix products add up: ggml (default; llama.cpp's "
    "arithmetic bit for bit) or block_sums (one rounding per 32-element "
    "block: on CPUs with AVX-512 VNNI about 1.5x faster prompts and "
    "1.4-1.8x faster batched decode, logits a few ulps from llama.cpp's). "
    "Prefill and decode workers of one cluster should use the same");

ABSL_FLAG(pdserve::worker::KvCacheDtypeFlag, kv_cache_dtype, {},
          "how the KV cache stores K and V: fp16 (default; llama.cpp's "
          "numerics) or fp8_e4m3 (half the memory per token). Prefill and "
          "decode workers of one cluster must use the same");

namespace pdserve::worker {

engine::EngineOptions EngineOptionsFromFlags() {
  engine::EngineOptions options;
  options.runner.kv_cache_bytes = int64_t{absl::GetFlag(FLAGS_kv_cache_mb)}
                                  << 20;
  options.runner.block_size = absl::GetFlag(FLAGS_kv_block_size);
  options.runner.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.runner.num_threads = absl::GetFlag(FLAGS_threads);
  options.runner.enable_prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  options.runner.kv_dtype = absl::GetFlag(FLAGS_kv_cache_dtype).dtype;
  options.runner.matmul_arithmetic =
      absl::GetFlag(FLAGS_matmul_arithmetic).arithmetic;
  options.runner.attention_sinks = absl::GetFlag(FLAGS_attention_sinks);
  options.runner.sink_window = absl::GetFlag(FLAGS_sink_window);
  options.runner.testing_pass_delay =
      absl::Microseconds(absl::GetFlag(FLAGS_testing_pass_delay_us));
  options.runner.testing_token_delay =
      absl::Microseconds(absl::GetFlag(FLAGS_testing_token_delay_us));
  options.max_running = absl::GetFlag(FLAGS_max_running);
  return options;
}

}  // namespace pdserve::worker
