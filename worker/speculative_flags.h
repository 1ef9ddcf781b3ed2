// Command-line flags for speculative decoding (engine/drafter.h), shared by
// the worker processes (decode and colocated workers speculate; a prefill
// worker samples only the first token and ignores them) and pd-generate:
//
//   --speculative_method=off|ngram|draft_model   (default off)
//   --num_speculative_tokens=K                   most tokens drafted a step
//   --speculative_adaptive                       draft length follows the
//                                                acceptance rate (default on)
//   --speculative_disable_by_batch_size=N        no drafting at N+ running
//   --prompt_lookup_min / --prompt_lookup_max    n-gram sizes looked up
//   --draft_model=FILE.gguf --draft_kv_cache_mb  the draft model and its KV
//
// A request opts out with SamplingParams.disable_speculation.
#ifndef PDSERVE_WORKER_SPECULATIVE_FLAGS_H_
#define PDSERVE_WORKER_SPECULATIVE_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/llm_engine.h"
#include "model/model.h"

namespace pdserve::worker {

// "ngram", "draft_model", or "" for kNone (the metrics' method label and
// the flag's values).
std::string SpeculativeMethodName(engine::SpeculativeOptions::Method method);

// The flags' speculative options. With --speculative_method=draft_model it
// opens --draft_model into *draft_model, which must outlive the engine
// (options->draft_model points at it). INVALID_ARGUMENT for a missing or
// unreadable draft model or bad sizes.
absl::Status SpeculativeOptionsFromFlags(
    engine::SpeculativeOptions* options,
    std::unique_ptr<model::Model>* draft_model);

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_SPECULATIVE_FLAGS_H_
