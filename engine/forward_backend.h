// ForwardBackend: runs the transformer over a batch of token chunks against
// the paged KV cache. This is the seam between the engine (scheduling,
// sampling, block bookkeeping) and the hardware: the CPU implementation is
// CpuBackend (engine/cpu_backend.h); a CUDA implementation fills the same
// interface with its KV pool in device memory.
//
// A batch mixes any number of sequence chunks: a prefill chunk (many new
// tokens of one prompt, possibly after an already cached prefix) and decode
// steps (one new token each) are the same thing to a backend, a run of new
// tokens at known positions whose earlier KV is already in the blocks of the
// chunk's block table. For every layer the backend writes the new tokens' K
// and V into those blocks before attending, so when Forward returns (and, per
// layer, when on_layer_done is called) the KV of every new token of that
// layer is in the pool.
//
// Thread-safety: one Forward at a time per backend (the engine loop).
#ifndef PDSERVE_ENGINE_FORWARD_BACKEND_H_
#define PDSERVE_ENGINE_FORWARD_BACKEND_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/block_pool.h"
#include "engine/kv_cache_pool.h"

namespace pdserve::engine {

enum class LogitsMode {
  kNone,  // intermediate prefill chunk: KV only
  kLast,  // logits of the chunk's last token (the usual case)
  kAll,   // logits of every token of the chunk (scoring, tests)
};

struct SequenceChunk {
  // The new tokens, at positions start_pos, start_pos + 1, ...
  absl::Span<const int32_t> tokens;
  int32_t start_pos = 0;
  // Blocks holding positions [0, start_pos + tokens.size()): position p
  // lives in block_table[p / block_size], slot p % block_size.
  absl::Span<const BlockId> block_table;
  LogitsMode logits = LogitsMode::kLast;
  // Positions below this are the sequence's prompt; the rest were
  // generated. Backends may compute the two differently (the CPU backend
  // follows llama.cpp's prompt and decode arithmetic), so it must be the
  // same whatever the chunking.
  int32_t prompt_length = 0;
};

struct ForwardBatch {
  std::vector<SequenceChunk> chunks;
  // Called after layer l's KV is written for every chunk (before layer l+1
  // starts), on the engine thread. Prefill workers start sending layer l's
  // blocks from here.
  std::function<void(int layer)> on_layer_done;
};

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  // Runs the batch. `logits` receives vocab_size() floats per requested
  // logits row, in chunk order (kLast: one row, kAll: one per token).
  // INVALID_ARGUMENT for a malformed batch (token id outside the vocabulary,
  // a position past the context length, a block table too short or naming
  // a block outside the pool); nothing is written to the cache then.
  virtual absl::Status Forward(const ForwardBatch& batch,
                               std::vector<float>* logits) = 0;

  virtual int32_t vocab_size() const = 0;
  // Threads the forward pass uses.
  virtual int num_threads() const = 0;
  virtual KvCachePool& kv_pool() = 0;
};

// Number of logits rows `batch` produces.
int64_t CountLogitsRows(const ForwardBatch& batch);

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_FORWARD_BACKEND_H_
