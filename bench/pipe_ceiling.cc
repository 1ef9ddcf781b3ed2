#include "bench/pipe_ceiling.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

namespace pdserve::bench {
namespace {

using kernels::GgmlType;
using kernels::PackedArithmetic;

constexpr int kBlockSumsTokens = 8;  // PackedGroupBlockSums' pass
constexpr int kGgmlTokens = 2;       // PackedGroupTokens' pass

// A zero register as its own zeroing idiom (as the kernels' FreshZero).
__attribute__((target("avx512f"))) inline __m512i FreshZero() {
  __m512i z;
  asm volatile("vpxord %0, %0, %0" : "=v"(z));
  return z;
}

// int32 to float; maskz: the plain form trips GCC 12's -Wuninitialized.
__attribute__((target("avx512f"))) inline __m512 ToFloat(__m512i v) {
  return _mm512_maskz_cvtepi32_ps(0xFFFF, v);
}

// Block sums: eight tokens' chains of eight vpdpbusd, then per token
// kFloatOps float operations: none (the sums carried on), the scale
// multiply, conversion and multiply-add (3), and the mins' multiply-add (4).
template <int kFloatOps>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void BlockSumsShape(
    int64_t blocks, const float* scales, float* out) {
  constexpr int T = kBlockSumsTokens;
  __m512i w = _mm512_set1_epi8(3);
  __m512i y = _mm512_set1_epi32(0x01020304);
  __m512 dw = _mm512_set1_ps(0.5f), mw = _mm512_set1_ps(0.25f);
  __m512 acc[T], mins[T];
  __m512i carried[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = mins[t] = _mm512_setzero_ps();
    carried[t] = FreshZero();  // eight chains the compiler cannot merge
  }
  for (int64_t b = 0; b < blocks; ++b) {
    // A new block's operands and headers: nothing below can be hoisted out
    // of the loop (the kernels load each block's headers, and multiply
    // them by the tokens' scales, in every block).
    asm volatile("" : "+v"(w), "+v"(y), "+v"(dw), "+v"(mw));
    __m512i sums[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      sums[t] = kFloatOps == 0 ? carried[t] : FreshZero();
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) sums[t] = _mm512_dpbusd_epi32(sums[t], w, y);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      if constexpr (kFloatOps == 0) carried[t] = sums[t];
      if constexpr (kFloatOps >= 3) {
        const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(scales[t]));
        acc[t] = _mm512_fmadd_ps(d, ToFloat(sums[t]), acc[t]);
      }
      if constexpr (kFloatOps >= 4) {
        mins[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(scales[T + t]), mins[t]);
      }
    }
  }
  __m512 total = _mm512_setzero_ps();
  for (int t = 0; t < T; ++t) {
    total = _mm512_add_ps(total, _mm512_add_ps(acc[t], mins[t]));
    total = _mm512_add_ps(total, ToFloat(carried[t]));
  }
  _mm512_storeu_ps(out, total);
}

// ggml's order: two tokens, per ggml lane i and token one vpdpbusd, one
// conversion and one multiply-add into the lane's accumulator; per block
// and token the scale multiply and (kMins) the mins' multiply and add. Each
// lane's weights are a 64-byte load and each token's activation word a
// broadcast load, as in the kernel, both from L1 here: every lane and
// token differs, so that no product can be shared. (The kernel's Q8_0 and
// Q4_0 lanes also start from a broadcast load instead of zero: a load, not
// multiply-pipe work.)
template <bool kMins>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void GgmlLanesShape(
    int64_t blocks, const float* scales, float* out) {
  constexpr int T = kGgmlTokens;
  alignas(64) uint8_t weights[8][64];
  alignas(64) int32_t words[8][T];
  for (int i = 0; i < 8; ++i) {
    for (int k = 0; k < 64; ++k) weights[i][k] = static_cast<uint8_t>(i + k);
    for (int t = 0; t < T; ++t) words[i][t] = 0x01020304 + i * T + t;
  }
  __m512 dw = _mm512_set1_ps(0.5f), mw = _mm512_set1_ps(0.25f);
  __m512 acc[T][8], summs[T];
  for (int t = 0; t < T; ++t) {
    summs[t] = _mm512_setzero_ps();
    for (int i = 0; i < 8; ++i) acc[t][i] = _mm512_setzero_ps();
  }
  const uint8_t* lane_weights = &weights[0][0];
  const int32_t* lane_words = &words[0][0];
  for (int64_t b = 0; b < blocks; ++b) {
    // A new block's operands and headers: as in BlockSumsShape, nothing
    // below can be hoisted out of the loop.
    asm volatile("" : "+r"(lane_weights), "+r"(lane_words), "+v"(dw), "+v"(mw));
    __m512 d[T];
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
      d[t] = _mm512_mul_ps(dw, _mm512_set1_ps(scales[t]));
      if constexpr (kMins) {
        summs[t] = _mm512_add_ps(
            summs[t], _mm512_mul_ps(mw, _mm512_set1_ps(scales[T + t])));
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i w = _mm512_load_si512(lane_weights + 64 * i);
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t) {
        const __m512i y = _mm512_set1_epi32(lane_words[i * T + t]);
        acc[t][i] = _mm512_fmadd_ps(
            d[t], ToFloat(_mm512_dpbusd_epi32(FreshZero(), w, y)), acc[t][i]);
      }
    }
  }
  __m512 total = _mm512_setzero_ps();
  for (int t = 0; t < T; ++t) {
    total = _mm512_add_ps(total, summs[t]);
    for (int i = 0; i < 8; ++i) total = _mm512_add_ps(total, acc[t][i]);
  }
  _mm512_storeu_ps(out, total);
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

int64_t RunPipeMix(PipeMix mix, int64_t blocks, float* sink) {
  const float scales[2 * kBlockSumsTokens] = {
      0.75f, 0.5f,  0.25f, 0.125f, 0.75f, 0.5f,  0.25f, 0.125f,
      0.5f,  0.25f, 0.5f,  0.25f,  0.5f,  0.25f, 0.5f,  0.25f};
  const int64_t block_sums_macs = blocks * kBlockSumsTokens * 16 * 32;
  const int64_t ggml_macs = blocks * kGgmlTokens * 16 * 32;
  switch (mix) {
    case PipeMix::kVnniOnly:
      BlockSumsShape<0>(blocks, scales, sink);
      return block_sums_macs;
    case PipeMix::kBlockSums:
      BlockSumsShape<3>(blocks, scales, sink);
      return block_sums_macs;
    case PipeMix::kBlockSumsWithMins:
      BlockSumsShape<4>(blocks, scales, sink);
      return block_sums_macs;
    case PipeMix::kGgmlLanes:
      GgmlLanesShape<false>(blocks, scales, sink);
      return ggml_macs;
    case PipeMix::kGgmlLanesWithMins:
      GgmlLanesShape<true>(blocks, scales, sink);
      return ggml_macs;
  }
  return 0;
}

bool PipeCeilingSupported() {
  return __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("avx512bw");
}

double PipeMixGmacs(PipeMix mix) {
  if (!PipeCeilingSupported()) return 0;
  float sink[16];
  using Clock = std::chrono::steady_clock;
  // Blocks for about 20 ms, from a short run.
  constexpr int64_t kProbeBlocks = 4096;
  Clock::time_point start = Clock::now();
  RunPipeMix(mix, kProbeBlocks, sink);
  const double probe_s = std::max(Seconds(Clock::now() - start), 1e-6);
  const int64_t blocks =
      std::max<int64_t>(kProbeBlocks, kProbeBlocks * (0.02 / probe_s));
  double best = 0;
  for (int run = 0; run < 9; ++run) {
    start = Clock::now();
    const int64_t macs = RunPipeMix(mix, blocks, sink);
    best = std::max(best, macs / Seconds(Clock::now() - start) / 1e9);
  }
  return best;
}

bool PackedKernelMix(GgmlType type, PackedArithmetic arithmetic, PipeMix* mix) {
  const bool block_sums = arithmetic == PackedArithmetic::kBlockSums;
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ8_0:
      *mix = block_sums ? PipeMix::kBlockSums : PipeMix::kGgmlLanes;
      return true;
    case GgmlType::kQ4_1:
      *mix = block_sums ? PipeMix::kBlockSumsWithMins
                        : PipeMix::kGgmlLanesWithMins;
      return true;
    default:
      return false;
  }
}

ProductsCeiling MeasureProductsCeiling(const model::ModelWeights& weights,
                                       PackedArithmetic arithmetic,
                                       common::ThreadPool& pool) {
  std::vector<const model::WeightMatrix*> matrices;
  for (const model::LayerWeights& layer : weights.layers) {
    for (const model::WeightMatrix* m :
         {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.ffn_gate,
          &layer.ffn_up, &layer.ffn_down}) {
      matrices.push_back(m);
    }
  }
  matrices.push_back(&weights.output);
  ProductsCeiling c;
  bool every_matrix_has_a_mix = true;
  for (const model::WeightMatrix* m : matrices) {
    const double macs = static_cast<double>(m->rows) * m->cols;
    c.macs_per_token += macs;
    // Matrices without a packed form (rows over 16384 elements) keep
    // ggml's order, unpacked, with the same mix per (row, token).
    const PackedArithmetic effective =
        kernels::PackedMatrix::StorageBytes(m->type, m->rows, m->cols) > 0
            ? arithmetic
            : PackedArithmetic::kGgml;
    PipeMix mix;
    if (PackedKernelMix(m->type, effective, &mix)) {
      c.macs_by_mix[mix] += macs;
    } else {
      every_matrix_has_a_mix = false;
    }
  }
  if (!every_matrix_has_a_mix || !PipeCeilingSupported()) return c;
  // Seconds per token at the ceiling: each mix measured on every thread at
  // once (one item per thread), as the engine runs them, their GMAC/s
  // added up.
  double seconds = 0;
  for (const auto& [mix, macs] : c.macs_by_mix) {
    std::vector<double> per_thread(pool.num_threads(), 0.0);
    const PipeMix measured = mix;
    pool.ParallelFor(pool.num_threads(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        per_thread[i] = PipeMixGmacs(measured);
      }
    });
    double gmacs = 0;
    for (double g : per_thread) gmacs += g;
    seconds += macs / (gmacs * 1e9);
  }
  c.gmacs = c.macs_per_token / seconds / 1e9;
  c.tokens_per_s = 1 / seconds;
  return c;
}

}  // namespace pdserve::bench
