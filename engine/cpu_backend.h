// CpuBackend: the transformer forward pass on the CPU, for the llama and
// qwen2 families (model/model_config.h), over a paged KV cache in fp16 (the
// default, llama.cpp's numerics) or FP8 E4M3 (half the memory).
//
// Numerics follow llama.cpp's CPU backend closely, because pdserve's greedy
// output is checked token for token against it:
//  - each matrix product quantizes its activation rows to the weight type's
//    dot-product format (Q8_0 / Q8_1 / Q8_K, see kernels/matmul.h) and sums
//    integer products per block;
//  - RMSNorm sums squares in double and scales in float, then multiplies by
//    the weight (ggml_rms_norm followed by ggml_mul);
//  - RoPE angles are built as ggml does, multiplying theta by
//    base^(-2/dims) pair after pair in float;
//  - RoPE rotates with ggml's fused multiply-adds (kernels/ggml_ops.h);
//  - K and V are stored as fp16; attention rounds the query and the softmax
//    probabilities to fp16 before their dot products, as ggml's f16
//    matrix products do, and sums them, computes the softmax (ggml's
//    vectorised exp, denominator in double) and SwiGLU exactly as ggml-cpu
//    does (kernels/ggml_ops.h), bit for bit.
//
// Work is split over a persistent thread pool: matrix rows for the products,
// (token, head) pairs for attention. Results do not depend on the number of
// threads (every output element is computed by exactly one thread in a fixed
// order).
//
// Ownership: borrows the ModelConfig and ModelWeights (which borrow the
// GgufFile) — all must outlive the backend; owns the KV pool and scratch.
// Thread-safety: one Forward at a time.
#ifndef PDSERVE_ENGINE_CPU_BACKEND_H_
#define PDSERVE_ENGINE_CPU_BACKEND_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/huge_page_buffer.h"
#include "common/thread_pool.h"
#include "engine/forward_backend.h"
#include "engine/kv_cache_pool.h"
#include "kernels/ggml_type.h"
#include "kernels/matmul.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace pdserve::engine {

struct CpuBackendOptions {
  // Threads for the forward pass; <= 0 means the CPUs this process may use.
  int num_threads = 0;
  // llama.cpp sums attention's f16 dot products in one order when it
  // processes a batch of two or more tokens (tinyBLAS: the prompt) and in
  // another for a single token (ggml_vec_dot_f16: each decode step). When
  // set (the default), prompt tokens of prompts of two or more tokens take
  // the batched order and every other token the single-token order, which
  // reproduces llama.cpp's greedy output token for token. The choice depends
  // only on whether a position is part of the prompt (SequenceChunk::
  // prompt_length), never on how the prompt is cut into chunks, so chunked
  // prefill, prefix-cache hits and recomputation after preemption still give
  // bitwise-identical results. When clear, every token takes the
  // single-token order, and a prompt fed one token at a time equals a
  // prefilled one bit for bit too.
  bool llamacpp_prompt_numerics = true;
  // Keep a copy of each matrix repacked for the SIMD kernels
  // (kernels::PackedMatrix) where this CPU has kernels for it, the output
  // head too: decode steps of a single sequence then stream weights at close
  // to memory speed, and prompts and batched decode steps run about 1.5x
  // faster than on the GGUF layout. The GGUF pages of those matrices are
  // then never read (they stay in the page cache, not in the process's
  // memory); the copy costs 98 MB for the default model and about 0.1 s at
  // start.
  bool pack_weights = true;
  // How the packed matrices' products add up (kernels::PackedArithmetic).
  // kGgml (the default) is llama.cpp's arithmetic bit for bit; kBlockSums
  // rounds once per 32-element block instead of in eight lanes, which makes
  // prompts and batched decode steps about 1.8x faster in their products
  // and moves every logit by a few ulps (greedy tokens may part from
  // llama.cpp's after a while). Either way the results depend on nothing
  // but the sequence: not on batching, chunking, threads or the prefix
  // cache. Matrices without a packed form (other formats, CPUs without
  // AVX-512 VNNI, pack_weights off) keep ggml's order.
  kernels::PackedArithmetic matmul_arithmetic =
      kernels::PackedArithmetic::kGgml;
  // Testing only: when set, replaces the sliding-window and attention-sink
  // rules. Every query attends the keys [0, pos] for which it returns true
  // (the rest are masked with -inf before the softmax, as llama.cpp masks),
  // all read from the cache, so no block may be a hole. The reference that
  // window and sink tests compare the real rules against. Called from the
  // forward pass's threads: it must be a pure function.
  std::function<bool(int layer, int32_t query_pos, int32_t key_pos)>
      testing_attention_mask = nullptr;
};

class CpuBackend : public ForwardBackend {
 public:
  // INVALID_ARGUMENT when the pool's layout does not fit the model (layers,
  // KV heads, head size) or is not fp16.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      const model::ModelConfig& config, const model::ModelWeights& weights,
      std::unique_ptr<KvCachePool> pool, const CpuBackendOptions& options);

  absl::Status Forward(const ForwardBatch& batch,
                       std::vector<float>* logits) override;
  int32_t vocab_size() const override { return config_.vocab_size; }
  KvCachePool& kv_pool() override { return *pool_; }
  int num_threads() const override { return threads_.num_threads(); }

 private:
  // One new token of the batch.
  struct TokenRef {
    int32_t chunk;
    int32_t pos;
  };
  // Activation rows quantized for one dot-product format, reused by every
  // matrix that reads the same rows in the same format (Q, K and V).
  struct QuantizedRows {
    const float* source = nullptr;
    kernels::GgmlType format = kernels::GgmlType::kF32;
    int64_t row_bytes = 0;
    std::vector<uint8_t> bytes;
  };

  CpuBackend(const model::ModelConfig& config,
             const model::ModelWeights& weights,
             std::unique_ptr<KvCachePool> pool,
             const CpuBackendOptions& options);

  // Packs the layer matrices and the output head into packed_storage_.
  void PackWeights(kernels::PackedArithmetic arithmetic);
  absl::Status Validate(const ForwardBatch& batch) const;
  // out[t * w.rows + r] = row r of w . x[t], for t < n_tokens.
  void MatMul(const model::WeightMatrix& w, const float* x, int n_tokens,
              float* out, QuantizedRows* cache);
  // The products of up to four matrices that read the same rows x (Q, K
  // and V; gate and up), out of one parallel region.
  struct MatMulJob {
    const model::WeightMatrix* w;
    float* out;  // [n_tokens][w->rows]
  };
  void MatMuls(std::initializer_list<MatMulJob> jobs, const float* x,
               int n_tokens, QuantizedRows* cache);
  // fn(begin, end) over token ranges covering [0, n_tokens): split among
  // the threads for prompts and batches, inline for a token or a few (a
  // parallel region costs more than their work).
  void ForTokens(int n_tokens, absl::FunctionRef<void(int64_t, int64_t)> fn);
  // The per-token steps, on tokens [begin, end).
  void RmsNorm(const float* x, const std::vector<float>& weight, int64_t begin,
               int64_t end, float* out);
  void ComputeRopeTables(int n_tokens);
  void ApplyRope(float* rows, int64_t begin, int64_t end, int n_heads);
  void StoreKv(const ForwardBatch& batch, int layer, int64_t begin,
               int64_t end);
  // x += proj on the tokens' rows, then xn = RmsNorm(x, norm) (none when
  // norm is null): the end of one block and the start of the next.
  void AddResidualAndNorm(const std::vector<float>* norm, int n_tokens);
  void Attention(const ForwardBatch& batch, int layer, int n_tokens);
  // Fills widened_chunks_ and widened_ for this layer.
  void WidenContexts(const ForwardBatch& batch, int layer);

  const model::ModelConfig& config_;
  const model::ModelWeights& weights_;
  std::unique_ptr<KvCachePool> pool_;
  common::ThreadPool threads_;
  const bool llamacpp_prompt_numerics_;
  // KV stored as FP8 E4M3 (half the memory of fp16): rounded once when
  // stored, widened to fp16 exactly when read, so attention's arithmetic is
  // the fp16 cache's on the rounded values.
  const bool fp8_kv_;
  const std::function<bool(int, int32_t, int32_t)> testing_attention_mask_;
  // Packed copies of the layer matrices and the output head, by their
  // weights' address, all in packed_storage_ (one huge-page buffer, in the
  // order a forward pass reads them: a decode step streams it front to back
  // with few TLB misses).
  common::HugePageBuffer packed_storage_;
  absl::flat_hash_map<const uint8_t*, std::unique_ptr<kernels::PackedMatrix>>
      packed_;

  // Scratch, grown to the largest batch seen and then reused.
  std::vector<TokenRef> tokens_;
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, proj_;
  std::vector<float> rope_cos_, rope_sin_;  // [n_tokens][rope_dims / 2]
  // The contexts of this layer's multi-token chunks (prompts), widened to
  // fp32 once for all their queries (kernels::DotF16ManyTransposed): per
  // chunk, per KV head, stride * head_dim floats of key blocks, then as many
  // of slot-major values (stride / 16 rows per slot); stride = context
  // rounded up to 16. widened_base_: widened_'s first 64-byte boundary.
  struct WidenedContext {
    int64_t offset = -1;  // into widened_; -1: the chunk reads the cache
    int64_t length = 0;   // positions [0, length)
    int64_t stride = 0;
  };
  std::vector<WidenedContext> widened_chunks_;
  std::vector<std::pair<int64_t, size_t>> widened_starts_;  // (item, chunk)
  std::vector<float> widened_;
  float* widened_base_ = nullptr;
  QuantizedRows qrows_a_, qrows_b_;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_CPU_BACKEND_H_
