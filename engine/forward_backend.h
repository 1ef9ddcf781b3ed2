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

#include <algorithm>
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
  // lives in block_table[p / block_size], slot p % block_size. An entry
  // may be kNoBlock (a block freed because it fell out of every layer's
  // window or between the sinks and the window) when no new token of the
  // chunk attends any position in it, in any layer.
  absl::Span<const BlockId> block_table;
  LogitsMode logits = LogitsMode::kLast;
  // Positions below this are the sequence's prompt; the rest were
  // generated. Backends may compute the two differently (the CPU backend
  // follows llama.cpp's prompt and decode arithmetic), so it must be the
  // same whatever the chunking.
  int32_t prompt_length = 0;
  // Attention sinks (StreamingLLM), off when sink_window is 0: a query at
  // position p attends only the first attention_sinks positions and the
  // last sink_window ones (p - k < sink_window), so positions may then run
  // past the model's context. See KeysAttended.
  int32_t attention_sinks = 0;
  int32_t sink_window = 0;
};

// The keys a query at position `pos` attends in a layer whose sliding
// window is `layer_window` (0: none; ModelConfig::LayerWindow), given the
// chunk's attention sinks: [sink_begin, sink_end) and [recent_begin, pos].
// The two are disjoint and ordered (sink_end <= recent_begin). With neither
// a window nor sinks that is every position [0, pos]. A layer window and
// sinks together: the sinks too must be inside the layer's window (the
// model never saw keys older than its window).
struct AttendedKeys {
  int32_t sink_begin = 0;
  int32_t sink_end = 0;
  int32_t recent_begin = 0;

  int32_t count(int32_t pos) const {
    return sink_end - sink_begin + (pos + 1 - recent_begin);
  }
  bool Attends(int32_t key) const {
    return (key >= sink_begin && key < sink_end) || key >= recent_begin;
  }
};
inline AttendedKeys KeysAttended(int32_t pos, int32_t layer_window,
                                 int32_t attention_sinks, int32_t sink_window) {
  // llama.cpp's standard SWA masks a key when pos - key >= n_swa.
  const int32_t lo = layer_window > 0 ? std::max(0, pos - layer_window + 1) : 0;
  if (sink_window <= 0) return {lo, lo, lo};
  const int32_t recent = std::max(lo, pos - sink_window + 1);
  return {lo, std::min(std::max(attention_sinks, lo), recent), recent};
}

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
