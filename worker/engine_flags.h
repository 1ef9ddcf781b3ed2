// Command-line flags that size the engine of a worker process
// (pd-prefill-worker, pd-decode-worker; pd-generate keeps its own defaults):
// how big a KV cache, in what dtype, how many threads, how big a batch.
// Only worker processes link these flags; which model to serve is
// model/model_flags.h, shared with the router.
//
// --kv_cache_mb, --kv_block_size, --kv_cache_dtype, --matmul_arithmetic,
// --max_batch_tokens, --max_running, --threads, --prefix_cache,
// --attention_sinks and --sink_window (StreamingLLM, off by default);
// --testing_pass_delay_us and --testing_token_delay_us (tests of scaling).
#ifndef PDSERVE_WORKER_ENGINE_FLAGS_H_
#define PDSERVE_WORKER_ENGINE_FLAGS_H_

#include "engine/llm_engine.h"

namespace pdserve::worker {

engine::EngineOptions EngineOptionsFromFlags();

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_ENGINE_FLAGS_H_
