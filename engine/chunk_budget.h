// ChunkBudget: how one forward pass is packed under max_batch_tokens, the
// rule that both LlmEngine's scheduler and the prefill worker's follow (it
// is what chunked prefill means): each sequence in the pass takes the next
// chunk of its uncomputed tokens, at most what the budget has left; a chunk
// that reaches the end of the sequence's tokens asks for next-token logits
// (LogitsMode::kLast), an earlier one only computes KV (kNone).
//
// Value type, one per pass; used on the scheduling thread.
#ifndef PDSERVE_ENGINE_CHUNK_BUDGET_H_
#define PDSERVE_ENGINE_CHUNK_BUDGET_H_

#include <algorithm>
#include <cstdint>

#include "engine/forward_backend.h"
#include "engine/kv_block_manager.h"
#include "engine/model_runner.h"

namespace pdserve::engine {

class ChunkBudget {
 public:
  explicit ChunkBudget(int32_t max_batch_tokens) : left_(max_batch_tokens) {}

  // Tokens this pass can still take.
  int32_t left() const { return left_; }

  // How many of a sequence's `remaining` uncomputed tokens fit in this pass
  // (<= 0: none).
  int32_t Fit(int32_t remaining) const { return std::min(remaining, left_); }

  // Spends `n` tokens (at most Fit(remaining)) on sequence `id` and returns
  // its item of the pass.
  ModelRunner::StepItem Take(SeqId id, int32_t n, int32_t remaining) {
    left_ -= n;
    return {id, n, n == remaining ? LogitsMode::kLast : LogitsMode::kNone};
  }

 private:
  int32_t left_;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_CHUNK_BUDGET_H_
