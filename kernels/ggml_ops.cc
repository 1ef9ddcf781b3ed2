#include "kernels/ggml_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/quant.h"

namespace pdserve::kernels {
namespace {

constexpr int kLanes = 16;  // floats in an AVX-512 register

// fp16 -> fp32 by table: exact, and much faster than the bit manipulation.
const float* HalfTable() {
  static const std::array<float, 65536>* table = [] {
    auto* t = new std::array<float, 65536>;
    for (uint32_t i = 0; i < 65536; ++i) {
      (*t)[i] = Fp16ToFp32(static_cast<uint16_t>(i));
    }
    return t;
  }();
  return table->data();
}

// GCC's _mm512_reduce_add_ps: upper 256 bits plus lower, upper 128 plus
// lower, then lanes {2,3} onto {0,1}, then lane 1 onto lane 0.
inline float ReduceAdd16(const float* v) {
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = v[i + 8] + v[i];
  float b[4];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  const float c0 = b[0] + b[2];
  const float c1 = b[1] + b[3];
  return c0 + c1;
}

bool HaveAvx512() {
  static const bool have =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("fma");
  return have;
}

// AVX2 with FMA and F16C: the CPUs without AVX-512 (AMD before Zen 4, older
// Intel). Attention's kernels have 8-lane forms for them (below): without,
// a fastbuild's portable loops call libm's fma per element and a 500-token
// prompt spent 80 % of its 30 s prefill in attention.
bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2") &&
                           __builtin_cpu_supports("f16c") &&
                           __builtin_cpu_supports("fma");
  return have;
}

// ---------------------------------------------------------------------------
// AVX-512 forms of the functions below: ggml's own vector code, which the
// scalar functions emulate lane by lane, so both give the same bits
// (ggml_ops_test compares them on every input it has).
#define PD_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c,fma")))

// The first min(n, 16) lanes.
inline __mmask16 FirstLanes(int64_t n) {
  return n >= kLanes ? static_cast<__mmask16>(0xFFFF)
                     : static_cast<__mmask16>((1u << n) - 1);
}

PD_AVX512 inline __m512 LoadHalves16(const uint16_t* p) {
  // maskz: the plain form trips GCC 12's -Wmaybe-uninitialized.
  return _mm512_maskz_cvtph_ps(
      0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// ReduceAdd16, in registers.
PD_AVX512 inline float ReduceAdd16Avx512(__m512 v) {
  const __m256 a =
      _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  const __m128 b =
      _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

PD_AVX512 float DotF16GgmlAvx512(int64_t n, const uint16_t* x,
                                 const uint16_t* y, const float* half) {
  const int64_t np = n & ~int64_t{63};
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < np; i += 64) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm512_fmadd_ps(LoadHalves16(x + i + k * kLanes),
                               LoadHalves16(y + i + k * kLanes), acc[k]);
    }
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]),
                                 _mm512_add_ps(acc[1], acc[3]));
  double sum = ReduceAdd16Avx512(s);
  for (int64_t e = np; e < n; ++e) {
    sum += static_cast<double>(half[x[e]] * half[y[e]]);
  }
  return static_cast<float>(sum);
}

PD_AVX512 float DotF16TinyBlasAvx512(int64_t n, const uint16_t* x,
                                     const uint16_t* y) {
  __m512 acc = _mm512_setzero_ps();
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) {
    acc = _mm512_fmadd_ps(LoadHalves16(x + e), LoadHalves16(y + e), acc);
  }
  if (e < n) {  // lanes past n keep their sums (mask3: acc where unset)
    const __mmask16 m = FirstLanes(n - e);
    const __m512 xv =
        _mm512_maskz_cvtph_ps(m, _mm256_maskz_loadu_epi16(m, x + e));
    const __m512 yv =
        _mm512_maskz_cvtph_ps(m, _mm256_maskz_loadu_epi16(m, y + e));
    acc = _mm512_mask3_fmadd_ps(xv, yv, acc, m);
  }
  return ReduceAdd16Avx512(acc);
}

// ---------------------------------------------------------------------------
// Decode attention against the cache's fp16 rows, gathered by pointer: the
// NQ query heads of one KV head at once, so that each key and value row is
// read and widened once for all of them, and with the fixed costs per
// (token, head) -- one horizontal sum per key, 64 slot sums per value
// element -- cut down, since at decode's short contexts they were most of
// the time. Same operations on the same floats as DotF16Ggml /
// DotF16TinyBlas and WeightedRowSumF16Portable, so the same bits.

// ReduceAdd16's tree for many keys at once, each key's 16 lanes in one
// register: the lanes a level adds are shuffled into matching positions of
// two registers, so one addition does that level for several keys. Float
// addition commutes, so every key's sum is made of the same additions of
// the same floats as ReduceAdd16's.
//  - ReduceStep1(x, y): lanes 0-7 hold x's first level (x[i] + x[i + 8]),
//    lanes 8-15 y's;
//  - ReduceStep2 of two such: each 128-bit quarter holds one key's second
//    level (four sums), keys in the order x's two, then y's two;
//  - ReduceStep3 of two such: quarter q holds the third level (two sums)
//    of x's key q, then of y's key q;
//  - ReduceStep4 of two such: quarter q holds the final sums of x's two
//    keys in quarter q, then y's two.
// Sixteen keys 0-15 reduced as a balanced tree of these (ReducedKeys) end
// with key 4r + q's sum in lane 4q + r: GatheredScores' key_order puts them
// back in order.
PD_AVX512 inline __m512 ReduceStep1(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44),   // x.lo, y.lo
                       _mm512_shuffle_f32x4(x, y, 0xEE));  // x.hi, y.hi
}
PD_AVX512 inline __m512 ReduceStep2(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88),   // quarters 0, 2
                       _mm512_shuffle_f32x4(x, y, 0xDD));  // quarters 1, 3
}
PD_AVX512 inline __m512 ReduceStep3(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44),   // x0 x1 y0 y1
                       _mm512_shuffle_ps(x, y, 0xEE));  // x2 x3 y2 y3
}
PD_AVX512 inline __m512 ReduceStep4(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88),   // x0 x2 y0 y2
                       _mm512_shuffle_ps(x, y, 0xDD));  // x1 x3 y1 y3
}

// The rows read past the last key of a block of 16 (their scores dropped).
alignas(64) constexpr uint16_t kZeroHalves[16 * kLanes] = {};

// ggml's 16 lanes of key k's dot product with each of NQ queries (widened,
// q + h * d), before the horizontal sum: vec_dot's four accumulators over
// chunks of 64 (d a multiple of 64) added (0 + 2) + (1 + 3), or tinyBLAS's
// one.
template <int NQ, bool kVecDot>
[[gnu::always_inline]] PD_AVX512 inline void KeyLanes(const uint16_t* k, int d,
                                                      const float* q,
                                                      __m512 (&s)[NQ]) {
  constexpr int kAcc = kVecDot ? 4 : 1;
  __m512 acc[NQ][kAcc];
#pragma GCC unroll 4
  for (int h = 0; h < NQ; ++h) {
#pragma GCC unroll 4
    for (int a = 0; a < kAcc; ++a) acc[h][a] = _mm512_setzero_ps();
  }
  for (int e0 = 0; e0 < d; e0 += kAcc * kLanes) {
#pragma GCC unroll 4
    for (int a = 0; a < kAcc; ++a) {
      const int e = e0 + a * kLanes;
      const __m512 kv = LoadHalves16(k + e);
#pragma GCC unroll 4
      for (int h = 0; h < NQ; ++h) {
        acc[h][a] =
            _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + h * d + e), acc[h][a]);
      }
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < NQ; ++h) {
    s[h] = kVecDot ? _mm512_add_ps(
                         _mm512_add_ps(acc[h][0], acc[h][2 % kAcc]),
                         _mm512_add_ps(acc[h][1 % kAcc], acc[h][3 % kAcc]))
                   : acc[h][0];
  }
}

// Keys [j, j + kKeys) of a block of 16 (kKeys a power of two), reduced as
// far as ReduceStep<log2 kKeys> for each query.
template <int kKeys, int NQ, bool kVecDot>
[[gnu::always_inline]] PD_AVX512 inline void ReducedKeys(
    const uint16_t* const* rows, int64_t count, int64_t j, int d,
    const float* q, __m512 (&out)[NQ]) {
  if constexpr (kKeys == 1) {
    KeyLanes<NQ, kVecDot>(j < count ? rows[j] : kZeroHalves, d, q, out);
  } else {
    constexpr int kHalf = kKeys / 2;
    __m512 a[NQ], b[NQ];
    ReducedKeys<kHalf, NQ, kVecDot>(rows, count, j, d, q, a);
    ReducedKeys<kHalf, NQ, kVecDot>(rows, count, j + kHalf, d, q, b);
#pragma GCC unroll 4
    for (int h = 0; h < NQ; ++h) {
      if constexpr (kKeys == 2) out[h] = ReduceStep1(a[h], b[h]);
      if constexpr (kKeys == 4) out[h] = ReduceStep2(a[h], b[h]);
      if constexpr (kKeys == 8) out[h] = ReduceStep3(a[h], b[h]);
      if constexpr (kKeys == 16) out[h] = ReduceStep4(a[h], b[h]);
    }
  }
}

// DotF16ManyHeads for NQ queries (fp16, q + h * q_stride), d a multiple of
// 16 (vec_dot: of 64, so that no element takes the double leftover path)
// and at most 256.
template <int NQ, bool kVecDot>
PD_AVX512 void GatheredScores(int d, const uint16_t* const* rows, int64_t count,
                              const uint16_t* q, int64_t q_stride, float scale,
                              float* out, int64_t out_stride) {
  alignas(64) float qf[NQ * 16 * kLanes];
#pragma GCC unroll 4
  for (int h = 0; h < NQ; ++h) {
    for (int e = 0; e < d; e += kLanes) {
      _mm512_storeu_ps(qf + h * d + e, LoadHalves16(q + h * q_stride + e));
    }
  }
  const __m512 scale16 = _mm512_set1_ps(scale);
  const __m512i key_order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (int64_t j0 = 0; j0 < count; j0 += kLanes) {
    __m512 sums[NQ];
    ReducedKeys<kLanes, NQ, kVecDot>(rows, count, j0, d, qf, sums);
    const __mmask16 mask = FirstLanes(count - j0);
#pragma GCC unroll 4
    for (int h = 0; h < NQ; ++h) {
      _mm512_mask_storeu_ps(
          out + h * out_stride + j0, mask,
          _mm512_mul_ps(_mm512_permutexvar_ps(key_order, sums[h]), scale16));
    }
  }
}

// The probability-weighted sum of value rows (WeightedRowSumF16) for NQ
// probability rows, 16 output elements (chunk c) at a time, as a tree over
// the lane slots instead of a table of them. Slot s (of 64 for vec_dot,
// 16 for tinyBLAS) sums positions s, s + 64 (or 16), ... in order; vec_dot
// then adds, for each lane l < 16, (slot l + slot l + 32) + (slot l + 16 +
// slot l + 48); and the 16 lanes' sums are added by ReduceAdd16's tree.
// The leaves below are visited in the order that makes that whole tree a
// balanced binary one (the first level pairs leaves 2i and 2i + 1, the
// next pairs of those, ...). A slot without positions
// (s >= n) adds nothing: it would add a zero, and no sum here is -0 (each
// starts from +0, and fp16 products are zero or far from underflow), so
// skipping it gives the same bits and saves most additions at short
// contexts. Emptiness only grows with a leaf's number, so a subtree whose
// first half is empty is empty.
template <bool kVecDot, int kLeaf>
constexpr int SlotOfLeaf() {
  // Leaf bits, lowest first: vec_dot's slot group (2 then 1: groups 0, 2,
  // 1, 3), then the lane's bits 8, 4, 2, 1 (lanes 0, 8, 4, 12, 2, ...).
  constexpr int kGroupBits = kVecDot ? 2 : 0;
  constexpr int group = kVecDot ? (kLeaf & 1) * 2 + ((kLeaf >> 1) & 1) : 0;
  constexpr int lane_bits = kLeaf >> kGroupBits;
  constexpr int lane = ((lane_bits & 1) << 3) | ((lane_bits & 2) << 1) |
                       ((lane_bits & 4) >> 1) | ((lane_bits & 8) >> 3);
  return group * kLanes + lane;
}

// One lane slot's sums for NQ probability rows (p + h * p_stride) and
// output chunks [c0, c0 + CN): positions first, first + stride, ... below n,
// each a multiply-add in position order from +0 (the order of
// AccumulateScalar's sums), into sums[h][c].
template <int NQ, int CN, class Rows>
[[gnu::always_inline]] PD_AVX512 inline void SlotSums(
    int64_t first, int64_t stride, int64_t n, const float* p, int64_t p_stride,
    const Rows& rows, int c0, __m512 (&sums)[NQ][CN]) {
#pragma GCC unroll 4
  for (int h = 0; h < NQ; ++h) {
#pragma GCC unroll 16
    for (int c = 0; c < CN; ++c) sums[h][c] = _mm512_setzero_ps();
  }
  for (int64_t j = first; j < n; j += stride) {
#pragma GCC unroll 16
    for (int c = 0; c < CN; ++c) {
      const __m512 v = rows.Load16(j, c0 + c);
#pragma GCC unroll 4
      for (int h = 0; h < NQ; ++h) {
        sums[h][c] =
            _mm512_fmadd_ps(_mm512_set1_ps(p[h * p_stride + j]), v, sums[h][c]);
      }
    }
  }
}

// Output chunks [c0, c0 + CN) of each of NQ rows, sums[h][c].
template <int kLeaves, int kLeaf0, int NQ, int CN, bool kVecDot, class Rows>
[[gnu::always_inline]] PD_AVX512 inline bool SlotTree(int64_t n, const float* p,
                                                      int64_t p_stride,
                                                      const Rows& rows, int c0,
                                                      __m512 (&out)[NQ][CN]) {
  if constexpr (kLeaves == 1) {
    constexpr int kSlots = kVecDot ? 4 * kLanes : kLanes;
    constexpr int slot = SlotOfLeaf<kVecDot, kLeaf0>();
    if (slot >= n) return false;
    SlotSums<NQ, CN>(slot, kSlots, n, p, p_stride, rows, c0, out);
    return true;
  } else {
    constexpr int kHalf = kLeaves / 2;
    if (!SlotTree<kHalf, kLeaf0, NQ, CN, kVecDot>(n, p, p_stride, rows, c0,
                                                  out)) {
      return false;
    }
    __m512 b[NQ][CN];
    if (SlotTree<kHalf, kLeaf0 + kHalf, NQ, CN, kVecDot>(n, p, p_stride, rows,
                                                         c0, b)) {
#pragma GCC unroll 4
      for (int h = 0; h < NQ; ++h) {
#pragma GCC unroll 4
        for (int c = 0; c < CN; ++c) {
          out[h][c] = _mm512_add_ps(out[h][c], b[h][c]);
        }
      }
    }
    return true;
  }
}

// Chunks [c0, c0 + CN) of the output, stored.
template <int NQ, int CN, bool kVecDot, class Rows>
[[gnu::always_inline]] PD_AVX512 inline void WeightedSumChunks(
    int64_t n, const float* p, int64_t p_stride, const Rows& rows, int c0,
    float* out, int64_t out_stride) {
  constexpr int kLeaves = kVecDot ? 4 * kLanes : kLanes;
  __m512 sums[NQ][CN];
  if (!SlotTree<kLeaves, 0, NQ, CN, kVecDot>(n, p, p_stride, rows, c0, sums)) {
#pragma GCC unroll 4
    for (auto& row : sums) {
#pragma GCC unroll 4
      for (__m512& v : row) v = _mm512_setzero_ps();
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < NQ; ++h) {
#pragma GCC unroll 4
    for (int c = 0; c < CN; ++c) {
      _mm512_storeu_ps(out + h * out_stride + (c0 + c) * kLanes, sums[h][c]);
    }
  }
}

// One chunk at a time keeps the tree's pending sums in registers, and at
// short contexts (a position or a few per slot) the additions of the slot
// sums are most of the work. Long contexts go two or four chunks at a
// time instead: a value row's cache lines are then read together rather
// than once per chunk. Where that starts to pay, measured
// (attention_kernel_bench, three heads, d = 64, one chunk vs several):
// vec_dot 128 positions 0.54 vs 0.54 us, 512 3.4 vs 2.6, 2048 36 vs 16;
// tinyBLAS 128 0.47 vs 0.63, 512 2.3 vs 2.4, 2048 20 vs 10. One head alone
// has a single chain of multiply-adds per chunk and needs the width sooner:
// tinyBLAS, 512 positions, 2.4 us per head one chunk at a time, 1.2 four.
template <int NQ, bool kVecDot, class Rows>
PD_AVX512 void WeightedSumTree(int64_t n, const float* p, int64_t p_stride,
                               const Rows& rows, int d, float* out,
                               int64_t out_stride) {
  constexpr int64_t kWideFrom = kVecDot || NQ == 1 ? 256 : 1024;
  constexpr int kWide = NQ <= 2 ? 4 : 2;
  const int chunks = d / kLanes;
  int c0 = 0;
  if (n >= kWideFrom) {
    for (; c0 + kWide <= chunks; c0 += kWide) {
      WeightedSumChunks<NQ, kWide, kVecDot>(n, p, p_stride, rows, c0, out,
                                            out_stride);
    }
  }
  for (; c0 < chunks; ++c0) {
    WeightedSumChunks<NQ, 1, kVecDot>(n, p, p_stride, rows, c0, out,
                                      out_stride);
  }
}

// DotF16ManyTransposed, 16 keys at a time, for head sizes of C * 16 (C a
// compile-time constant, so that every loop below unrolls and the partial
// sums live in registers): ggml's lane l of the 16 keys' sums fills one
// register, built by the same fused multiply-adds in the same order as one
// key's lane l; the reduction over lanes is then the same tree of additions,
// done for 16 keys at once, with no shuffles.
//
// tinyBLAS: NQ queries at once, each key vector loaded once for NQ
// multiply-adds; lanes l and l + 8 are added as soon as both are done (the
// tree's first level), so 8 * NQ registers hold a block's partial sums.
template <int NQ, int C>
PD_AVX512 void TransposedScoresTinyBlas(const float* key_blocks, int64_t count,
                                        const float* q, int64_t q_stride,
                                        float scale, float* out,
                                        int64_t out_stride) {
  const __m512 scale16 = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < count; j0 += kLanes) {
    const float* k = key_blocks + j0 * C * kLanes;  // block j0 / 16
    __m512 level1[NQ][8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      __m512 low[NQ];
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const int l = i + 8 * half;
        __m512 acc[NQ];
#pragma GCC unroll 3
        for (int h = 0; h < NQ; ++h) acc[h] = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
          const int e = c * kLanes + l;
          const __m512 kv = _mm512_loadu_ps(k + e * kLanes);
#pragma GCC unroll 3
          for (int h = 0; h < NQ; ++h) {
            acc[h] = _mm512_fmadd_ps(kv, _mm512_set1_ps(q[h * q_stride + e]),
                                     acc[h]);
          }
        }
#pragma GCC unroll 3
        for (int h = 0; h < NQ; ++h) {
          if (half == 0) {
            low[h] = acc[h];
          } else {
            level1[h][i] = _mm512_add_ps(acc[h], low[h]);
          }
        }
      }
    }
    const __mmask16 mask = FirstLanes(count - j0);
#pragma GCC unroll 3
    for (int h = 0; h < NQ; ++h) {
      __m512* v = level1[h];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) v[i] = _mm512_add_ps(v[i + 4], v[i]);
      const __m512 sums =
          _mm512_add_ps(_mm512_add_ps(v[0], v[2]), _mm512_add_ps(v[1], v[3]));
      _mm512_mask_storeu_ps(out + h * out_stride + j0, mask,
                            _mm512_mul_ps(sums, scale16));
    }
  }
}

// vec_dot (C a multiple of 4): one query at a time; accumulator (e / 16) % 4
// over chunks of 64, then (0 + 2) + (1 + 3), per lane.
template <int C>
PD_AVX512 void TransposedScoresVecDot(const float* key_blocks, int64_t count,
                                      const float* q, float scale, float* out) {
  const __m512 scale16 = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < count; j0 += kLanes) {
    const float* k = key_blocks + j0 * C * kLanes;  // block j0 / 16
    __m512 lane[kLanes];
#pragma GCC unroll 16
    for (int l = 0; l < kLanes; ++l) {
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        const int e = c * kLanes + l;
        acc[c % 4] = _mm512_fmadd_ps(_mm512_loadu_ps(k + e * kLanes),
                                     _mm512_set1_ps(q[e]), acc[c % 4]);
      }
      lane[l] = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]),
                              _mm512_add_ps(acc[1], acc[3]));
    }
    // ReduceAdd16's tree, lane by lane.
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) lane[i] = _mm512_add_ps(lane[i + 8], lane[i]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) lane[i] = _mm512_add_ps(lane[i + 4], lane[i]);
    const __m512 sums = _mm512_add_ps(_mm512_add_ps(lane[0], lane[2]),
                                      _mm512_add_ps(lane[1], lane[3]));
    const __mmask16 mask = FirstLanes(count - j0);
    _mm512_mask_storeu_ps(out + j0, mask, _mm512_mul_ps(sums, scale16));
  }
}

// The kernels above for one head size and any number of queries: three at
// a time for tinyBLAS, one at a time for vec_dot (C a multiple of 4).
template <int C>
PD_AVX512 void TransposedScoresTinyBlasAll(const float* key_blocks,
                                           int64_t count, int nq,
                                           const float* q, int64_t q_stride,
                                           float scale, float* out,
                                           int64_t out_stride) {
  int h = 0;
  for (; h + 3 <= nq; h += 3) {
    TransposedScoresTinyBlas<3, C>(key_blocks, count, q + h * q_stride,
                                   q_stride, scale, out + h * out_stride,
                                   out_stride);
  }
  if (nq - h == 2) {
    TransposedScoresTinyBlas<2, C>(key_blocks, count, q + h * q_stride,
                                   q_stride, scale, out + h * out_stride,
                                   out_stride);
  } else if (nq - h == 1) {
    TransposedScoresTinyBlas<1, C>(key_blocks, count, q + h * q_stride,
                                   q_stride, scale, out + h * out_stride,
                                   out_stride);
  }
}

template <int C>
PD_AVX512 void TransposedScoresVecDotAll(const float* key_blocks, int64_t count,
                                         int nq, const float* q,
                                         int64_t q_stride, float scale,
                                         float* out, int64_t out_stride) {
  for (int h = 0; h < nq; ++h) {
    TransposedScoresVecDot<C>(key_blocks, count, q + h * q_stride, scale,
                              out + h * out_stride);
  }
}

PD_AVX512 float MaxScoreAvx512(int64_t n, const float* x) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  }
  if (i < n) {
    const __mmask16 rest = FirstLanes(n - i);
    m = _mm512_mask_max_ps(m, rest, m, _mm512_maskz_loadu_ps(rest, x + i));
  }
  return _mm512_reduce_max_ps(m);
}

PD_AVX512 void ScaleToF16PrecisionAvx512(int64_t n, float scale, float* x) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = FirstLanes(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm512_mask_storeu_ps(x + i, m, _mm512_maskz_cvtph_ps(m, h));
  }
}

// ExpGgml on sixteen lanes.
PD_AVX512 inline __m512 ExpGgml16(__m512 x) {
  const __m512 r = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
  const __m512 n = _mm512_sub_ps(z, r);
  __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x);
  b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), b);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 p1 =
      _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f));
  const __m512 p2 = _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b,
                                    _mm512_set1_ps(0x1.fffdb6p-2f));
  const __m512 p3 = _mm512_fmadd_ps(b, _mm512_set1_ps(0x1.0e402p-7f),
                                    _mm512_set1_ps(0x1.573e2ep-5f));
  __m512 j = _mm512_fmadd_ps(p3, u, p2);
  j = _mm512_fmadd_ps(j, u, p1);
  const __m512 scaled = _mm512_scalef_ps(j, n);
  // |n| > 192: 0 or +inf by the sign of n (a NaN n compares false and stays
  // NaN through scalef).
  const __mmask16 big =
      _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  const __mmask16 positive =
      _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 limit = _mm512_maskz_mov_ps(
      positive, _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_blend_ps(big, scaled, limit);
}

PD_AVX512 double SoftMaxChunksAvx512(int64_t chunks, const float* x, float max,
                                     float* y) {
  double sum = 0;
  const __m512 m = _mm512_set1_ps(max);
  for (int64_t c = 0; c < chunks; ++c) {
    const __m512 v =
        ExpGgml16(_mm512_sub_ps(_mm512_loadu_ps(x + c * kLanes), m));
    _mm512_storeu_ps(y + c * kLanes, v);
    sum += static_cast<double>(ReduceAdd16Avx512(v));
  }
  return sum;
}

PD_AVX512 void SwiGluChunksAvx512(int64_t chunks, const float* g,
                                  const float* u, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t c = 0; c < chunks; ++c) {
    const __m512 x = _mm512_loadu_ps(g + c * kLanes);
    const __m512 silu = _mm512_div_ps(
        x,
        _mm512_add_ps(one, ExpGgml16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    _mm512_storeu_ps(out + c * kLanes,
                     _mm512_mul_ps(silu, _mm512_loadu_ps(u + c * kLanes)));
  }
}

// Per-thread accumulators for WeightedRowSumF16: [slot][lane][d] floats.
std::vector<float>& Scratch() {
  thread_local std::vector<float> scratch;
  return scratch;
}

// The value rows of a weighted row sum: fp16 rows by pointer (widened as
// they are read), or fp32 rows that hold fp16 values widened beforehand
// (the same floats, without a conversion per read).
#define PD_AVX2 __attribute__((target("avx2,f16c,fma")))

struct HalfRows {
  const uint16_t* const* rows;
  float At(int64_t j, int i) const { return HalfTable()[rows[j][i]]; }
  PD_AVX512 __m512 Load16(int64_t j, int c) const {
    return LoadHalves16(rows[j] + c * kLanes);
  }
  PD_AVX2 __m256 Load8(int64_t j, int c) const {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + c * 8)));
  }
};

struct FloatRows {
  const float* base;
  int d;
  int64_t rows_per_slot;  // see WeightedRowSumWidened
  float At(int64_t j, int i) const {
    return base[SlotMajorRow(j, rows_per_slot) * d + i];
  }
  PD_AVX512 __m512 Load16(int64_t j, int c) const {
    return _mm512_loadu_ps(base + SlotMajorRow(j, rows_per_slot) * d +
                           c * kLanes);
  }
  PD_AVX2 __m256 Load8(int64_t j, int c) const {
    return _mm256_loadu_ps(base + SlotMajorRow(j, rows_per_slot) * d + c * 8);
  }
};

// Portable form: acc[(j / 16) % slots][j % 16][i] += p[j] * rows[j][i].
template <class Rows>
void AccumulateScalar(int slots, int64_t n, const float* p, const Rows& rows,
                      int d, float* acc) {
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j];
    float* a = acc + (((j / kLanes) % slots) * kLanes + j % kLanes) * d;
    for (int i = 0; i < d; ++i) a[i] = std::fma(pj, rows.At(j, i), a[i]);
  }
}

// The sums of each output element's 16 (tinyBLAS) or 64 (vec_dot) lane
// slots, in ggml's order: 16 elements at a time.
__attribute__((target("avx512f,avx512dq,f16c,fma"))) void FinishAvx512(
    int slots, const float* acc, int d, float* out) {
  for (int i = 0; i < d; i += kLanes) {
    __m512 v[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      if (slots == 4) {
        const __m512 a0 = _mm512_loadu_ps(acc + (0 * kLanes + l) * d + i);
        const __m512 a1 = _mm512_loadu_ps(acc + (1 * kLanes + l) * d + i);
        const __m512 a2 = _mm512_loadu_ps(acc + (2 * kLanes + l) * d + i);
        const __m512 a3 = _mm512_loadu_ps(acc + (3 * kLanes + l) * d + i);
        v[l] = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
      } else {
        v[l] = _mm512_loadu_ps(acc + l * d + i);
      }
    }
    // ReduceAdd16 over l, for 16 elements.
    for (int l = 0; l < 8; ++l) v[l] = _mm512_add_ps(v[l + 8], v[l]);
    for (int l = 0; l < 4; ++l) v[l] = _mm512_add_ps(v[l + 4], v[l]);
    const __m512 c0 = _mm512_add_ps(v[0], v[2]);
    const __m512 c1 = _mm512_add_ps(v[1], v[3]);
    _mm512_storeu_ps(out + i, _mm512_add_ps(c0, c1));
  }
}

// The kernels above for any number of heads, four at a time.
template <bool kVecDot>
void GatheredScoresHeads(int d, const uint16_t* const* rows, int64_t count,
                         int nq, const uint16_t* q, int64_t q_stride,
                         float scale, float* out, int64_t out_stride) {
  for (int h = 0; h < nq; h += 4) {
    const uint16_t* qh = q + h * q_stride;
    float* oh = out + h * out_stride;
    switch (std::min(nq - h, 4)) {
      case 1:
        GatheredScores<1, kVecDot>(d, rows, count, qh, q_stride, scale, oh,
                                   out_stride);
        break;
      case 2:
        GatheredScores<2, kVecDot>(d, rows, count, qh, q_stride, scale, oh,
                                   out_stride);
        break;
      case 3:
        GatheredScores<3, kVecDot>(d, rows, count, qh, q_stride, scale, oh,
                                   out_stride);
        break;
      default:
        GatheredScores<4, kVecDot>(d, rows, count, qh, q_stride, scale, oh,
                                   out_stride);
        break;
    }
  }
}

template <bool kVecDot, class Rows>
void WeightedSumTreeGroups(int64_t n, int nq, const float* p, int64_t p_stride,
                           const Rows& rows, int d, float* out,
                           int64_t out_stride) {
  for (int h = 0; h < nq; h += 4) {
    const float* ph = p + h * p_stride;
    float* oh = out + h * out_stride;
    switch (std::min(nq - h, 4)) {
      case 1:
        WeightedSumTree<1, kVecDot>(n, ph, p_stride, rows, d, oh, out_stride);
        break;
      case 2:
        WeightedSumTree<2, kVecDot>(n, ph, p_stride, rows, d, oh, out_stride);
        break;
      case 3:
        WeightedSumTree<3, kVecDot>(n, ph, p_stride, rows, d, oh, out_stride);
        break;
      default:
        WeightedSumTree<4, kVecDot>(n, ph, p_stride, rows, d, oh, out_stride);
        break;
    }
  }
}

template <class Rows>
void WeightedSumTreeHeads(F16DotOrder order, int64_t n, int nq, const float* p,
                          int64_t p_stride, const Rows& rows, int d, float* out,
                          int64_t out_stride) {
  if (order == F16DotOrder::kVecDot) {
    WeightedSumTreeGroups<true>(n, nq, p, p_stride, rows, d, out, out_stride);
  } else {
    WeightedSumTreeGroups<false>(n, nq, p, p_stride, rows, d, out, out_stride);
  }
}

// AccumulateScalar with AVX-512 for NQ
// probability rows (p + h * p_stride) over the same value rows at once, into
// acc + h * acc_stride, for d = C * 16 (a constant, so that the sums stay in
// registers; NQ * C <= 24): each value vector is loaded once for NQ
// multiply-adds. Every sum gets the single-row form's
// operations in its order.
template <int NQ, int C, class Rows>
PD_AVX512 void AccumulateRowsAvx512(int slots, int64_t n, const float* p,
                                    int64_t p_stride, const Rows& rows,
                                    float* acc, int64_t acc_stride) {
  constexpr int d = C * kLanes;
  const int stride = kLanes * slots;
  for (int slot = 0; slot < stride && slot < n; ++slot) {
    __m512 sums[NQ][C];
    SlotSums<NQ, C>(slot, stride, n, p, p_stride, rows, 0, sums);
    const int64_t at = ((slot / kLanes) * kLanes + slot % kLanes) * d;
#pragma GCC unroll 3
    for (int h = 0; h < NQ; ++h) {
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        _mm512_storeu_ps(acc + h * acc_stride + at + c * kLanes, sums[h][c]);
      }
    }
  }
}

// WeightedRowSumWidened's sums for d = C * 16, up to three rows at a time.
template <int C>
void AccumulateWidened(int slots, int64_t n, int nq, const float* p,
                       int64_t p_stride, const FloatRows& rows, float* out,
                       int64_t out_stride) {
  static_assert(3 * C <= 24, "three rows' sums must fit the registers");
  const int64_t acc_stride = int64_t{slots} * kLanes * C * kLanes;
  std::vector<float>& acc = Scratch();
  for (int h0 = 0; h0 < nq;) {
    const int take = std::min(nq - h0, 3);
    acc.assign(take * acc_stride, 0.0f);
    const float* ph = p + h0 * p_stride;
    if (take == 3) {
      AccumulateRowsAvx512<3, C>(slots, n, ph, p_stride, rows, acc.data(),
                                 acc_stride);
    } else if (take == 2) {
      AccumulateRowsAvx512<2, C>(slots, n, ph, p_stride, rows, acc.data(),
                                 acc_stride);
    } else {
      AccumulateRowsAvx512<1, C>(slots, n, ph, p_stride, rows, acc.data(),
                                 acc_stride);
    }
    for (int h = 0; h < take; ++h) {
      FinishAvx512(slots, acc.data() + h * acc_stride, C * kLanes,
                   out + (h0 + h) * out_stride);
    }
    h0 += take;
  }
}

// ---------------------------------------------------------------------------
// AVX2 forms (HaveAvx2): each 16-lane operation of ggml's AVX-512 code, and so
// of the scalar emulation, as two 8-lane halves. Every float is made by the
// same fused multiply-adds and additions in the same order as the scalar
// form's, so the results are its bits (ggml_ops_test compares them).

// ReduceAdd16 of two 8-lane halves (lanes 0-7, 8-15).
PD_AVX2 inline float ReduceAdd16Avx2(__m256 low, __m256 high) {
  float v[kLanes];
  _mm256_storeu_ps(v, low);
  _mm256_storeu_ps(v + 8, high);
  return ReduceAdd16(v);
}

PD_AVX2 inline __m256 LoadHalves8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

PD_AVX2 float DotF16GgmlAvx2(int64_t n, const uint16_t* x, const uint16_t* y,
                             const float* half) {
  const int64_t np = n & ~int64_t{63};
  __m256 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < np; i += 64) {
    for (int k = 0; k < 4; ++k) {
      for (int h = 0; h < 2; ++h) {
        const int64_t e = i + k * kLanes + h * 8;
        acc[k][h] =
            _mm256_fmadd_ps(LoadHalves8(x + e), LoadHalves8(y + e), acc[k][h]);
      }
    }
  }
  __m256 s[2];
  for (int h = 0; h < 2; ++h) {
    s[h] = _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[2][h]),
                         _mm256_add_ps(acc[1][h], acc[3][h]));
  }
  double sum = ReduceAdd16Avx2(s[0], s[1]);
  for (int64_t e = np; e < n; ++e) {
    sum += static_cast<double>(half[x[e]] * half[y[e]]);
  }
  return static_cast<float>(sum);
}

PD_AVX2 float DotF16TinyBlasAvx2(int64_t n, const uint16_t* x,
                                 const uint16_t* y, const float* half) {
  __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) {
    low = _mm256_fmadd_ps(LoadHalves8(x + e), LoadHalves8(y + e), low);
    high =
        _mm256_fmadd_ps(LoadHalves8(x + e + 8), LoadHalves8(y + e + 8), high);
  }
  float acc[kLanes];
  _mm256_storeu_ps(acc, low);
  _mm256_storeu_ps(acc + 8, high);
  for (; e < n; ++e) {  // the last lanes: lane e % 16, as the scalar form
    acc[e % kLanes] = std::fma(half[x[e]], half[y[e]], acc[e % kLanes]);
  }
  return ReduceAdd16(acc);
}

// DotF16ManyTransposed for one query, d = C * 16 (vec_dot: C a multiple of
// 4), 8 keys at a time: the AVX-512 kernels' sums (TransposedScores*)
// for half of a block of 16 keys.
PD_AVX2 void TransposedScoresAvx2(bool vec_dot, const float* key_blocks,
                                  int64_t count, int d, const float* q,
                                  float scale, float* out) {
  const int chunks = d / kLanes;
  const __m256 scale8 = _mm256_set1_ps(scale);
  for (int64_t j0 = 0; j0 < count; j0 += 8) {
    // Keys j0 .. j0 + 7: lanes j0 % 16 .. + 7 of block j0 / 16.
    const float* k = key_blocks + j0 / kLanes * kLanes * d + j0 % kLanes;
    __m256 lane[kLanes];  // ggml's lane l of the 8 keys' sums
    for (int l = 0; l < kLanes; ++l) {
      if (vec_dot) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int c = 0; c < chunks; ++c) {
          const int e = c * kLanes + l;
          acc[c % 4] = _mm256_fmadd_ps(_mm256_loadu_ps(k + e * kLanes),
                                       _mm256_set1_ps(q[e]), acc[c % 4]);
        }
        lane[l] = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]),
                                _mm256_add_ps(acc[1], acc[3]));
      } else {
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < chunks; ++c) {
          const int e = c * kLanes + l;
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(k + e * kLanes),
                                _mm256_set1_ps(q[e]), acc);
        }
        lane[l] = acc;
      }
    }
    // ReduceAdd16's tree, lane by lane.
    for (int i = 0; i < 8; ++i) lane[i] = _mm256_add_ps(lane[i + 8], lane[i]);
    for (int i = 0; i < 4; ++i) lane[i] = _mm256_add_ps(lane[i + 4], lane[i]);
    const __m256 sums = _mm256_add_ps(_mm256_add_ps(lane[0], lane[2]),
                                      _mm256_add_ps(lane[1], lane[3]));
    float scores[8];
    _mm256_storeu_ps(scores, _mm256_mul_ps(sums, scale8));
    const int64_t keep = std::min<int64_t>(8, count - j0);
    for (int64_t t = 0; t < keep; ++t) out[j0 + t] = scores[t];
  }
}

// AccumulateScalar over i, 8 elements at a time (d % 8 == 0, d <= 256),
// slot by slot (the slot sums stay in registers while its positions go by).
template <class Rows>
PD_AVX2 void AccumulateAvx2(int slots, int64_t n, const float* p,
                            const Rows& rows, int d, float* acc) {
  const int stride = kLanes * slots;
  const int chunks = d / 8;
  for (int slot = 0; slot < stride && slot < n; ++slot) {
    __m256 sums[32];
    for (int c = 0; c < chunks; ++c) sums[c] = _mm256_setzero_ps();
    for (int64_t j = slot; j < n; j += stride) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int c = 0; c < chunks; ++c) {
        sums[c] = _mm256_fmadd_ps(pj, rows.Load8(j, c), sums[c]);
      }
    }
    float* a = acc + ((slot / kLanes) * kLanes + slot % kLanes) * d;
    for (int c = 0; c < chunks; ++c) _mm256_storeu_ps(a + c * 8, sums[c]);
  }
}

// Which form WeightedRowSum accumulates with.
enum class Simd { kNone, kAvx2, kAvx512 };

// The fastest form this CPU has for head size d.
Simd WeightedSumSimd(int d) {
  if (d % kLanes == 0 && d <= 16 * kLanes && HaveAvx512()) return Simd::kAvx512;
  if (d % 8 == 0 && d <= 256 && HaveAvx2()) return Simd::kAvx2;
  return Simd::kNone;
}

template <class Rows>
void WeightedRowSum(F16DotOrder order, int64_t n, const float* p,
                    const Rows& rows, int d, float* out, Simd simd) {
  const int slots = order == F16DotOrder::kVecDot ? 4 : 1;
  if (simd == Simd::kAvx512) {
    WeightedSumTreeHeads(order, n, 1, p, 0, rows, d, out, 0);
    return;
  }
  std::vector<float>& acc = Scratch();
  acc.assign(static_cast<size_t>(slots) * kLanes * d, 0.0f);
  if (simd == Simd::kAvx2) {
    AccumulateAvx2(slots, n, p, rows, d, acc.data());
  } else {
    AccumulateScalar(slots, n, p, rows, d, acc.data());
  }
  float s[kLanes];
  for (int i = 0; i < d; ++i) {
    if (slots == 4) {
      for (int l = 0; l < kLanes; ++l) {
        const float a0 = acc[(0 * kLanes + l) * d + i];
        const float a1 = acc[(1 * kLanes + l) * d + i];
        const float a2 = acc[(2 * kLanes + l) * d + i];
        const float a3 = acc[(3 * kLanes + l) * d + i];
        s[l] = (a0 + a2) + (a1 + a3);
      }
    } else {
      for (int l = 0; l < kLanes; ++l) s[l] = acc[l * d + i];
    }
    out[i] = ReduceAdd16(s);
  }
}

double SoftMax(int64_t n, const float* x, float max, float* y, bool avx512) {
  double sum = 0;
  int64_t i = 0;
  if (avx512) {
    sum = SoftMaxChunksAvx512(n / kLanes, x, max, y);
    i = n / kLanes * kLanes;
  }
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) y[i + l] = ExpGgml(x[i + l] - max);
    sum += static_cast<double>(ReduceAdd16(y + i));
  }
  for (; i < n; ++i) {
    const float v = std::exp(x[i] - max);
    sum += static_cast<double>(v);
    y[i] = v;
  }
  return sum;
}

void SwiGlu(int64_t n, const float* g, const float* u, float* out,
            bool avx512) {
  int64_t i = 0;
  if (avx512) {
    SwiGluChunksAvx512(n / kLanes, g, u, out);
    i = n / kLanes * kLanes;
  }
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      out[i + l] = SiluGgml(g[i + l]) * u[i + l];
    }
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace

float DotF16Ggml(int64_t n, const uint16_t* x, const uint16_t* y) {
  if (HaveAvx512()) return DotF16GgmlAvx512(n, x, y, HalfTable());
  if (HaveAvx2()) return DotF16GgmlAvx2(n, x, y, HalfTable());
  return DotF16GgmlPortable(n, x, y);
}

float DotF16GgmlPortable(int64_t n, const uint16_t* x, const uint16_t* y) {
  const float* half = HalfTable();
  const int64_t np = n & ~int64_t{63};
  float acc[4][kLanes] = {};
  for (int64_t i = 0; i < np; i += 64) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < kLanes; ++l) {
        const int64_t e = i + k * kLanes + l;
        acc[k][l] = std::fma(half[x[e]], half[y[e]], acc[k][l]);
      }
    }
  }
  // GGML_F32x16_REDUCE: accumulators 0+2 and 1+3, then those two.
  float s[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    s[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  }
  double sum = ReduceAdd16(s);
  for (int64_t e = np; e < n; ++e) {
    sum += static_cast<double>(half[x[e]] * half[y[e]]);
  }
  return static_cast<float>(sum);
}

float DotF16TinyBlas(int64_t n, const uint16_t* x, const uint16_t* y) {
  if (HaveAvx512()) return DotF16TinyBlasAvx512(n, x, y);
  if (HaveAvx2()) return DotF16TinyBlasAvx2(n, x, y, HalfTable());
  return DotF16TinyBlasPortable(n, x, y);
}

float DotF16TinyBlasPortable(int64_t n, const uint16_t* x, const uint16_t* y) {
  const float* half = HalfTable();
  float acc[kLanes] = {};
  for (int64_t e = 0; e < n; ++e) {
    acc[e % kLanes] = std::fma(half[x[e]], half[y[e]], acc[e % kLanes]);
  }
  return ReduceAdd16(acc);
}

float DotF16(F16DotOrder order, int64_t n, const uint16_t* x,
             const uint16_t* y) {
  return order == F16DotOrder::kVecDot ? DotF16Ggml(n, x, y)
                                       : DotF16TinyBlas(n, x, y);
}

void DotF16Many(F16DotOrder order, int64_t n, const uint16_t* const* rows,
                int64_t count, const uint16_t* y, float scale, float* out) {
  DotF16ManyHeads(order, static_cast<int>(n), rows, count, 1, y, 0, scale, out,
                  0);
}

void DotF16ManyHeads(F16DotOrder order, int d, const uint16_t* const* rows,
                     int64_t count, int nq, const uint16_t* q, int64_t q_stride,
                     float scale, float* out, int64_t out_stride) {
  const bool vec_dot = order == F16DotOrder::kVecDot;
  if (HaveAvx512() && d % (vec_dot ? 64 : kLanes) == 0 && d <= 256) {
    if (vec_dot) {
      GatheredScoresHeads<true>(d, rows, count, nq, q, q_stride, scale, out,
                                out_stride);
    } else {
      GatheredScoresHeads<false>(d, rows, count, nq, q, q_stride, scale, out,
                                 out_stride);
    }
    return;
  }
  for (int h = 0; h < nq; ++h) {
    for (int64_t j = 0; j < count; ++j) {
      out[h * out_stride + j] =
          DotF16(order, d, rows[j], q + h * q_stride) * scale;
    }
  }
}

namespace {

// The kernel in `table` (indexed by d / 16) for head size d: null where the
// table has none or the CPU lacks AVX-512.
template <class Kernel, size_t N>
Kernel KernelForHeadSize(const Kernel (&table)[N], int d) {
  const int chunks = d / kLanes;
  if (d % kLanes != 0 || chunks >= static_cast<int>(N) || !HaveAvx512()) {
    return nullptr;
  }
  return table[chunks];
}

}  // namespace

void WeightedRowSumF16(F16DotOrder order, int64_t n, const float* p,
                       const uint16_t* const* rows, int d, float* out) {
  WeightedRowSum(order, n, p, HalfRows{rows}, d, out, WeightedSumSimd(d));
}

void WeightedRowSumF16Heads(F16DotOrder order, int64_t n, int nq,
                            const float* p, int64_t p_stride,
                            const uint16_t* const* rows, int d, float* out,
                            int64_t out_stride) {
  if (WeightedSumSimd(d) == Simd::kAvx512) {
    WeightedSumTreeHeads(order, n, nq, p, p_stride, HalfRows{rows}, d, out,
                         out_stride);
    return;
  }
  for (int h = 0; h < nq; ++h) {
    WeightedRowSumF16(order, n, p + h * p_stride, rows, d,
                      out + h * out_stride);
  }
}

void WeightedRowSumF16Portable(F16DotOrder order, int64_t n, const float* p,
                               const uint16_t* const* rows, int d, float* out) {
  WeightedRowSum(order, n, p, HalfRows{rows}, d, out, Simd::kNone);
}

void WeightedRowSumWidened(F16DotOrder order, int64_t n, int nq, const float* p,
                           int64_t p_stride, const float* values,
                           int64_t rows_per_slot, int d, float* out,
                           int64_t out_stride) {
  const FloatRows rows{values, d, rows_per_slot};
  const int slots = order == F16DotOrder::kVecDot ? 4 : 1;
  // Head sizes with a kernel, as DotF16ManyTransposed.
  using Kernel = void (*)(int, int64_t, int, const float*, int64_t,
                          const FloatRows&, float*, int64_t);
  static constexpr Kernel kByChunks[] = {nullptr,
                                         nullptr,
                                         nullptr,
                                         nullptr,
                                         AccumulateWidened<4>,
                                         AccumulateWidened<5>,
                                         AccumulateWidened<6>,
                                         nullptr,
                                         AccumulateWidened<8>};
  if (const Kernel kernel = KernelForHeadSize(kByChunks, d)) {
    kernel(slots, n, nq, p, p_stride, rows, out, out_stride);
    return;
  }
  for (int h = 0; h < nq; ++h) {
    WeightedRowSum(order, n, p + h * p_stride, rows, d, out + h * out_stride,
                   WeightedSumSimd(d));
  }
}

void WeightedRowSumWidenedPortable(F16DotOrder order, int64_t n, int nq,
                                   const float* p, int64_t p_stride,
                                   const float* values, int64_t rows_per_slot,
                                   int d, float* out, int64_t out_stride) {
  for (int h = 0; h < nq; ++h) {
    WeightedRowSum(order, n, p + h * p_stride,
                   FloatRows{values, d, rows_per_slot}, d, out + h * out_stride,
                   Simd::kNone);
  }
}

void DotF16ManyTransposed(F16DotOrder order, int d, const float* key_blocks,
                          int64_t count, int nq, const float* q,
                          int64_t q_stride, float scale, float* out,
                          int64_t out_stride) {
  // Kernels by d / 16: tinyBLAS for head sizes 64, 80, 96 and 128, vec_dot
  // (whole chunks of 64) for 64 and 128.
  using Kernel = void (*)(const float*, int64_t, int, const float*, int64_t,
                          float, float*, int64_t);
  static constexpr Kernel kTinyBlas[] = {nullptr,
                                         nullptr,
                                         nullptr,
                                         nullptr,
                                         TransposedScoresTinyBlasAll<4>,
                                         TransposedScoresTinyBlasAll<5>,
                                         TransposedScoresTinyBlasAll<6>,
                                         nullptr,
                                         TransposedScoresTinyBlasAll<8>};
  static constexpr Kernel kVecDot[] = {nullptr,
                                       nullptr,
                                       nullptr,
                                       nullptr,
                                       TransposedScoresVecDotAll<4>,
                                       nullptr,
                                       nullptr,
                                       nullptr,
                                       TransposedScoresVecDotAll<8>};
  if (const Kernel kernel = order == F16DotOrder::kVecDot
                                ? KernelForHeadSize(kVecDot, d)
                                : KernelForHeadSize(kTinyBlas, d)) {
    kernel(key_blocks, count, nq, q, q_stride, scale, out, out_stride);
    return;
  }
  const bool vec_dot = order == F16DotOrder::kVecDot;
  if (HaveAvx2() && d % (vec_dot ? 64 : kLanes) == 0) {
    for (int h = 0; h < nq; ++h) {
      TransposedScoresAvx2(vec_dot, key_blocks, count, d, q + h * q_stride,
                           scale, out + h * out_stride);
    }
    return;
  }
  DotF16ManyTransposedPortable(order, d, key_blocks, count, nq, q, q_stride,
                               scale, out, out_stride);
}

void DotF16ManyTransposedPortable(F16DotOrder order, int d,
                                  const float* key_blocks, int64_t count,
                                  int nq, const float* q, int64_t q_stride,
                                  float scale, float* out, int64_t out_stride) {
  // The values are fp16 ones: narrowing them back is exact, and DotF16 is
  // the definition.
  std::vector<uint16_t> key(d), query(d);
  for (int h = 0; h < nq; ++h) {
    Fp32ToFp16Row(q + h * q_stride, d, query.data());
    for (int64_t j = 0; j < count; ++j) {
      for (int e = 0; e < d; ++e) {
        key[e] = Fp32ToFp16(key_blocks[KeyBlockIndex(j, e, d)]);
      }
      out[h * out_stride + j] =
          DotF16(order, d, key.data(), query.data()) * scale;
    }
  }
}

float MaxScore(int64_t n, const float* x) {
  if (HaveAvx512()) return MaxScoreAvx512(n, x);
  return MaxScorePortable(n, x);
}

float MaxScorePortable(int64_t n, const float* x) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

void ScaleToF16Precision(int64_t n, float scale, float* x) {
  if (HaveAvx512()) {
    ScaleToF16PrecisionAvx512(n, scale, x);
    return;
  }
  ScaleToF16PrecisionPortable(n, scale, x);
}

void ScaleToF16PrecisionPortable(int64_t n, float scale, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = Fp16ToFp32(Fp32ToFp16(x[i] * scale));
}

float ExpGgml(float x) {
  // Round x / ln 2 to an integer n with the 1.5 * 2^23 trick, reduce
  // b = x - n ln 2 in two steps, evaluate the polynomial by Estrin's scheme
  // and scale by 2^n (vscalefps). The constants are ggml's.
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  float b = std::fma(-n, 0x1.62e4p-1f, x);
  b = std::fma(-n, 0x1.7f7d1cp-20f, b);
  const float u = b * b;
  const float p1 = std::fma(0x1.ffffecp-1f, b, 1.0f);
  const float p2 = std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
  const float p3 = std::fma(b, 0x1.0e402p-7f, 0x1.573e2ep-5f);
  float j = std::fma(p3, u, p2);
  j = std::fma(j, u, p1);
  if (std::isnan(n)) return std::numeric_limits<float>::quiet_NaN();
  if (std::fabs(n) > 192.0f) {
    return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  }
  // vscalefps multiplies by 2^n with one rounding, as ldexp does.
  return std::ldexp(j, static_cast<int>(n));
}

float SiluGgml(float x) { return x / (1.0f + ExpGgml(0.0f - x)); }

double SoftMaxGgml(int64_t n, const float* x, float max, float* y) {
  return SoftMax(n, x, max, y, HaveAvx512());
}

double SoftMaxGgmlPortable(int64_t n, const float* x, float max, float* y) {
  return SoftMax(n, x, max, y, /*avx512=*/false);
}

void SwiGluGgml(int64_t n, const float* g, const float* u, float* out) {
  SwiGlu(n, g, u, out, HaveAvx512());
}

void SwiGluGgmlPortable(int64_t n, const float* g, const float* u, float* out) {
  SwiGlu(n, g, u, out, /*avx512=*/false);
}

}  // namespace pdserve::kernels
