// Command-line flags shared by every process that runs the engine
// (pd-prefill-worker, pd-decode-worker, pd-generate stays separate for its
// own defaults): which model, how big a KV cache, how many threads.
//
// --model, --served_model_name, --kv_cache_mb, --kv_block_size,
// --max_batch_tokens, --max_running,
// --threads, --prefix_cache.
#ifndef PDSERVE_ENGINE_ENGINE_FLAGS_H_
#define PDSERVE_ENGINE_ENGINE_FLAGS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/llm_engine.h"
#include "model/model.h"

namespace pdserve::engine {

// Opens --model (default: the project's default model).
absl::StatusOr<std::unique_ptr<model::Model>> OpenModelFromFlags();

EngineOptions EngineOptionsFromFlags();

// The id clients use for the model (ModelInfo.id, the OpenAI "model"):
// --served_model_name, or the model file's name without ".gguf". The
// router and every worker of a cluster must agree on it.
std::string ServedModelName(const std::string& model_path);

// --model, or the default model's path.
std::string ModelPathFromFlags();

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_ENGINE_FLAGS_H_
