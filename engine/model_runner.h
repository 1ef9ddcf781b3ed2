// ModelRunner: the engine's two entry points, Prefill and Decode, over a
// paged KV cache with prefix caching.
//
// It ties together a ForwardBackend (the math, CPU today), the KvBlockManager
// (which blocks each sequence owns, which full blocks are cached) and each
// sequence's token list. Callers name sequences by SeqId:
//   - a prefill worker calls Prefill for a batch of prompts and streams each
//     layer's blocks from the layer callback;
//   - a decode worker (after receiving KV into blocks it reserved) and the
//     colocated scheduler call Decode once per generated token;
//   - the scheduler mixes prefill chunks and decode steps in one forward pass
//     through Run.
// Prefill is chunked: no forward pass takes more than max_batch_tokens new
// tokens, and chunks of several prompts are packed into one pass.
//
// Ownership: borrows the model (config and weights) and owns the backend and
// block manager. Thread-safety: one caller at a time (the engine loop); the
// block manager it exposes is itself thread-safe.
#ifndef PDSERVE_ENGINE_MODEL_RUNNER_H_
#define PDSERVE_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/forward_backend.h"
#include "engine/kv_block_manager.h"
#include "engine/kv_cache_pool.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "proto/common.pb.h"

namespace pdserve::engine {

struct ModelRunnerOptions {
  // Tokens per KV block (paging and prefix-cache granularity).
  int32_t block_size = 16;
  // KV cache size: num_blocks when > 0, else as many blocks as fit in
  // kv_cache_bytes.
  int32_t num_blocks = 0;
  int64_t kv_cache_bytes = int64_t{256} << 20;
  // Where the KV pool's memory comes from (KvCachePool::Create); empty: the
  // pool's own anonymous memory.
  KvPoolAllocator kv_pool_allocator = nullptr;
  bool enable_prefix_cache = true;
  // Most new tokens in one forward pass (the chunked-prefill budget).
  int32_t max_batch_tokens = 512;
  // Forward-pass threads; <= 0: the CPUs this process may use.
  int num_threads = 0;
  // Reproduce llama.cpp's arithmetic for prompt tokens (see
  // CpuBackendOptions::llamacpp_prompt_numerics).
  bool llamacpp_prompt_numerics = true;
  // See CpuBackendOptions::pack_weights.
  bool pack_weights = true;
  // See CpuBackendOptions::matmul_arithmetic. Prefill and decode workers of
  // one cluster should agree: a stream continued in another arithmetic
  // than its prompt's matches neither's offline output.
  kernels::PackedArithmetic matmul_arithmetic =
      kernels::PackedArithmetic::kGgml;
  // How the KV cache stores K and V: KV_DTYPE_F16 (llama.cpp's numerics,
  // token for token) or KV_DTYPE_FP8_E4M3 (half the memory: twice the
  // tokens in the same kv_cache_bytes; attention sees each K and V value
  // rounded to fp8). Part of the KV layout, so prefill and decode workers
  // must agree (a transfer between different layouts is refused).
  v1::KvDtype kv_dtype = v1::KV_DTYPE_F16;
  // Attention sinks (StreamingLLM), off when sink_window is 0 (the
  // default). When on, every query attends only the first attention_sinks
  // positions of its sequence and its last sink_window ones, the blocks in
  // between are freed as the sequence grows, and a sequence may generate
  // past the model's context length with bounded KV (about attention_sinks
  // + sink_window tokens). This changes outputs: the model no longer sees
  // the middle of the sequence, and positions past the context were never
  // trained. Stored keys keep their original RoPE positions (no
  // re-rotation within the cache as the StreamingLLM paper does), so
  // positions past the context are rotated by angles the model never saw.
  // A prompt must still fit the context. docs/engine.md.
  int32_t attention_sinks = 0;
  int32_t sink_window = 0;
  // Testing only: see CpuBackendOptions::testing_attention_mask.
  std::function<bool(int layer, int32_t query_pos, int32_t key_pos)>
      testing_attention_mask = nullptr;
  // Testing only: every forward pass also sleeps pass_delay plus
  // token_delay per token it computes. Tests of scaling use it to stand in
  // for hardware whose capacity grows with the number of workers, which two
  // shared cores cannot give: a sleeping worker leaves the CPU to the
  // others. Zero (the default) adds nothing.
  absl::Duration testing_pass_delay = absl::ZeroDuration();
  absl::Duration testing_token_delay = absl::ZeroDuration();
};

class ModelRunner {
 public:
  using LayerCallback = std::function<void(int layer)>;

  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(
      const model::Model& model, const ModelRunnerOptions& options);

  // ---- Sequences -------------------------------------------------------
  // Registers a sequence with its tokens and looks them up in the prefix
  // cache; returns how many leading tokens are already cached (their KV is
  // reused, never recomputed). The first prompt_length tokens are the
  // prompt (all of them when negative); a request resuming after
  // preemption passes its prompt plus the tokens it had generated.
  // INVALID_ARGUMENT for an empty or over-long prompt or a duplicate id.
  absl::StatusOr<int32_t> AddSequence(SeqId id,
                                      absl::Span<const int32_t> tokens,
                                      int32_t prompt_length = -1);
  // Appends a generated token (its KV is computed by the next Decode/Run).
  absl::Status AppendToken(SeqId id, int32_t token);
  // Frees the sequence's blocks (full ones stay in the prefix cache).
  void Release(SeqId id);

  // ---- Speculative decoding --------------------------------------------
  // AppendDraft appends tokens a drafter proposed after the sequence's last
  // token (or its pending draft: a draft model appends one token per pass).
  // Run computes them like any other (ask the target for kAll logits to
  // verify them), but they stay tentative: they never enter the prefix
  // cache, and ResolveDraft must follow before AppendToken.
  // ResolveDraft keeps the first `accepted` draft tokens (their KV becomes
  // the sequence's like any computed token's) and drops the rest, tokens and
  // KV: the dropped positions are simply overwritten by the tokens that
  // come next. FAILED_PRECONDITION when no draft is pending (Resolve);
  // OUT_OF_RANGE when the draft would pass the context; INVALID_ARGUMENT for
  // bad token ids or accepted > draft size.
  absl::Status AppendDraft(SeqId id, absl::Span<const int32_t> draft);
  absl::Status ResolveDraft(SeqId id, int32_t accepted);
  // Draft tokens appended and not yet resolved (0 for an unknown id).
  int32_t num_draft(SeqId id) const;
  bool HasSequence(SeqId id) const { return seqs_.contains(id); }
  // Tokens of the sequence; those with KV computed.
  absl::Span<const int32_t> tokens(SeqId id) const;
  int32_t num_computed(SeqId id) const;

  // ---- Entry points ----------------------------------------------------
  struct PrefillOutput {
    SeqId id = 0;
    int32_t prompt_tokens = 0;
    int32_t cached_tokens = 0;  // prefix-cache hit
    std::vector<float> logits;  // next-token logits, vocab_size floats
  };
  // Prefill: registers each prompt (as AddSequence), reserves blocks for all
  // of them, computes KV for every uncached token and returns each prompt's
  // next-token logits. All or nothing: RESOURCE_EXHAUSTED when the blocks
  // cannot be reserved, INVALID_ARGUMENT for a bad prompt; on any error the
  // sequences this call registered are released.
  struct PrefillInput {
    SeqId id = 0;
    absl::Span<const int32_t> prompt;
  };
  absl::StatusOr<std::vector<PrefillOutput>> Prefill(
      absl::Span<const PrefillInput> inputs,
      const LayerCallback& on_layer_done = nullptr);

  // ---- KV computed elsewhere (disaggregated serving) ---------------------
  // A decode worker receives a prompt's KV from a prefill worker instead of
  // computing it:
  //   1. ReserveForTransfer registers the sequence with its prompt, looks
  //      the prompt up in the local prefix cache and reserves blocks for all
  //      of it. The prefill side must then write the KV of prompt positions
  //      [cached_tokens, prompt size) into `blocks` (position p lives in
  //      blocks[p / block_size], slot p % block_size, in this runner's
  //      KvLayout); positions below cached_tokens are already here.
  //   2. CompleteTransfer, once every layer has arrived (and been verified),
  //      marks the prompt computed (its full blocks become prefix-cacheable).
  //      The sequence then decodes like any other, its first Decode step
  //      taking the first token the prefill side sampled.
  // Release at any point frees the blocks.
  struct TransferTarget {
    int32_t cached_tokens = 0;
    std::vector<BlockId> blocks;
  };
  absl::StatusOr<TransferTarget> ReserveForTransfer(
      SeqId id, absl::Span<const int32_t> prompt);
  absl::Status CompleteTransfer(SeqId id);

  // Decode: one step for a batch of running sequences. tokens[i] is appended
  // to sequence ids[i] and its KV computed; logits receives one row per
  // sequence. RESOURCE_EXHAUSTED when a sequence needs a new block and none
  // is free (nothing is computed then; the scheduler preempts).
  absl::Status Decode(absl::Span<const SeqId> ids,
                      absl::Span<const int32_t> tokens,
                      std::vector<float>* logits);

  // Run: one forward pass over the next num_tokens uncomputed tokens of
  // each listed sequence (a prefill chunk or a decode step), reserving the
  // blocks they need first. Logits rows are produced per item as asked.
  struct StepItem {
    SeqId id = 0;
    int32_t num_tokens = 0;
    LogitsMode logits = LogitsMode::kLast;
  };
  absl::Status Run(absl::Span<const StepItem> items, std::vector<float>* logits,
                   const LayerCallback& on_layer_done = nullptr);

  const model::Model& model() const { return model_; }
  int32_t vocab_size() const { return model_.config().vocab_size; }
  int32_t context_length() const { return model_.config().context_length; }
  // The most tokens (prompt and generated) a sequence may reach: the
  // context, or no limit with attention sinks.
  int32_t sequence_limit() const {
    return streaming() ? INT32_MAX : context_length();
  }
  int32_t max_batch_tokens() const { return options_.max_batch_tokens; }
  int num_threads() const { return backend_->num_threads(); }
  KvBlockManager& blocks() { return *blocks_; }
  ForwardBackend& backend() { return *backend_; }
  const v1::KvLayout& kv_layout() const { return layout_; }

 private:
  struct Sequence {
    std::vector<int32_t> tokens;
    int32_t num_computed = 0;
    int32_t prompt_length = 0;
    // Reserved for KV computed elsewhere and not yet complete: nothing may
    // compute (and overwrite) its prompt positions.
    bool awaiting_transfer = false;
    // Trailing tokens that are an unverified draft (AppendDraft): computed
    // by Run but never marked computed in the block manager, so no block
    // holding them enters the prefix cache.
    int32_t num_draft = 0;
    // Tokens it was registered with (prompt, or prompt and earlier output
    // when resuming). Blocks out of the attention window are freed only
    // once a token past these is computed: until then a prefill worker may
    // still read every block of the prompt to send it.
    int32_t registered_length = 0;
    // Block-table entries FreeBlocksOutOfWindow has freed: [0,
    // freed_low_end) and, between the sinks and the window, up to
    // freed_gap_end.
    int32_t freed_low_end = 0;
    int32_t freed_gap_end = 0;
  };

  bool streaming() const { return options_.sink_window > 0; }
  // Frees the blocks of `id` that no query at a position >= num_computed
  // attends in any layer (sliding windows, attention sinks): called after
  // each forward pass. Nothing for a sequence still within its registered
  // tokens, or when a layer attends the whole context.
  absl::Status FreeBlocksOutOfWindow(SeqId id, Sequence& s);

  ModelRunner(const model::Model& model, const ModelRunnerOptions& options)
      : model_(model), options_(options) {}

  const model::Model& model_;
  const ModelRunnerOptions options_;
  v1::KvLayout layout_;
  std::unique_ptr<ForwardBackend> backend_;
  std::unique_ptr<KvBlockManager> blocks_;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  // Per-step scratch, reused: block tables, the batch handed to the
  // backend, Decode's step items.
  std::vector<std::vector<BlockId>> table_scratch_;
  ForwardBatch batch_;
  std::vector<StepItem> step_items_;
  // The longest a sequence can get: the context, or the whole KV cache when
  // that is smaller (a model may claim a context far beyond the memory).
  // Token ids and block tables are reserved for it. Set by Create.
  int32_t max_sequence_tokens_ = 0;

  // Blocks that hold max_sequence_tokens_.
  int32_t MaxSequenceBlocks() const {
    return static_cast<int32_t>(
        (int64_t{max_sequence_tokens_} + options_.block_size - 1) /
        options_.block_size);
  }
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_MODEL_RUNNER_H_
