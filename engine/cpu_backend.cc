#include "engine/cpu_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/huge_page_buffer.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/ggml_ops.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

namespace pdserve::engine {
namespace {

// Asks for a gathered cache row, into L2, ahead of the kernels that read
// it. A decode step's context rows were written steps ago and the weights
// streaming through since have pushed them out to L3 or memory; the kernels
// spend a few instructions per row, so without this they wait on one row's
// miss after another. Into L2, not L1: a (token, KV head)'s keys and values
// outgrow L1 (32 KiB) from about 128 positions, and rows asked into L1
// evicted each other before the kernels came to them. One thread, default
// model, block sums, prompt 300 / 1500 tokens: batch 8 368-375 -> 590-594
// and 106-108 -> 216-220 tokens/s, one stream 174-186 -> 212-217 and 75-80
// -> 114-124; 16-token prompts unchanged. Asking for the rows as they are
// gathered (a few instructions apart) beat asking for them in a loop of
// their own afterwards, or from the kernels a fixed distance ahead (both
// measured slower). Always inlined: GCC 12 drops calls of a function that
// only prefetches (it finds no side effects).
[[gnu::always_inline]] inline void PrefetchRow(const void* row, int bytes) {
  const char* p = static_cast<const char*>(row);
  constexpr int kIntoL2 = 2;  // __builtin_prefetch's locality: prefetcht1
  for (int at = 0; at < bytes; at += 64) __builtin_prefetch(p + at, 0, kIntoL2);
  // The last line of an unaligned row.
  __builtin_prefetch(p + bytes - 1, 0, kIntoL2);
}

// RmsNorm of kRows rows (row r at x + r * dim, out + r * dim), as ggml's
// rms_norm_f32: each row's squares summed in double, element after element
// (the rows' chains interleaved), then row / sqrt(mean + eps) (its scale
// applied first) times the norm's weight. restrict: lets the compiler
// vectorize the second loop without run-time overlap checks.
template <int kRows>
void NormalizeRows(const float* __restrict x, const float* __restrict weight,
                   float eps, int dim, float* __restrict out) {
  double sums[kRows] = {};
  for (int i = 0; i < dim; ++i) {
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float v = x[int64_t{r} * dim + i];
      sums[r] += static_cast<double>(v * v);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const float mean = static_cast<float>(sums[r] / dim);
    const float scale = 1.0f / std::sqrt(mean + eps);
    const float* row = x + int64_t{r} * dim;
    float* dst = out + int64_t{r} * dim;
    for (int i = 0; i < dim; ++i) dst[i] = (row[i] * scale) * weight[i];
  }
}

using kernels::GgmlType;
using kv_layout::KvHalf;
using model::WeightMatrix;

}  // namespace

int64_t CountLogitsRows(const ForwardBatch& batch) {
  int64_t rows = 0;
  for (const SequenceChunk& c : batch.chunks) {
    if (c.logits == LogitsMode::kLast) rows += 1;
    if (c.logits == LogitsMode::kAll) rows += c.tokens.size();
  }
  return rows;
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    const model::ModelConfig& config, const model::ModelWeights& weights,
    std::unique_ptr<KvCachePool> pool, const CpuBackendOptions& options) {
  if (pool == nullptr) return absl::InvalidArgumentError("no KV cache pool");
  const v1::KvLayout& l = pool->layout();
  if (l.num_layers() != static_cast<uint32_t>(config.num_layers) ||
      l.num_kv_heads() != static_cast<uint32_t>(config.num_kv_heads) ||
      l.head_dim() != static_cast<uint32_t>(config.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout (", l.num_layers(), " layers, ",
                     l.num_kv_heads(), " KV heads of ", l.head_dim(),
                     ") does not fit the model (", config.num_layers, ", ",
                     config.num_kv_heads, ", ", config.head_dim, ")"));
  }
  if (l.dtype() != v1::KV_DTYPE_F16 && l.dtype() != v1::KV_DTYPE_FP8_E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CPU backend keeps KV in fp16 or fp8 (E4M3), not ",
                     v1::KvDtype_Name(l.dtype())));
  }
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(config, weights, std::move(pool), options));
}

CpuBackend::CpuBackend(const model::ModelConfig& config,
                       const model::ModelWeights& weights,
                       std::unique_ptr<KvCachePool> pool,
                       const CpuBackendOptions& options)
    : config_(config),
      weights_(weights),
      pool_(std::move(pool)),
      threads_(options.num_threads),
      llamacpp_prompt_numerics_(options.llamacpp_prompt_numerics),
      fp8_kv_(pool_->layout().dtype() == v1::KV_DTYPE_FP8_E4M3),
      testing_attention_mask_(options.testing_attention_mask) {
  if (options.pack_weights) PackWeights(options.matmul_arithmetic);
}

void CpuBackend::PackWeights(kernels::PackedArithmetic arithmetic) {
  // The matrices in the order a forward pass reads them, so that one step
  // streams the buffer front to back (and a kernel's prefetches past the
  // end of one matrix fetch the next).
  std::vector<const WeightMatrix*> order;
  for (const model::LayerWeights& l : weights_.layers) {
    for (const WeightMatrix* w :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      order.push_back(w);
    }
  }
  order.push_back(&weights_.output);
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const WeightMatrix* w : order) {
    offsets.push_back(total);
    total += kernels::PackedMatrix::StorageBytes(w->type, w->rows, w->cols);
  }
  if (total == 0) return;  // no packed kernels on this CPU
  absl::StatusOr<common::HugePageBuffer> storage =
      common::HugePageBuffer::Allocate(total);
  if (!storage.ok()) {
    // Out of memory for a copy: the matrices are multiplied as the file has
    // them (correct, slower).
    PD_LOG(WARNING) << "weights left unpacked: " << storage.status().message();
    return;
  }
  packed_storage_ = *std::move(storage);
  for (size_t i = 0; i < order.size(); ++i) {
    const WeightMatrix& w = *order[i];
    std::unique_ptr<kernels::PackedMatrix> packed =
        kernels::PackedMatrix::PackInto(w.type, w.data, w.rows, w.cols,
                                        arithmetic,
                                        packed_storage_.data() + offsets[i]);
    if (packed != nullptr) packed_[w.data] = std::move(packed);
  }
  PD_LOG(INFO) << "packed weights: " << packed_storage_.size() / double{1 << 20}
               << " MiB, " << packed_storage_.HugePageBytes() / double{1 << 20}
               << " MiB of it on huge pages (transparent huge pages: "
               << common::TransparentHugePageMode() << ")";
}

absl::Status CpuBackend::Validate(const ForwardBatch& batch) const {
  const int32_t bs = pool_->layout().block_size_tokens();
  const int32_t num_blocks = pool_->layout().num_blocks();
  if (batch.chunks.empty()) return absl::InvalidArgumentError("empty batch");
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    const SequenceChunk& c = batch.chunks[i];
    if (c.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", i, " is empty"));
    }
    if (c.attention_sinks < 0 || c.sink_window < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, " has negative attention sinks"));
    }
    // With attention sinks, positions may run past the trained context
    // (StreamingLLM keeps the original RoPE positions; see ModelRunner).
    const int64_t end = int64_t{c.start_pos} + c.tokens.size();
    if (c.start_pos < 0 || end > INT32_MAX ||
        (c.sink_window == 0 && end > config_.context_length)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", i, " covers positions [", c.start_pos, ", ", end,
          "), outside the context of ", config_.context_length, " tokens"));
    }
    const int64_t blocks_needed = (end + bs - 1) / bs;
    if (static_cast<int64_t>(c.block_table.size()) < blocks_needed) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, " needs ", blocks_needed,
                       " blocks, its block table has ", c.block_table.size()));
    }
    // Keys some new token of the chunk may attend, in some layer (over all
    // layers, so a little more than that in a model mixing windows and
    // sinks): [sink_lo, sink_hi) and [recent_lo, end). Computed at the
    // first hole.
    int32_t sink_lo = -1, sink_hi = 0, recent_lo = 0;
    for (int64_t b = 0; b < blocks_needed; ++b) {
      if (c.block_table[b] == kNoBlock) {
        if (sink_lo < 0) {
          sink_lo = recent_lo = INT32_MAX;
          for (int l = 0; l < config_.num_layers; ++l) {
            const int32_t w = config_.LayerWindow(l);
            // The first token's window starts earliest; the last token's
            // sinks end latest.
            const AttendedKeys first =
                KeysAttended(c.start_pos, w, c.attention_sinks, c.sink_window);
            const AttendedKeys last =
                KeysAttended(static_cast<int32_t>(end - 1), w,
                             c.attention_sinks, c.sink_window);
            sink_lo = std::min(sink_lo, first.sink_begin);
            sink_hi = std::max(sink_hi, last.sink_end);
            recent_lo = std::min(recent_lo, first.recent_begin);
          }
        }
        const int64_t lo = b * bs, hi = lo + bs;
        if (hi > recent_lo || (lo < sink_hi && hi > sink_lo)) {
          return absl::InvalidArgumentError(
              absl::StrCat("chunk ", i, " has no block for positions [", lo,
                           ", ", hi, "), which its queries attend"));
        }
        continue;
      }
      if (c.block_table[b] < 0 || c.block_table[b] >= num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk ", i, " names block ", c.block_table[b],
                         ", outside the pool of ", num_blocks));
      }
    }
    for (int32_t t : c.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", t, " outside the vocabulary of ", config_.vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

void CpuBackend::MatMul(const WeightMatrix& w, const float* x, int n_tokens,
                        float* out, QuantizedRows* cache) {
  MatMuls({{&w, out}}, x, n_tokens, cache);
}

void CpuBackend::MatMuls(std::initializer_list<MatMulJob> jobs, const float* x,
                         int n_tokens, QuantizedRows* cache) {
  // VecDotType cannot fail: ModelWeights::Load refused unsupported formats.
  const GgmlType format = *kernels::VecDotType(jobs.begin()->w->type);
  constexpr size_t kMaxJobs = 4;
  const bool one_region =
      jobs.size() <= kMaxJobs &&
      std::all_of(jobs.begin(), jobs.end(), [&](const MatMulJob& job) {
        return *kernels::VecDotType(job.w->type) == format;
      });
  if (!one_region) {
    // Mixed activation formats (some K-quant mixes), or more jobs than
    // parts below: one region each.
    for (const MatMulJob& one : jobs) MatMuls({one}, x, n_tokens, cache);
    return;
  }
  const int64_t cols = jobs.begin()->w->cols;
  if (cache->source != x || cache->format != format) {
    cache->source = x;
    cache->format = format;
    cache->row_bytes = kernels::ActivationRowBytes(format, cols);
    cache->bytes.resize(cache->row_bytes * n_tokens);
    threads_.ParallelFor(n_tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        kernels::QuantizeActivations(
            format, x + t * cols, cols,
            cache->bytes.data() + t * cache->row_bytes);
      }
    });
  }
  // One parallel region over the matrices' rows laid end to end: a decode
  // step then waits for its threads once per group of matrices that read
  // the same input (Q, K, V; gate, up), not once per matrix. Each matrix
  // starts at a multiple of the row grain, so a range aligned to it starts
  // every matrix's part aligned too (the packed kernel needs that).
  constexpr int64_t kGrain = kernels::PackedMatrix::kRowGrain;
  struct Part {
    const WeightMatrix* w;
    float* out;
    const kernels::PackedMatrix* packed;
    int64_t offset;
  };
  std::array<Part, kMaxJobs> parts;
  int count = 0;
  int64_t total = 0;
  for (const MatMulJob& job : jobs) {
    const kernels::PackedMatrix* packed = nullptr;
    auto it = packed_.find(job.w->data);
    if (it != packed_.end()) packed = it->second.get();
    parts[count++] = {job.w, job.out, packed, total};
    total += (job.w->rows + kGrain - 1) / kGrain * kGrain;
  }
  threads_.ParallelForGrained(total, kGrain, [&](int64_t begin, int64_t end) {
    for (int i = 0; i < count; ++i) {
      const Part& p = parts[i];
      const int64_t lo = std::max(begin, p.offset) - p.offset;
      const int64_t hi = std::min(end, p.offset + p.w->rows) - p.offset;
      if (lo >= hi) continue;
      if (p.packed != nullptr) {
        p.packed->MatMul(lo, hi, cache->bytes.data(), n_tokens, p.out,
                         p.w->rows);
      } else {
        kernels::MatMulRows(p.w->type, p.w->data, p.w->cols, lo, hi,
                            cache->bytes.data(), n_tokens, p.out, p.w->rows);
      }
    }
  });
}

void CpuBackend::ForTokens(int n_tokens,
                           absl::FunctionRef<void(int64_t, int64_t)> fn) {
  constexpr int kMinParallelTokens = 8;
  if (n_tokens < kMinParallelTokens) {
    fn(0, n_tokens);
  } else {
    threads_.ParallelFor(n_tokens, fn);
  }
}

void CpuBackend::RmsNorm(const float* x, const std::vector<float>& weight,
                         int64_t begin, int64_t end, float* out) {
  const int dim = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  // ggml sums a row's squares one after another in double: each row's sum
  // is one chain of dependent additions, and alone it waits on every
  // addition's latency (a few percent of a batched decode step). Eight or
  // four rows at a time, their chains interleaved, keep the adder busy; each
  // row's sum is still its own additions in its own order.
  int64_t t = begin;
  for (; t + 8 <= end; t += 8) {
    NormalizeRows<8>(x + t * dim, weight.data(), eps, dim, out + t * dim);
  }
  for (; t + 4 <= end; t += 4) {  // two threads' halves of a batch of 8
    NormalizeRows<4>(x + t * dim, weight.data(), eps, dim, out + t * dim);
  }
  for (; t < end; ++t) {
    NormalizeRows<1>(x + t * dim, weight.data(), eps, dim, out + t * dim);
  }
}

void CpuBackend::AddResidualAndNorm(const std::vector<float>* norm,
                                    int n_tokens) {
  const int64_t dim = config_.hidden_size;
  ForTokens(n_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * dim; i < end * dim; ++i) x_[i] += proj_[i];
    if (norm != nullptr) RmsNorm(x_.data(), *norm, begin, end, xn_.data());
  });
}

void CpuBackend::ComputeRopeTables(int n_tokens) {
  const int pairs = config_.rope_dims / 2;
  rope_cos_.resize(int64_t{n_tokens} * pairs);
  rope_sin_.resize(int64_t{n_tokens} * pairs);
  const float theta_scale =
      std::pow(config_.rope_freq_base, -2.0f / config_.rope_dims);
  const std::vector<float>& factors = weights_.rope_freq_factors;
  for (int t = 0; t < n_tokens; ++t) {
    float theta = static_cast<float>(tokens_[t].pos);
    for (int i = 0; i < pairs; ++i) {
      const float ff = factors.empty() ? 1.0f : factors[i];
      const float angle = config_.rope_freq_scale * (theta / ff);
      rope_cos_[int64_t{t} * pairs + i] = std::cos(angle);
      rope_sin_[int64_t{t} * pairs + i] = std::sin(angle);
      theta *= theta_scale;
    }
  }
}

void CpuBackend::ApplyRope(float* rows, int64_t begin, int64_t end,
                           int n_heads) {
  const int pairs = config_.rope_dims / 2;
  const int head_dim = config_.head_dim;
  const bool halves = config_.rope_style == model::RopeStyle::kHalves;
  for (int64_t t = begin; t < end; ++t) {
    const float* cs = rope_cos_.data() + t * pairs;
    const float* sn = rope_sin_.data() + t * pairs;
    for (int h = 0; h < n_heads; ++h) {
      float* x = rows + (t * n_heads + h) * head_dim;
      for (int i = 0; i < pairs; ++i) {
        const int a = halves ? i : 2 * i;
        const int b = halves ? i + pairs : 2 * i + 1;
        kernels::RopeRotateGgml(x[a], x[b], cs[i], sn[i], &x[a], &x[b]);
      }
    }
  }
}

void CpuBackend::StoreKv(const ForwardBatch& batch, int layer, int64_t begin,
                         int64_t end) {
  const int32_t bs = pool_->layout().block_size_tokens();
  const int kv = config_.kv_size();
  for (int64_t t = begin; t < end; ++t) {
    const SequenceChunk& c = batch.chunks[tokens_[t].chunk];
    const int32_t pos = tokens_[t].pos;
    const uint32_t block = c.block_table[pos / bs];
    uint8_t* kdst = pool_->Slot(layer, block, KvHalf::kKey, pos % bs);
    uint8_t* vdst = pool_->Slot(layer, block, KvHalf::kValue, pos % bs);
    const float* k = k_.data() + t * kv;
    const float* v = v_.data() + t * kv;
    if (fp8_kv_) {
      kernels::Fp32ToFp8E4M3Row(k, kv, kdst);
      kernels::Fp32ToFp8E4M3Row(v, kv, vdst);
    } else {
      kernels::Fp32ToFp16Row(k, kv, reinterpret_cast<uint16_t*>(kdst));
      kernels::Fp32ToFp16Row(v, kv, reinterpret_cast<uint16_t*>(vdst));
    }
  }
}

void CpuBackend::WidenContexts(const ForwardBatch& batch, int layer) {
  const int d = config_.head_dim;
  const int kv_heads = config_.num_kv_heads;
  const int32_t bs = pool_->layout().block_size_tokens();
  widened_chunks_.assign(batch.chunks.size(), {});
  int64_t total = 0;
  for (size_t ci = 0; ci < batch.chunks.size(); ++ci) {
    const SequenceChunk& c = batch.chunks[ci];
    // One token's query heads would not repay widening its context.
    if (c.tokens.size() < 2) continue;
    WidenedContext& w = widened_chunks_[ci];
    w.offset = total;
    w.length = c.start_pos + static_cast<int64_t>(c.tokens.size());
    w.stride = (w.length + 15) / 16 * 16;
    total += int64_t{2} * kv_heads * d * w.stride;
  }
  if (total == 0) return;
  // Key blocks read whole cache lines: 64-byte aligned.
  widened_.resize(total + 16);
  widened_base_ =
      widened_.data() +
      (16 - reinterpret_cast<uintptr_t>(widened_.data()) / 4 % 16) % 16;
  // Positions of all such chunks laid end to end, split among the threads.
  std::vector<std::pair<int64_t, size_t>>& starts = widened_starts_;
  starts.clear();
  int64_t items = 0;
  for (size_t ci = 0; ci < batch.chunks.size(); ++ci) {
    const WidenedContext& w = widened_chunks_[ci];
    if (w.offset < 0) continue;
    starts.push_back({items, ci});
    items += w.length;
    // The last key block's spare columns are read (their scores dropped):
    // zeros, not stale floats that could be denormals.
    for (int kvh = 0; kvh < kv_heads; ++kvh) {
      float* keys = widened_base_ + w.offset + int64_t{2} * kvh * d * w.stride;
      for (int64_t j = w.length; j < w.stride; ++j) {
        for (int e = 0; e < d; ++e) keys[kernels::KeyBlockIndex(j, e, d)] = 0;
      }
    }
  }
  threads_.ParallelFor(items, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint16_t> row16;
    thread_local std::vector<float> row32;
    row16.resize(d);
    row32.resize(d);
    auto part =
        std::upper_bound(starts.begin(), starts.end(), begin,
                         [](int64_t v, const auto& s) { return v < s.first; }) -
        1;
    for (int64_t item = begin; item < end; ++item) {
      while (part + 1 != starts.end() && (part + 1)->first <= item) ++part;
      const size_t ci = part->second;
      const SequenceChunk& c = batch.chunks[ci];
      const WidenedContext& w = widened_chunks_[ci];
      const int64_t j = item - part->first;
      const BlockId block = c.block_table[j / bs];
      for (const KvHalf half : {KvHalf::kKey, KvHalf::kValue}) {
        // A freed block's positions are masked (Validate): zeros, which
        // their zero probabilities leave at zero.
        const uint8_t* slot = block == kNoBlock
                                  ? nullptr
                                  : pool_->Slot(layer, block, half, j % bs);
        for (int kvh = 0; kvh < kv_heads; ++kvh) {
          const uint16_t* h16;
          if (slot == nullptr) {
            std::fill(row16.begin(), row16.end(), uint16_t{0});
            h16 = row16.data();
          } else if (fp8_kv_) {
            kernels::Fp8E4M3ToFp16Row(slot + int64_t{kvh} * d, d, row16.data());
            h16 = row16.data();
          } else {
            h16 = reinterpret_cast<const uint16_t*>(slot) + kvh * d;
          }
          // Key blocks and slot-major values (kernels/ggml_ops.h).
          float* head =
              widened_base_ + w.offset +
              (int64_t{2} * kvh + (half == KvHalf::kValue)) * d * w.stride;
          if (half == KvHalf::kValue) {
            kernels::Fp16ToFp32Row(
                h16, d, head + kernels::SlotMajorRow(j, w.stride / 16) * d);
          } else {
            kernels::Fp16ToFp32Row(h16, d, row32.data());
            for (int e = 0; e < d; ++e) {
              head[kernels::KeyBlockIndex(j, e, d)] = row32[e];
            }
          }
        }
      }
    }
  });
}

void CpuBackend::Attention(const ForwardBatch& batch, int layer, int n_tokens) {
  const int heads = config_.num_heads;
  const int group = config_.num_heads / config_.num_kv_heads;
  const int d = config_.head_dim;
  const int32_t bs = pool_->layout().block_size_tokens();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // A token's attention costs grow with its position, and ParallelFor gives
  // each thread one contiguous range: items go in zig-zag token order
  // (first, last, second, second to last, ...) so that the ranges carry
  // about the same work. An item is one (token, KV head) when there are at
  // least as many as threads: the query heads that share the KV head then
  // read its rows once, together (at decode's short contexts about half
  // the cost of a head at a time, so even three items on two threads beat
  // nine single heads); otherwise (a model with one KV head) one
  // (token, query head), so that every thread works. Every (token, head)
  // is computed the same way whichever thread takes it.
  const int kv_heads = config_.num_kv_heads;
  const int per_item =
      int64_t{n_tokens} * kv_heads >= threads_.num_threads() ? group : 1;
  const int items_per_token = heads / per_item;
  WidenContexts(batch, layer);
  threads_.ParallelFor(int64_t{n_tokens} * items_per_token, [&](int64_t begin,
                                                                int64_t end) {
    thread_local std::vector<float> scores;
    thread_local std::vector<float> probs;
    thread_local std::vector<uint16_t> q16;
    thread_local std::vector<const uint16_t*> krows;
    thread_local std::vector<const uint16_t*> vrows;
    // An fp8 cache's rows of this (token, KV head), widened to fp16 (exact),
    // so that the f16 products below run unchanged.
    thread_local std::vector<uint16_t> widened;
    thread_local std::vector<float> qf;
    q16.resize(int64_t{group} * d);
    qf.resize(int64_t{group} * d);
    // Sized for the whole context on a thread's first call, so that later
    // steps (decode) never allocate.
    const int64_t most = config_.context_length;
    if (krows.capacity() < static_cast<size_t>(most)) {
      krows.reserve(most);
      vrows.reserve(most);
      scores.reserve(group * ((most + 15) / 16 * 16));
      probs.reserve(group * ((most + 15) / 16 * 16));
    }
    if (fp8_kv_ && widened.capacity() < static_cast<size_t>(2 * most * d)) {
      widened.reserve(2 * most * d);
    }
    for (int64_t item = begin; item < end; ++item) {
      const int64_t slot = item / items_per_token;
      const int t =
          static_cast<int>(slot % 2 == 0 ? slot / 2 : n_tokens - 1 - slot / 2);
      // Query heads [h0, h0 + per_item), all of KV head kvh.
      const int h0 = static_cast<int>(item % items_per_token) * per_item;
      const int kvh = h0 / group;
      const SequenceChunk& c = batch.chunks[tokens_[t].chunk];
      // llama.cpp sums f16 products with tinyBLAS for the prompt (a batch
      // of two or more tokens) and with ggml_vec_dot_f16 for a single
      // token; see CpuBackendOptions.
      const kernels::F16DotOrder order =
          llamacpp_prompt_numerics_ && c.prompt_length >= 2 &&
                  tokens_[t].pos < c.prompt_length
              ? kernels::F16DotOrder::kTinyBlas
              : kernels::F16DotOrder::kVecDot;
      const int32_t pos = tokens_[t].pos;
      // Causal, and within the layer's sliding window and the chunk's
      // attention sinks: keys [sink_begin, sink_end) and [recent_begin, pos].
      // A testing mask replaces those rules: every key [0, pos] is read.
      const bool testing_mask = testing_attention_mask_ != nullptr;
      const AttendedKeys attended =
          testing_mask ? AttendedKeys{}
                       : KeysAttended(pos, config_.LayerWindow(layer),
                                      c.attention_sinks, c.sink_window);
      const WidenedContext& wide = widened_chunks_[tokens_[t].chunk];
      // The widened path scores every position [0, pos] and masks the ones
      // not attended with -inf; the gathered path reads only those attended.
      const int32_t n_ctx = wide.offset >= 0 ? pos + 1 : attended.count(pos);
      // Scores of keys [0, n_ctx) at positions [0, pos] that are not
      // attended.
      const bool mask_scores = n_ctx != attended.count(pos) || testing_mask;
      // llama.cpp's KV window is padded (to 256 cells) and masked with
      // -inf; softmax works in chunks of 16, so padding to 16 is enough
      // for the same sums.
      const int32_t n_pad = (n_ctx + 15) / 16 * 16;
      scores.resize(int64_t{per_item} * n_pad);
      probs.resize(int64_t{per_item} * n_pad);
      float* heads_out = attn_.data() + (int64_t{t} * heads + h0) * d;
      const float* heads_q = q_.data() + (int64_t{t} * heads + h0) * d;
      // The item's query heads, rounded to fp16 as llama.cpp rounds them
      // for the f16 product.
      kernels::Fp32ToFp16Row(heads_q, int64_t{per_item} * d, q16.data());
      // Head g's scores (row g of n_pad) to its probabilities.
      auto softmax = [&](int g) {
        float* sc = scores.data() + int64_t{g} * n_pad;
        float* pr = probs.data() + int64_t{g} * n_pad;
        if (mask_scores) {
          for (int32_t j = 0; j < n_ctx; ++j) {
            if (testing_mask ? !testing_attention_mask_(layer, pos, j)
                             : !attended.Attends(j)) {
              sc[j] = -std::numeric_limits<float>::infinity();
            }
          }
        }
        const float max_score = kernels::MaxScore(n_ctx, sc);
        for (int32_t j = n_ctx; j < n_pad; ++j) {
          sc[j] = -std::numeric_limits<float>::infinity();
        }
        const double denom = kernels::SoftMaxGgml(n_pad, sc, max_score, pr);
        const float inv = static_cast<float>(1.0 / denom);
        // Rounded through fp16, as ggml rounds them for the f16 product.
        kernels::ScaleToF16Precision(n_ctx, inv, pr);
        return pr;
      };
      if (wide.offset >= 0) {
        // The prompt's context, widened once for the layer: all the item's
        // query heads in one pass over the keys and one over the values.
        const float* keys =
            widened_base_ + wide.offset + int64_t{2} * kvh * d * wide.stride;
        const float* values = keys + int64_t{d} * wide.stride;
        kernels::Fp16ToFp32Row(q16.data(), int64_t{per_item} * d, qf.data());
        kernels::DotF16ManyTransposed(order, d, keys, n_ctx, per_item,
                                      qf.data(), d, scale, scores.data(),
                                      n_pad);
        for (int g = 0; g < per_item; ++g) softmax(g);
        kernels::WeightedRowSumWidened(order, n_ctx, per_item, probs.data(),
                                       n_pad, values, wide.stride / 16, d,
                                       heads_out, d);
        continue;
      }
      // Otherwise (a decode step) the cache's rows, gathered by pointer.
      krows.resize(n_ctx);
      vrows.resize(n_ctx);
      if (fp8_kv_) widened.resize(int64_t{2} * n_ctx * d);
      const int32_t sinks = attended.sink_end - attended.sink_begin;
      for (int32_t j = 0; j < n_ctx; ++j) {
        // Row j of the gathered rows is key position kp.
        const int32_t kp = j < sinks ? attended.sink_begin + j
                                     : attended.recent_begin + (j - sinks);
        const BlockId block = c.block_table[kp / bs];
        const uint8_t* key = pool_->Slot(layer, block, KvHalf::kKey, kp % bs);
        const uint8_t* value =
            pool_->Slot(layer, block, KvHalf::kValue, kp % bs);
        if (fp8_kv_) {
          uint16_t* k16 = widened.data() + int64_t{2 * j} * d;
          uint16_t* v16 = k16 + d;
          kernels::Fp8E4M3ToFp16Row(key + int64_t{kvh} * d, d, k16);
          kernels::Fp8E4M3ToFp16Row(value + int64_t{kvh} * d, d, v16);
          krows[j] = k16;
          vrows[j] = v16;
        } else {
          krows[j] = reinterpret_cast<const uint16_t*>(key) + kvh * d;
          vrows[j] = reinterpret_cast<const uint16_t*>(value) + kvh * d;
          PrefetchRow(krows[j], 2 * d);
          PrefetchRow(vrows[j], 2 * d);
        }
      }
      // All the item's query heads in one pass over the keys and one over
      // the values.
      kernels::DotF16ManyHeads(order, d, krows.data(), n_ctx, per_item,
                               q16.data(), d, scale, scores.data(), n_pad);
      for (int g = 0; g < per_item; ++g) softmax(g);
      kernels::WeightedRowSumF16Heads(order, n_ctx, per_item, probs.data(),
                                      n_pad, vrows.data(), d, heads_out, d);
    }
  });
}

absl::Status CpuBackend::Forward(const ForwardBatch& batch,
                                 std::vector<float>* logits) {
  PD_RETURN_IF_ERROR(Validate(batch));
  const int E = config_.hidden_size;
  const int F = config_.ffn_size;
  const int Q = config_.q_size();
  const int KV = config_.kv_size();

  tokens_.clear();
  for (size_t ci = 0; ci < batch.chunks.size(); ++ci) {
    const SequenceChunk& c = batch.chunks[ci];
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      tokens_.push_back(
          {static_cast<int32_t>(ci), c.start_pos + static_cast<int32_t>(i)});
    }
  }
  const int T = static_cast<int>(tokens_.size());
  x_.resize(int64_t{T} * E);
  xn_.resize(int64_t{T} * E);
  q_.resize(int64_t{T} * Q);
  k_.resize(int64_t{T} * KV);
  v_.resize(int64_t{T} * KV);
  attn_.resize(int64_t{T} * Q);
  gate_.resize(int64_t{T} * F);
  up_.resize(int64_t{T} * F);
  proj_.resize(int64_t{T} * E);

  // Embeddings (exact: dequantizing one row per token).
  {
    const WeightMatrix& emb = weights_.token_embedding;
    int t = 0;
    for (const SequenceChunk& c : batch.chunks) {
      for (int32_t id : c.tokens) {
        PD_RETURN_IF_ERROR(kernels::DequantizeRow(emb.type, emb.row(id), E,
                                                  x_.data() + int64_t{t} * E));
        ++t;
      }
    }
  }
  ComputeRopeTables(T);

  ForTokens(T, [&](int64_t begin, int64_t end) {
    RmsNorm(x_.data(), weights_.layers[0].attn_norm, begin, end, xn_.data());
  });
  for (int l = 0; l < config_.num_layers; ++l) {
    const model::LayerWeights& L = weights_.layers[l];
    // Attention block (xn_ holds its normed input).
    qrows_a_.source = nullptr;
    MatMuls({{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}},
            xn_.data(), T, &qrows_a_);
    ForTokens(T, [&](int64_t begin, int64_t end) {
      if (config_.has_qkv_bias) {
        for (int64_t t = begin; t < end; ++t) {
          for (int i = 0; i < Q; ++i) q_[t * Q + i] += L.bq[i];
          for (int i = 0; i < KV; ++i) {
            k_[t * KV + i] += L.bk[i];
            v_[t * KV + i] += L.bv[i];
          }
        }
      }
      ApplyRope(q_.data(), begin, end, config_.num_heads);
      ApplyRope(k_.data(), begin, end, config_.num_kv_heads);
      StoreKv(batch, l, begin, end);
    });
    Attention(batch, l, T);
    qrows_b_.source = nullptr;
    MatMul(L.wo, attn_.data(), T, proj_.data(), &qrows_b_);
    AddResidualAndNorm(&L.ffn_norm, T);

    // Feed-forward block: down(silu(gate(xn)) * up(xn)).
    qrows_a_.source = nullptr;
    MatMuls({{&L.ffn_gate, gate_.data()}, {&L.ffn_up, up_.data()}}, xn_.data(),
            T, &qrows_a_);
    threads_.ParallelFor(T, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        kernels::SwiGluGgml(F, gate_.data() + t * F, up_.data() + t * F,
                            gate_.data() + t * F);
      }
    });
    qrows_b_.source = nullptr;
    MatMul(L.ffn_down, gate_.data(), T, proj_.data(), &qrows_b_);
    // The next layer's attention norm comes with the residual; the last
    // layer's output norm runs below on the rows that want logits.
    const bool last = l + 1 == config_.num_layers;
    AddResidualAndNorm(last ? nullptr : &weights_.layers[l + 1].attn_norm, T);

    if (batch.on_layer_done) batch.on_layer_done(l);
  }

  // Final norm and output projection, only for the rows that want logits.
  const int64_t rows = CountLogitsRows(batch);
  logits->resize(rows * config_.vocab_size);
  if (rows == 0) return absl::OkStatus();
  std::vector<float>& selected = proj_;  // free now; T >= rows
  {
    int t = 0;
    int64_t r = 0;
    for (const SequenceChunk& c : batch.chunks) {
      const int n = static_cast<int>(c.tokens.size());
      if (c.logits == LogitsMode::kAll) {
        std::memcpy(selected.data() + r * E, x_.data() + int64_t{t} * E,
                    sizeof(float) * E * n);
        r += n;
      } else if (c.logits == LogitsMode::kLast) {
        std::memcpy(selected.data() + r * E, x_.data() + int64_t{t + n - 1} * E,
                    sizeof(float) * E);
        r += 1;
      }
      t += n;
    }
  }
  RmsNorm(selected.data(), weights_.output_norm, 0, rows, xn_.data());
  qrows_a_.source = nullptr;
  MatMul(weights_.output, xn_.data(), static_cast<int>(rows), logits->data(),
         &qrows_a_);
  return absl::OkStatus();
}

}  // namespace pdserve::engine
