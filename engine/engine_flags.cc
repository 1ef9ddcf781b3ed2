#include "engine/engine_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "model/default_model.h"

ABSL_FLAG(std::string, model, "",
          "GGUF model file (default: the project's default model)");
ABSL_FLAG(int32_t, kv_cache_mb, 256, "KV cache size in MiB");
ABSL_FLAG(int32_t, kv_block_size, 16, "tokens per KV block");
ABSL_FLAG(int32_t, max_batch_tokens, 512,
          "most new tokens in one forward pass (the chunked-prefill budget)");
ABSL_FLAG(int32_t, max_running, 64, "most sequences decoding at once");
ABSL_FLAG(int32_t, threads, 0,
          "forward-pass threads (0: the CPUs this process may use)");
ABSL_FLAG(bool, prefix_cache, true, "reuse KV of shared prompt prefixes");

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<model::Model>> OpenModelFromFlags() {
  std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) path = model::DefaultModelPath();
  return model::Model::Open(path);
}

EngineOptions EngineOptionsFromFlags() {
  EngineOptions options;
  options.runner.kv_cache_bytes = int64_t{absl::GetFlag(FLAGS_kv_cache_mb)}
                                  << 20;
  options.runner.block_size = absl::GetFlag(FLAGS_kv_block_size);
  options.runner.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.runner.num_threads = absl::GetFlag(FLAGS_threads);
  options.runner.enable_prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  options.max_running = absl::GetFlag(FLAGS_max_running);
  return options;
}

}  // namespace pdserve::engine
