// AVX-512 VNNI kernels for MatMulRows (see matmul_avx512.h and, for the
// arithmetic they reproduce, matmul.h).
//
// What each (weight row r, token t) output is, in ggml's x86 order:
//   for every 32-element block b, in order:
//     lanes[i] = integer sum of products of elements 4i..4i+3   (i < 8)
//     acc[i]   = fma(d_w[r,b] * d_x[t,b], float(lanes[i]), acc[i])
//     summs   += m_w[r,b] * s_x[t,b]                 (Q4_1 only)
//   out = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7)) + summs
// One vpdpbusd computes the eight lane sums exactly as ggml groups them
// (unsigned weight bytes times signed activation bytes, four products per
// int32 lane), and every float operation is the reference's, one by one, in
// the same order: results are bit for bit those of the portable kernels.
//
// Signed weights are made unsigned for vpdpbusd by an offset that the
// accumulator starts from: Q8_0 as w + 128 (lanes start at -128 * sum(y)),
// Q4_0 quants are already 0..15 with the value q - 8 (lanes start at
// -8 * sum(y)). Both integers are exact.
//
// Four kernels:
//  - TransposedTile (two to eight tokens on weights as the GGUF file has
//    them): 4 rows x up to 8 tokens, one 16-lane register per ggml lane
//    holding 16 (row, token) pairs. Rows are walked in chunks of about
//    256 KiB so that a chunk stays in L2 while every group of tokens passes
//    over it.
//  - OneTokenTile (one token on weights as the GGUF file has them): 4 rows,
//    one eight-lane register per row.
//  - MatVecPackedRows (one token on weights repacked at load, decode's
//    kernel): 16 rows per group, no shuffles.
//  - PackedGroupTokens (two tokens on the repacked weights: prefill and
//    batched decode): 16 rows per group, each block unpacked once for both
//    tokens; the engine's path whenever the weights are packed. Up to 64
//    tokens (MatMulPackedFewTokens) take every pair over one group before
//    the next, the first pair streaming it from memory; more
//    (MatMulPackedRows) take every pair over an L2-sized chunk of groups.
// In the block-sum arithmetic (PackedArithmetic::kBlockSums, matmul.h),
// packed weights take MatVecPackedBlockSums (one token) and
// PackedGroupBlockSums (more, through the same two loops): a block's eight
// lanes added in integers, up to eight tokens per pass.
#include "kernels/matmul_avx512.h"

#include <immintrin.h>

#include <cstring>
#include <memory>
#include <type_traits>

namespace pdserve::kernels::internal {
namespace {

constexpr int kTile = 4;  // rows and tokens per register tile
constexpr int64_t kChunkBytes = 256 * 1024;

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float LoadHalf(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// 32 quants of a Q4 block (16 bytes: element j in the low nibble of byte j,
// element 16 + j in its high nibble) as 32 bytes in element order.
inline __m256i UnpackNibbles(const uint8_t* q) {
  const __m256i both = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  return _mm256_and_si256(
      _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0)),
      _mm256_set1_epi8(0x0F));
}

// The weight formats. kLaneOffset: the unsigned bytes Unpack returns exceed
// the weight's integer value by this much (lanes start at
// -kLaneOffset * sum(y)); kHasMin: Q4_1's m_w * s_x terms.
struct Q4_1Format {
  static constexpr int kBlockBytes = 20;  // f16 d, f16 m, 16 bytes quants
  static constexpr int kQuantOffset = 4;
  static constexpr int kActBytes = 36;  // Q8_1: f16 d, f16 s, int8 q[32]
  static constexpr int kActQuantOffset = 4;
  static constexpr bool kHasMin = true;
  static constexpr int kLaneOffset = 0;
  static __m256i Unpack(const uint8_t* q) { return UnpackNibbles(q); }
};

struct Q4_0Format {
  static constexpr int kBlockBytes = 18;  // f16 d, 16 bytes quants
  static constexpr int kQuantOffset = 2;
  static constexpr int kActBytes = 34;  // Q8_0: f16 d, int8 q[32]
  static constexpr int kActQuantOffset = 2;
  static constexpr bool kHasMin = false;
  static constexpr int kLaneOffset = 8;
  static __m256i Unpack(const uint8_t* q) { return UnpackNibbles(q); }
};

struct Q8_0Format {
  static constexpr int kBlockBytes = 34;  // f16 d, int8 q[32]
  static constexpr int kQuantOffset = 2;
  static constexpr int kActBytes = 34;
  static constexpr int kActQuantOffset = 2;
  static constexpr bool kHasMin = false;
  static constexpr int kLaneOffset = 128;
  static __m256i Unpack(const uint8_t* q) {
    return _mm256_xor_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
        _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// Per block b and token slot t of a group of up to four tokens (slot-major
// within a block: [b * 4 + t]); slots past the group's tokens are zero.
struct ActivationScales {
  alignas(64) float d[kMaxAvx512Blocks * kTile];
  alignas(64) float s[kMaxAvx512Blocks * kTile];
  // -kLaneOffset * (lane sums of y), where the format needs it.
  __m256i lane_start[kMaxAvx512Blocks * kTile];
  // For the transposed tile (TransposedTile): per block, for each ggml lane
  // i < 8, 16 bytes holding int32 word i of token slots 0..3; the
  // activation quants (y) and the lane starts.
  alignas(64) uint8_t y_by_lane[kMaxAvx512Blocks * 128];
  alignas(64) uint8_t start_by_lane[kMaxAvx512Blocks * 128];
};

template <class F>
void PrepareActivations(const uint8_t* act, int64_t act_row_bytes, int64_t nb,
                        int tokens, bool transposed, ActivationScales* out) {
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < nb; ++b) {
    for (int t = 0; t < kTile; ++t) {
      const int64_t i = b * kTile + t;
      if (t >= tokens) {
        out->d[i] = 0.0f;
        out->s[i] = 0.0f;
        out->lane_start[i] = _mm256_setzero_si256();
        continue;
      }
      const uint8_t* block = act + t * act_row_bytes + b * F::kActBytes;
      out->d[i] = LoadHalf(block);
      out->s[i] = F::kHasMin ? LoadHalf(block + 2) : 0.0f;
      if constexpr (F::kLaneOffset != 0) {
        const __m256i y = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(block + F::kActQuantOffset));
        out->lane_start[i] = _mm256_mullo_epi32(
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, y),
            _mm256_set1_epi32(-F::kLaneOffset));
      }
    }
    if (!transposed) continue;
    for (int t = 0; t < kTile; ++t) {
      uint8_t y[32] = {};
      if (t < tokens) {
        std::memcpy(
            y, act + t * act_row_bytes + b * F::kActBytes + F::kActQuantOffset,
            32);
      }
      alignas(32) uint8_t start[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(start),
                         out->lane_start[b * kTile + t]);
      for (int lane = 0; lane < 8; ++lane) {
        std::memcpy(out->y_by_lane + b * 128 + lane * 16 + t * 4, y + lane * 4,
                    4);
        std::memcpy(out->start_by_lane + b * 128 + lane * 16 + t * 4,
                    start + lane * 4, 4);
      }
    }
  }
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The tile's four row pointers; rows past `rows` read row 0 again (their
// lanes are computed and never stored).
inline void TileRows(const uint8_t* w, int64_t row_bytes, int rows,
                     const uint8_t* row[kTile]) {
  for (int r = 0; r < kTile; ++r) row[r] = w + (r < rows ? r * row_bytes : 0);
}

// The scale (and min) of the block at `offset` in the tile's rows, as the
// 16-lane vectors the tiles multiply with: lane p = r * 4 + t holds row r's
// value. Four scalar loads of the block headers (f16 d, f16 m): a gather is
// much slower on CPUs with the Gather Data Sampling mitigation.
template <class F>
inline void WeightScales(const uint8_t* const row[kTile], int64_t offset,
                         __m512* d16, __m512* m16) {
  const __m128i headers =
      _mm_set_epi32(static_cast<int>(LoadU32(row[3] + offset)),
                    static_cast<int>(LoadU32(row[2] + offset)),
                    static_cast<int>(LoadU32(row[1] + offset)),
                    static_cast<int>(LoadU32(row[0] + offset)));
  // [d0, m0, d1, m1, d2, m2, d3, m3] (Q4_0 / Q8_0: m lanes hold quants).
  const __m512 dm = _mm512_castps256_ps512(_mm256_cvtph_ps(headers));
  *d16 = _mm512_permutexvar_ps(
      _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0), dm);
  if constexpr (F::kHasMin) {
    *m16 = _mm512_permutexvar_ps(
        _mm512_set_epi32(7, 7, 7, 7, 5, 5, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1), dm);
  }
}

// The tiles read four short rows side by side; the hardware prefetcher does
// not run far enough ahead of that (decode waited on memory in every block),
// so the tile two ahead is prefetched as this one runs: three lines per
// block cover 4 * 34 bytes, the most a block of four rows takes. Always
// inlined, as PrefetchFourBlocksAhead below (GCC 12 deletes the calls of a
// prefetch-only function it has not inlined).
[[gnu::always_inline]] inline void PrefetchTileAhead(const uint8_t* w,
                                                     int64_t row_bytes,
                                                     int64_t b) {
  const char* ahead =
      reinterpret_cast<const char*>(w + 2 * kTile * row_bytes + b * 192);
  _mm_prefetch(ahead, _MM_HINT_T0);
  _mm_prefetch(ahead + 64, _MM_HINT_T0);
  _mm_prefetch(ahead + 128, _MM_HINT_T0);
}

// ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)), as ggml's hsum_float_8.
inline float SumLanes(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// The same additions for 16 outputs at once, lane l of acc[i] being ggml
// lane i of output l; then + summs.
inline __m512 SumLanes16(const __m512 acc[8], __m512 summs) {
  const __m512 r0 = _mm512_add_ps(acc[0], acc[4]);
  const __m512 r1 = _mm512_add_ps(acc[1], acc[5]);
  const __m512 r2 = _mm512_add_ps(acc[2], acc[6]);
  const __m512 r3 = _mm512_add_ps(acc[3], acc[7]);
  return _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3)), summs);
}

// out[r] for r < RT of one token: each row keeps its own eight-lane
// accumulator in a ymm register (the shape of ggml's own kernel). w: the
// tile's first row; act: the token's activation row.
template <class F, int RT>
void OneTokenTile(const uint8_t* w, int64_t row_bytes, int64_t nb,
                  const uint8_t* act, const ActivationScales& scales,
                  float* out) {
  const uint8_t* row[kTile];
  TileRows(w, row_bytes, RT, row);
  // Kept in registers: every loop over r below is unrolled.
  __m256 acc[RT];
#pragma GCC unroll 4
  for (int r = 0; r < RT; ++r) acc[r] = _mm256_setzero_ps();
  __m512 summs = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t offset = b * F::kBlockBytes;
    PrefetchTileAhead(w, row_bytes, b);
    __m512 dw16, mw16;
    WeightScales<F>(row, offset, &dw16, &mw16);
    // Kept in a register: a store here read back lane by lane would stall
    // on store forwarding in every block. Token slot 0: lanes r * 4.
    const __m512 dd = _mm512_mul_ps(
        dw16, _mm512_broadcast_f32x4(_mm_load_ps(scales.d + b * kTile)));
    if constexpr (F::kHasMin) {
      summs = _mm512_add_ps(
          summs, _mm512_mul_ps(mw16, _mm512_broadcast_f32x4(
                                         _mm_load_ps(scales.s + b * kTile))));
    }
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        act + b * F::kActBytes + F::kActQuantOffset));
    const __m256i start = F::kLaneOffset != 0 ? scales.lane_start[b * kTile]
                                              : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int r = 0; r < RT; ++r) {
      const __m256i lanes = _mm256_dpbusd_epi32(
          start, F::Unpack(row[r] + offset + F::kQuantOffset), y);
      const __m256 d = _mm512_castps512_ps256(
          _mm512_permutexvar_ps(_mm512_set1_epi32(r * kTile), dd));
      acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[r]);
    }
  }
  alignas(64) float sm[16];
  _mm512_store_ps(sm, summs);
#pragma GCC unroll 4
  for (int r = 0; r < RT; ++r) out[r] = SumLanes(acc[r]) + sm[r * kTile];
}

// The same outputs as OneTokenTile would give token by token (bit for bit),
// for two to eight tokens, with the registers turned around: per group of
// four token slots, one 16-lane register per ggml lane i (eight of them),
// lane p = r * 4 + t holding pair (r, t). Each block then takes, per ggml
// lane, one two-source permute (word i of each row, shared by the G
// groups), and per group one vpdpbusd, one convert and one 16-lane fused
// multiply-add with the 16 scale products as they are, where OneTokenTile
// spends a permute, a vpdpbusd, a convert and an eight-lane multiply-add per
// pair: about a third of the instructions per multiply-add. The final sums
// are the same additions, done for 16 pairs at once.
template <class F, int G>
void TransposedTile(const uint8_t* w, int64_t row_bytes, int64_t nb, int rows,
                    const int* tokens, const ActivationScales* const* scales,
                    float* out, int64_t out_stride) {
  const uint8_t* row[kTile];
  TileRows(w, row_bytes, rows, row);
  __m512 acc[G][8];
  __m512 summs[G];
  for (int g = 0; g < G; ++g) {
    summs[g] = _mm512_setzero_ps();
    for (int i = 0; i < 8; ++i) acc[g][i] = _mm512_setzero_ps();
  }
  // Lane p: word i of row p / 4 in [z01 | z23], for word_of_lane + i.
  const __m512i word_of_lane =
      _mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16, 8, 8, 8, 8, 0, 0, 0, 0);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t offset = b * F::kBlockBytes;
    PrefetchTileAhead(w, row_bytes, b);
    __m512 dw16, mw16;
    WeightScales<F>(row, offset, &dw16, &mw16);
    __m512 d16[G];
    for (int g = 0; g < G; ++g) {
      d16[g] = _mm512_mul_ps(
          dw16, _mm512_broadcast_f32x4(_mm_load_ps(scales[g]->d + b * kTile)));
    }
    if constexpr (F::kHasMin) {
      for (int g = 0; g < G; ++g) {
        summs[g] = _mm512_add_ps(
            summs[g], _mm512_mul_ps(mw16, _mm512_broadcast_f32x4(_mm_load_ps(
                                              scales[g]->s + b * kTile))));
      }
    }
    const __m512i z01 = _mm512_inserti64x4(
        _mm512_castsi256_si512(F::Unpack(row[0] + offset + F::kQuantOffset)),
        F::Unpack(row[1] + offset + F::kQuantOffset), 1);
    const __m512i z23 = _mm512_inserti64x4(
        _mm512_castsi256_si512(F::Unpack(row[2] + offset + F::kQuantOffset)),
        F::Unpack(row[3] + offset + F::kQuantOffset), 1);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i wi = _mm512_permutex2var_epi32(
          z01, _mm512_add_epi32(word_of_lane, _mm512_set1_epi32(i)), z23);
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) {
        const __m512i yi = _mm512_broadcast_i32x4(
            _mm_load_si128(reinterpret_cast<const __m128i*>(
                scales[g]->y_by_lane + b * 128 + i * 16)));
        const __m512i si =
            F::kLaneOffset != 0
                ? _mm512_broadcast_i32x4(
                      _mm_load_si128(reinterpret_cast<const __m128i*>(
                          scales[g]->start_by_lane + b * 128 + i * 16)))
                : _mm512_setzero_si512();
        acc[g][i] = _mm512_fmadd_ps(
            d16[g], _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(si, wi, yi)),
            acc[g][i]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    alignas(64) float sums[16];
    _mm512_store_ps(sums, SumLanes16(acc[g], summs[g]));
    float* group_out = out + g * kTile * out_stride;
    for (int r = 0; r < rows; ++r) {
      for (int t = 0; t < tokens[g]; ++t) {
        group_out[t * out_stride + r] = sums[r * kTile + t];
      }
    }
  }
}

template <class F>
using OneTokenTileFn = void (*)(const uint8_t*, int64_t, int64_t,
                                const uint8_t*, const ActivationScales&,
                                float*);

template <class F>
OneTokenTileFn<F> OneTokenTileFor(int rows) {
  switch (rows) {
    case 1:
      return OneTokenTile<F, 1>;
    case 2:
      return OneTokenTile<F, 2>;
    case 3:
      return OneTokenTile<F, 3>;
    default:
      return OneTokenTile<F, 4>;
  }
}

template <class F>
bool Run(const uint8_t* w, int64_t n, int64_t row_begin, int64_t row_end,
         const uint8_t* act, int n_tokens, float* out, int64_t out_stride) {
  const int64_t nb = n / 32;
  if (n <= 0 || n % 32 != 0 || nb > kMaxAvx512Blocks) return false;
  const int64_t row_bytes = nb * F::kBlockBytes;
  const int64_t act_row_bytes = nb * F::kActBytes;
  int64_t chunk_rows = kChunkBytes / row_bytes / kTile * kTile;
  if (chunk_rows < kTile) chunk_rows = kTile;
  // Two groups of four token slots, about 210 KB each, on the stack: the
  // engine calls this from threads of its own (default 8 MiB stacks).
  ActivationScales first, second;
  const ActivationScales* const groups[2] = {&first, &second};
  constexpr int kGroupTokens = 2 * kTile;
  for (int64_t c0 = row_begin; c0 < row_end; c0 += chunk_rows) {
    const int64_t c1 = c0 + chunk_rows < row_end ? c0 + chunk_rows : row_end;
    for (int t0 = 0; t0 < n_tokens; t0 += kGroupTokens) {
      const int count =
          n_tokens - t0 < kGroupTokens ? n_tokens - t0 : kGroupTokens;
      const int tokens[2] = {count < kTile ? count : kTile,
                             count > kTile ? count - kTile : 0};
      const uint8_t* act_group = act + t0 * act_row_bytes;
      const bool transposed = count >= 2;
      PrepareActivations<F>(act_group, act_row_bytes, nb, tokens[0], transposed,
                            &first);
      if (tokens[1] > 0) {
        PrepareActivations<F>(act_group + kTile * act_row_bytes, act_row_bytes,
                              nb, tokens[1], transposed, &second);
      }
      for (int64_t r0 = c0; r0 < c1; r0 += kTile) {
        const int rows = c1 - r0 < kTile ? static_cast<int>(c1 - r0) : kTile;
        float* tile_out = out + t0 * out_stride + r0;
        if (tokens[1] > 0) {
          TransposedTile<F, 2>(w + r0 * row_bytes, row_bytes, nb, rows, tokens,
                               groups, tile_out, out_stride);
        } else if (transposed) {
          TransposedTile<F, 1>(w + r0 * row_bytes, row_bytes, nb, rows, tokens,
                               groups, tile_out, out_stride);
        } else {
          OneTokenTileFor<F>(rows)(w + r0 * row_bytes, row_bytes, nb, act_group,
                                   first, tile_out);
        }
      }
    }
  }
  return true;
}

// Bytes per packed group-block: the header vector and the quant vectors.
template <class F>
constexpr int PackedBlockBytes() {
  return 64 * (1 + (F::kLaneOffset == 128 ? 8 : 4));
}

// Calls lane(i, w) for each ggml lane i of a packed group-block, w holding
// the 16 rows' quant word i as unsigned bytes (Q4: nibbles unpacked; Q8_0:
// offset by 128).
template <class F, class Lane>
inline void ForEachPackedLane(const uint8_t* block, Lane& lane) {
  if constexpr (F::kLaneOffset != 128) {  // Q4_0 / Q4_1
    const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512i q = _mm512_loadu_si512(block + 64 + 64 * i);
      lane(i, _mm512_and_si512(q, low4));
      lane(i + 4, _mm512_and_si512(_mm512_srli_epi16(q, 4), low4));
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      lane(i, _mm512_xor_si512(_mm512_loadu_si512(block + 64 + 64 * i),
                               _mm512_set1_epi8(static_cast<char>(0x80))));
    }
  }
}

// The sums of activations 4i..4i+3 of block b (i < 8): one vpdpbusd with
// a vector of ones.
template <class F>
inline __m256i ActivationLaneSums(const uint8_t* act, int64_t b) {
  const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
      act + b * F::kActBytes + F::kActQuantOffset));
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), y);
}

// -kLaneOffset * (sum of activations 4i..4i+3) for ggml lane i of every
// block of one activation row (`starts[b * 8 + i]`), as OneTokenTile's lane
// starts: the same for every group of rows. One vpdpbusd with a vector of
// ones per block: prefill prepares each token's starts once per L2 chunk of
// rows, and as a scalar loop (32 loads and adds per block) this cost Q8_0
// prefill as much as the products it prepares for on 8192-wide rows.
template <class F>
void LaneStarts(const uint8_t* act, int64_t nb, int32_t* starts) {
  for (int64_t b = 0; b < nb; ++b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(starts + b * 8),
                        _mm256_mullo_epi32(ActivationLaneSums<F>(act, b),
                                           _mm256_set1_epi32(-F::kLaneOffset)));
  }
}

// -kLaneOffset * (sum of the block's 32 activations) for every block of one
// activation row: the block-sum kernels' integer starts. Eight blocks at a
// time, their lane sums added across in one tree (two rounds of
// horizontal adds and one of halves) instead of a full reduction per block:
// prefill prepares each pass's tokens once per L2 chunk, every 16 rows of
// an 8192-wide matrix, and there the reductions took 4.5 % of a 512-token
// prefill of the 1B shape's Q8_0 (about an eighth of its products' time).
// Integer sums: the same values in any order.
template <class F>
void BlockStarts(const uint8_t* act, int64_t nb, int32_t* starts) {
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i v[8];
    for (int k = 0; k < 8; ++k) v[k] = ActivationLaneSums<F>(act, b + k);
    // Per 128-bit half, each round adds neighbouring lanes: after two, half
    // h of q0123 holds blocks 0..3's sums of lanes 4h..4h+3.
    const __m256i q0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                            _mm256_hadd_epi32(v[2], v[3]));
    const __m256i q4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),
                                            _mm256_hadd_epi32(v[6], v[7]));
    const __m256i sums =
        _mm256_add_epi32(_mm256_permute2x128_si256(q0123, q4567, 0x20),
                         _mm256_permute2x128_si256(q0123, q4567, 0x31));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(starts + b),
        _mm256_mullo_epi32(sums, _mm256_set1_epi32(-F::kLaneOffset)));
  }
  for (; b < nb; ++b) {
    starts[b] = -F::kLaneOffset *
                _mm512_reduce_add_epi32(
                    _mm512_zextsi256_si512(ActivationLaneSums<F>(act, b)));
  }
}

// Streaming the packed groups (decode, a batch's first pass over a group):
// the block four ahead, as far as the hardware prefetcher is behind.
// Always inlined, as PrefetchIntoL2 below: GCC 12 finds a function
// that only prefetches free of side effects and deletes its calls unless it
// was inlined first.
template <class F>
[[gnu::always_inline]] inline void PrefetchFourBlocksAhead(
    const uint8_t* block) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  for (int line = 0; line < kBlockBytes / 64; ++line) {
    _mm_prefetch(
        reinterpret_cast<const char*>(block + 4 * kBlockBytes + 64 * line),
        _MM_HINT_T0);
  }
}

// A batch's first pass over a group computes while it streams: besides the
// block four ahead (into L1), the block kL2AheadBlocks ahead goes into L2.
// Without it the pass added its arithmetic to the time of the memory reads
// instead of hiding it: on a 42 MB matrix, one core, 4 tokens took the time
// of 1 token plus that of 4 tokens from cache (Q8_0 block sums: 4.95 ms =
// 3.43 + 1.53), and with it 3.2-3.7 ms. Decode's one-token kernels keep
// the four-ahead prefetch alone: with this one too, single-stream decode of
// the 1B shape's Q8_0 ran about 8 % slower.
inline constexpr int kL2AheadBlocks = 32;

template <class F>
[[gnu::always_inline]] inline void PrefetchIntoL2(const uint8_t* block) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  for (int line = 0; line < kBlockBytes / 64; ++line) {
    _mm_prefetch(reinterpret_cast<const char*>(
                     block + kL2AheadBlocks * kBlockBytes + 64 * line),
                 _MM_HINT_T1);
  }
}

// The passes after a group's first (MatMulPackedFewTokens with more tokens
// than one pass takes) bring the next group into L2 as they compute, each
// pass a share of its blocks, so that the next group's first pass computes
// from L2 instead of waiting on memory while its arithmetic stands idle.
// That wait is largest where a pass's arithmetic is short against its
// reads: ggml's order (two tokens a pass) on Q8_0 (34 bytes per 32
// weights). There, on the 1B shape, one thread, batch 8 went from 70-72 to
// 89-93 tokens/s and batch 16 from 81-82 to 92-95, two threads' batch 32
// from 159-174 to 176-180; Q4_1 and block sums' eight-token passes, whose
// streaming pass computes about as long as it reads, gained 0-3 %.
// `group` null: nothing to bring.
struct NextGroupShare {
  const uint8_t* group = nullptr;
  int64_t phase = 0;  // this pass brings blocks b with b % stride == phase
  int64_t stride = 1;
};

template <class F>
[[gnu::always_inline]] inline void PrefetchNextGroupBlock(
    const NextGroupShare& next, int64_t b) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  if (next.group == nullptr || b % next.stride != next.phase) return;
  for (int line = 0; line < kBlockBytes / 64; ++line) {
    _mm_prefetch(
        reinterpret_cast<const char*>(next.group + b * kBlockBytes + 64 * line),
        _MM_HINT_T1);
  }
}

template <class F>
void MatVecPackedRows(const uint8_t* packed, int64_t nb, int64_t row_begin,
                      int64_t row_end, const uint8_t* act, float* out) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  int32_t starts[F::kLaneOffset != 0 ? kMaxAvx512Blocks * 8 : 1];
  if constexpr (F::kLaneOffset != 0) LaneStarts<F>(act, nb, starts);
  for (int64_t g0 = row_begin; g0 < row_end; g0 += kPackRows) {
    const uint8_t* group = packed + g0 / kPackRows * nb * kBlockBytes;
    __m512 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
    __m512 summs = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = group + b * kBlockBytes;
      const uint8_t* ab = act + b * F::kActBytes;
      PrefetchFourBlocksAhead<F>(block);
      const __m512i headers = _mm512_loadu_si512(block);
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(headers));
      const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(LoadHalf(ab)));
      if constexpr (F::kHasMin) {
        const __m512 mw = _mm512_cvtph_ps(
            _mm512_cvtepi32_epi16(_mm512_srli_epi32(headers, 16)));
        summs = _mm512_add_ps(
            summs, _mm512_mul_ps(mw, _mm512_set1_ps(LoadHalf(ab + 2))));
      }
      const uint8_t* y = ab + F::kActQuantOffset;
      // ggml lane i of every row: elements 4i..4i+3.
      auto lane = [&](int i, __m512i w) {
        __m512i start = _mm512_setzero_si512();
        if constexpr (F::kLaneOffset != 0) {
          start = _mm512_set1_epi32(starts[b * 8 + i]);
        }
        const __m512i yi =
            _mm512_set1_epi32(static_cast<int>(LoadU32(y + 4 * i)));
        acc[i] = _mm512_fmadd_ps(
            d, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w, yi)), acc[i]);
      };
      ForEachPackedLane<F>(block, lane);
    }
    const __m512 sums = SumLanes16(acc, summs);
    const int64_t count = row_end - g0 < kPackRows ? row_end - g0 : kPackRows;
    _mm512_mask_storeu_ps(out + g0, static_cast<__mmask16>((1u << count) - 1),
                          sums);
  }
}

// Per token of a multi-token product on packed weights in ggml's order:
// the activation row's block scales as floats and, where the format needs
// them, its lane starts (as MatVecPackedRows computes them), so that the
// group loop below broadcasts each from memory instead of converting it
// once per group.
template <class F>
struct PackedTokenScales {
  const uint8_t* row;  // the token's activation row
  float d[kMaxAvx512Blocks];
  float s[F::kHasMin ? kMaxAvx512Blocks : 1];
  int32_t starts[F::kLaneOffset != 0 ? kMaxAvx512Blocks * 8 : 1];
};

template <class F>
void PreparePackedToken(const uint8_t* act, int64_t nb,
                        PackedTokenScales<F>* out) {
  out->row = act;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ab = act + b * F::kActBytes;
    out->d[b] = LoadHalf(ab);
    if constexpr (F::kHasMin) out->s[b] = LoadHalf(ab + 2);
  }
  if constexpr (F::kLaneOffset != 0) LaneStarts<F>(act, nb, out->starts);
}

// One pass of up to kPassTokens<true> tokens in the block-sum arithmetic,
// block-major: per block, every token's 32 activation quants, then its
// scale, (Q4_1) sum scale and block start (-kLaneOffset x the sum of the
// block's activations, where its integer sum starts), side by side. The
// kernel walks the blocks with one pointer per array and a constant offset
// per token. Per-token arrays (PackedTokenScales and the activation rows)
// took a pointer per token and array, 24 for eight tokens: more than the
// general registers, so the kernel spilled them and reloaded them every
// block, and 24 streams for the prefetchers.
template <class F>
struct BlockSumsPass {
  static constexpr int kSlots = 8;
  alignas(64) uint8_t y[kMaxAvx512Blocks][kSlots][32];
  alignas(64) float d[kMaxAvx512Blocks][kSlots];
  alignas(64) float s[F::kHasMin ? kMaxAvx512Blocks : 1][kSlots];
  alignas(64) int32_t
      block_starts[F::kLaneOffset != 0 ? kMaxAvx512Blocks : 1][kSlots];
};

// Fills pass slots 0..n-1 from n activation rows act_row_bytes apart.
template <class F>
void PrepareBlockSumsPass(const uint8_t* act, int64_t act_row_bytes, int n,
                          int64_t nb, BlockSumsPass<F>* out) {
  for (int t = 0; t < n; ++t) {
    const uint8_t* row = act + t * act_row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* ab = row + b * F::kActBytes;
      std::memcpy(out->y[b][t], ab + F::kActQuantOffset, 32);
      out->d[b][t] = LoadHalf(ab);
      if constexpr (F::kHasMin) out->s[b][t] = LoadHalf(ab + 2);
    }
    if constexpr (F::kLaneOffset != 0) {
      int32_t starts[kMaxAvx512Blocks];
      BlockStarts<F>(row, nb, starts);
      for (int64_t b = 0; b < nb; ++b) out->block_starts[b][t] = starts[b];
    }
  }
}

// A zero register for vpdpbusd to accumulate into, as a zeroing idiom of its
// own: the renamer executes that for free, where GCC would otherwise copy one
// shared zero register before every vpdpbusd (a move per product).
inline __m512i FreshZero() {
  __m512i z;
  asm volatile("vpxord %0, %0, %0" : "=v"(z));
  return z;
}

// The block headers of a chunk of packed groups as floats, 16 rows' d and
// then (Q4_1) 16 rows' m per group-block, converted once per chunk (by the
// pass that streams it) instead of once per pass of tokens.
// kMaxChunkGroupBlocks covers kChunkBytes of the smallest packed blocks
// (320 bytes).
inline constexpr int64_t kMaxChunkGroupBlocks = kChunkBytes / 320 + 1;
// A chunk is one group when a group exceeds kChunkBytes.
static_assert(kMaxChunkGroupBlocks >= kMaxAvx512Blocks);

template <class F>
constexpr int HeaderFloats() {
  return F::kHasMin ? 32 : 16;
}

// One group-block's headers into out (HeaderFloats<F>() floats).
template <class F>
void ConvertHeaders(const uint8_t* block, float* out) {
  const __m512i headers = _mm512_loadu_si512(block);
  _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(headers)));
  if constexpr (F::kHasMin) {
    _mm512_storeu_ps(
        out + 16,
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(headers, 16))));
  }
}

// A streaming pass's work per block (kStream below): prefetch ahead (into
// L1 as MatVecPackedRows does, and further ahead into L2), and convert this
// block's headers into hf for the passes after it.
template <class F>
inline void StreamBlock(const uint8_t* block, float* hf) {
  PrefetchFourBlocksAhead<F>(block);
  PrefetchIntoL2<F>(block);
  ConvertHeaders<F>(block, hf);
}

// One packed group of 16 rows against T tokens: MatVecPackedRows'
// arithmetic token by token (bit for bit its results), with each block's
// weights unpacked once for all T tokens. T is 2 for prefill and batched
// decode: 16 accumulators then fill half the registers, and a third token
// would spill them. out[t]: the group's 16 outputs for token t;
// header_floats: the group's headers as ConvertHeaders writes them.
//
// kStream (the first pass over a group that is not yet in cache): the
// headers are converted from the block as it arrives and written to
// header_floats for the passes after it, and the blocks four ahead are
// prefetched as MatVecPackedRows does, so that the pass streams memory at
// decode's pace instead of waiting on every block.
template <class F, int T, bool kStream = false>
void PackedGroupTokens(const uint8_t* group, float* header_floats, int64_t nb,
                       const PackedTokenScales<F>* const scales[],
                       float* const out[], __mmask16 store_mask,
                       const NextGroupShare& next) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  __m512 acc[T][8];
  __m512 summs[T];
  for (int t = 0; t < T; ++t) {
    summs[t] = _mm512_setzero_ps();
    for (int i = 0; i < 8; ++i) acc[t][i] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = group + b * kBlockBytes;
    float* hf = header_floats + b * HeaderFloats<F>();
    if constexpr (kStream) {
      StreamBlock<F>(block, hf);
    } else {
      PrefetchNextGroupBlock<F>(next, b);
    }
    const __m512 dw = _mm512_loadu_ps(hf);
    __m512 d[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      d[t] = _mm512_mul_ps(dw, _mm512_set1_ps(scales[t]->d[b]));
    }
    if constexpr (F::kHasMin) {
      const __m512 mw = _mm512_loadu_ps(hf + 16);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        summs[t] = _mm512_add_ps(
            summs[t], _mm512_mul_ps(mw, _mm512_set1_ps(scales[t]->s[b])));
      }
    }
    // ggml lane i of every row (elements 4i..4i+3) for every token.
    auto lane = [&](int i, __m512i w) {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        __m512i start;
        if constexpr (F::kLaneOffset != 0) {
          start = _mm512_set1_epi32(scales[t]->starts[b * 8 + i]);
        } else {
          start = FreshZero();
        }
        const __m512i yi = _mm512_set1_epi32(static_cast<int>(LoadU32(
            scales[t]->row + b * F::kActBytes + F::kActQuantOffset + 4 * i)));
        acc[t][i] = _mm512_fmadd_ps(
            d[t], _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w, yi)),
            acc[t][i]);
      }
    };
    ForEachPackedLane<F>(block, lane);
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(out[t], store_mask, SumLanes16(acc[t], summs[t]));
  }
}

// The block-sum arithmetic (PackedArithmetic::kBlockSums, kernels/matmul.h)
// on one packed group of 16 rows against T tokens: per (row, token) and
// block b in order,
//   sum  = the exact integer sum of the block's 32 products
//   acc  = fma(d_w * d_x, float(sum), acc)
//   mins = fma(m_w, s_x, mins)                                (Q4_1 only)
// and out = acc + mins. A block's eight ggml lanes add up in integers, then
// take one conversion and one multiply-add for 16 rows where ggml's order
// takes eight of each: with the accumulators down from eight registers per
// token to one, each unpacked block serves up to eight tokens instead of
// two. Up to four tokens, a token's lanes add up in two registers (even and
// odd lanes, so that each dependency chain is four vpdpbusd long) and the
// mins go along; past four, in one (the tokens' chains are independent
// enough) and the mins in a loop of their own after the products (their
// registers would spill). Integer sums are exact and the mins are their own
// chain in block order either way, so the results do not depend on T.
// Arguments as PackedGroupTokens', but the tokens' activations come as
// one BlockSumsPass (slots 0..T-1).
template <class F, int T, bool kStream = false>
void PackedGroupBlockSums(const uint8_t* group, float* header_floats,
                          int64_t nb, const BlockSumsPass<F>* pass,
                          float* const out[], __mmask16 store_mask,
                          const NextGroupShare& next) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  constexpr int kChains = T > 4 ? 1 : 2;
  constexpr bool kMinsAfter = T > 4;
  __m512 acc[T];
  __m512 mins[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm512_setzero_ps();
    mins[t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = group + b * kBlockBytes;
    float* hf = header_floats + b * HeaderFloats<F>();
    if constexpr (kStream) {
      StreamBlock<F>(block, hf);
    } else {
      PrefetchNextGroupBlock<F>(next, b);
    }
    __m512i sums[kChains][T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      if constexpr (F::kLaneOffset != 0) {
        sums[0][t] = _mm512_set1_epi32(pass->block_starts[b][t]);
      } else {
        sums[0][t] = FreshZero();
      }
      if constexpr (kChains == 2) sums[1][t] = FreshZero();
    }
    auto lane = [&](int i, __m512i w) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512i yi =
            _mm512_set1_epi32(static_cast<int>(LoadU32(pass->y[b][t] + 4 * i)));
        sums[i % kChains][t] = _mm512_dpbusd_epi32(sums[i % kChains][t], w, yi);
      }
    };
    ForEachPackedLane<F>(block, lane);
    const __m512 dw = _mm512_loadu_ps(hf);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(pass->d[b][t]));
      __m512i sum = sums[0][t];
      if constexpr (kChains == 2) sum = _mm512_add_epi32(sum, sums[1][t]);
      acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[t]);
      if constexpr (F::kHasMin && !kMinsAfter) {
        mins[t] = _mm512_fmadd_ps(_mm512_loadu_ps(hf + 16),
                                  _mm512_set1_ps(pass->s[b][t]), mins[t]);
      }
    }
  }
  if constexpr (F::kHasMin && kMinsAfter) {
    for (int64_t b = 0; b < nb; ++b) {
      const __m512 mw =
          _mm512_loadu_ps(header_floats + b * HeaderFloats<F>() + 16);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        mins[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(pass->s[b][t]), mins[t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(out[t], store_mask,
                          F::kHasMin ? _mm512_add_ps(acc[t], mins[t]) : acc[t]);
  }
}

// Tokens one pass over a packed group takes: ggml's order keeps eight
// accumulators per token (two tokens fill half the registers), block sums
// one.
template <bool kBlockSums>
inline constexpr int kPassTokens = kBlockSums ? 8 : 2;

// A pass's tokens' activations as the arithmetic's kernels take them:
// block sums one BlockSumsPass, ggml's order each token's scales.
template <class F, bool kBlockSums>
using PassActivations = std::conditional_t<kBlockSums, const BlockSumsPass<F>*,
                                           const PackedTokenScales<F>* const*>;

// One pass of n (1..kPassTokens) tokens over a packed group, in the
// arithmetic kBlockSums names.
template <class F, bool kBlockSums, bool kStream = false>
void GroupPass(int n, const uint8_t* group, float* header_floats, int64_t nb,
               PassActivations<F, kBlockSums> tokens, float* const out[],
               __mmask16 mask, const NextGroupShare& next = {}) {
  if constexpr (kBlockSums) {
    switch (n) {
#define PD_BLOCK_SUMS_CASE(T)                                            \
  case T:                                                                \
    return PackedGroupBlockSums<F, T, kStream>(group, header_floats, nb, \
                                               tokens, out, mask, next);
      PD_BLOCK_SUMS_CASE(1)
      PD_BLOCK_SUMS_CASE(2)
      PD_BLOCK_SUMS_CASE(3)
      PD_BLOCK_SUMS_CASE(4)
      PD_BLOCK_SUMS_CASE(5)
      PD_BLOCK_SUMS_CASE(6)
      PD_BLOCK_SUMS_CASE(7)
#undef PD_BLOCK_SUMS_CASE
      default:
        return PackedGroupBlockSums<F, 8, kStream>(group, header_floats, nb,
                                                   tokens, out, mask, next);
    }
  } else if (n == 2) {
    PackedGroupTokens<F, 2, kStream>(group, header_floats, nb, tokens, out,
                                     mask, next);
  } else {
    PackedGroupTokens<F, 1, kStream>(group, header_floats, nb, tokens, out,
                                     mask, next);
  }
}

// Decode's matrix-vector product in block sums: PackedGroupBlockSums'
// arithmetic for one token (bit for bit its results) in MatVecPackedRows'
// shape, the headers converted in registers and the block's lanes added in
// four chains. Through the group kernel (headers written out for passes
// that one token never makes, two chains) decode of 2048- and 8192-wide
// rows ran about 10 % slower than in ggml's order.
template <class F>
void MatVecPackedBlockSums(const uint8_t* packed, int64_t nb, int64_t row_begin,
                           int64_t row_end, const uint8_t* act, float* out) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  int32_t starts[F::kLaneOffset != 0 ? kMaxAvx512Blocks : 1];
  if constexpr (F::kLaneOffset != 0) BlockStarts<F>(act, nb, starts);
  for (int64_t g0 = row_begin; g0 < row_end; g0 += kPackRows) {
    const uint8_t* group = packed + g0 / kPackRows * nb * kBlockBytes;
    __m512 acc = _mm512_setzero_ps();
    __m512 mins = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = group + b * kBlockBytes;
      const uint8_t* ab = act + b * F::kActBytes;
      PrefetchFourBlocksAhead<F>(block);
      const __m512i headers = _mm512_loadu_si512(block);
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(headers));
      if constexpr (F::kHasMin) {
        const __m512 mw = _mm512_cvtph_ps(
            _mm512_cvtepi32_epi16(_mm512_srli_epi32(headers, 16)));
        mins = _mm512_fmadd_ps(mw, _mm512_set1_ps(LoadHalf(ab + 2)), mins);
      }
      __m512i sums[4] = {FreshZero(), FreshZero(), FreshZero(), FreshZero()};
      if constexpr (F::kLaneOffset != 0) {
        sums[0] = _mm512_set1_epi32(starts[b]);
      }
      const uint8_t* y = ab + F::kActQuantOffset;
      auto lane = [&](int i, __m512i w) {
        sums[i % 4] = _mm512_dpbusd_epi32(
            sums[i % 4], w,
            _mm512_set1_epi32(static_cast<int>(LoadU32(y + 4 * i))));
      };
      ForEachPackedLane<F>(block, lane);
      const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(LoadHalf(ab)));
      const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(sums[0], sums[1]),
                                           _mm512_add_epi32(sums[2], sums[3]));
      acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc);
    }
    const int64_t count = row_end - g0 < kPackRows ? row_end - g0 : kPackRows;
    _mm512_mask_storeu_ps(out + g0, static_cast<__mmask16>((1u << count) - 1),
                          F::kHasMin ? _mm512_add_ps(acc, mins) : acc);
  }
}

// The most tokens MatMulPackedFewTokens takes: a batched decode step or a
// speculative verification pass, with every token's scales prepared once per
// product. MatMulPackedRows' chunks, made for prefill, prepared them again
// for every chunk, which for the 8192-wide rows of a 1B model's down
// projection is every 16 rows: batch 32 of its Q8_0, one thread, block sums,
// ran 136 tokens/s that way where batch 16 ran 157.
inline constexpr int kMaxFewTokens = 64;

// This thread's buffer of kCount T's: the products' prepared activations
// (Q8_0 in ggml's order: up to 20 KB per token; in block sums up to 160 KB
// per pass of eight tokens). Not on the stack: 1.3 MB there would overflow
// a thread started with a small stack (and ASan's redzones enlarge it
// further). Allocated once per thread and type; only what the products
// prepare is ever touched.
template <class T, int kCount>
T* ThreadBuffer() {
  thread_local const std::unique_ptr<T[]> buffer(new T[kCount]);
  return buffer.get();
}

// The activations of up to kMaxFewTokens tokens of one product, prepared
// once in the form the arithmetic's kernels take (PassActivations): Pass(t0)
// for the pass of tokens t0.. (t0 a multiple of kPassTokens). In this
// thread's buffer, which MatMulPackedFewTokens and MatMulPackedRows share
// (neither calls the other).
template <class F, bool kBlockSums>
class PreparedTokens;

template <class F>
class PreparedTokens<F, true> {
 public:
  void Prepare(const uint8_t* act, int64_t act_row_bytes, int n_tokens,
               int64_t nb) {
    for (int t0 = 0; t0 < n_tokens; t0 += kPass) {
      const int n = n_tokens - t0 < kPass ? n_tokens - t0 : kPass;
      PrepareBlockSumsPass<F>(act + t0 * act_row_bytes, act_row_bytes, n, nb,
                              &passes_[t0 / kPass]);
    }
  }
  PassActivations<F, true> Pass(int t0) const { return &passes_[t0 / kPass]; }

 private:
  static constexpr int kPass = kPassTokens<true>;
  BlockSumsPass<F>* const passes_ =
      ThreadBuffer<BlockSumsPass<F>, kMaxFewTokens / kPass>();
};

template <class F>
class PreparedTokens<F, false> {
 public:
  void Prepare(const uint8_t* act, int64_t act_row_bytes, int n_tokens,
               int64_t nb) {
    for (int t = 0; t < n_tokens; ++t) {
      PreparePackedToken<F>(act + t * act_row_bytes, nb, &scales_[t]);
      pointers_[t] = &scales_[t];
    }
  }
  PassActivations<F, false> Pass(int t0) const { return pointers_ + t0; }

 private:
  PackedTokenScales<F>* const scales_ =
      ThreadBuffer<PackedTokenScales<F>, kMaxFewTokens>();
  const PackedTokenScales<F>* pointers_[kMaxFewTokens];
};

// MatMulPacked for 2..kMaxFewTokens tokens: groups outer, tokens inner.
// Each group (16 rows, nb packed blocks: 6 KB for the default model's
// 576-wide Q4_1 rows, 147 KB for 8192-wide Q8_0 ones) is streamed from
// memory once by the first pass of tokens (kPassTokens: two in ggml's order,
// eight in block sums; prefetching ahead, converting headers as they arrive,
// as decode's MatVecPackedRows streams) and stays in L1 or L2 while the
// other passes go over it, bringing the next group into L2
// (NextGroupShare); the tokens' scales are prepared once per product.
// The chunked order of MatMulPackedRows, made for prefill's hundreds of
// tokens, prepares every pass's scales once per chunk (and, before it
// streamed its first pass, waited on memory: a profile of a two-token pass
// showed half the product's time there). Same arithmetic per (row, token):
// bit for bit PackedGroupTokens' (or PackedGroupBlockSums') results.
template <class F, bool kBlockSums>
void MatMulPackedFewTokens(const uint8_t* packed, int64_t nb, int64_t row_begin,
                           int64_t row_end, const uint8_t* act, int n_tokens,
                           float* out, int64_t out_stride) {
  constexpr int64_t kBlockBytes = PackedBlockBytes<F>();
  constexpr int kPass = kPassTokens<kBlockSums>;
  const int64_t group_bytes = nb * kBlockBytes;
  PreparedTokens<F, kBlockSums> tokens;
  tokens.Prepare(act, nb * F::kActBytes, n_tokens, nb);
  alignas(64) float header_floats[kMaxAvx512Blocks * HeaderFloats<F>()];
  float* outs[kMaxFewTokens];
  for (int64_t g0 = row_begin; g0 < row_end; g0 += kPackRows) {
    const uint8_t* group = packed + g0 / kPackRows * group_bytes;
    const int64_t count = row_end - g0 < kPackRows ? row_end - g0 : kPackRows;
    const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
    for (int t = 0; t < n_tokens; ++t) outs[t] = out + t * out_stride + g0;
    const int later_passes = (n_tokens - 1) / kPass;
    NextGroupShare next;
    if (g0 + kPackRows < row_end && later_passes > 0) {
      next.group = group + group_bytes;
      next.stride = later_passes;
    }
    for (int t0 = 0; t0 < n_tokens; t0 += kPass) {
      const int n = n_tokens - t0 < kPass ? n_tokens - t0 : kPass;
      if (t0 == 0) {  // the pass that streams the group and its headers
        GroupPass<F, kBlockSums, true>(n, group, header_floats, nb,
                                       tokens.Pass(t0), outs + t0, mask);
      } else {
        next.phase = t0 / kPass - 1;
        GroupPass<F, kBlockSums>(n, group, header_floats, nb, tokens.Pass(t0),
                                 outs + t0, mask, next);
      }
    }
  }
}

// MatMulPacked for two or more tokens: rows in chunks of about kChunkBytes
// of packed weights, so that a chunk stays in L2 while every pass of
// kPassTokens tokens goes over it. The first pass streams the chunk from
// memory as MatMulPackedFewTokens' first pass streams a group (prefetching
// ahead, converting the headers as they arrive); a separate header pass
// over the chunk before it waited on memory and left the first pass to the
// hardware prefetcher: batch 32 of the 1B shape's Q8_0 on two threads,
// block sums, ran 180-191 tokens/s that way and 210-225 this way.
template <class F, bool kBlockSums>
void MatMulPackedRows(const uint8_t* packed, int64_t nb, int64_t row_begin,
                      int64_t row_end, const uint8_t* act, int n_tokens,
                      float* out, int64_t out_stride) {
  constexpr int64_t kBlockBytes = PackedBlockBytes<F>();
  constexpr int kPass = kPassTokens<kBlockSums>;
  const int64_t group_bytes = nb * kBlockBytes;
  int64_t chunk_rows = kChunkBytes / group_bytes * kPackRows;
  if (chunk_rows < kPackRows) chunk_rows = kPackRows;
  const int64_t act_row_bytes = nb * F::kActBytes;
  PreparedTokens<F, kBlockSums> tokens;
  // A chunk's headers, at most about 105 KB (Q4_1) on the stack: see Run.
  alignas(64) float header_floats[kMaxChunkGroupBlocks * HeaderFloats<F>()];
  float* outs[kPass];
  for (int64_t c0 = row_begin; c0 < row_end; c0 += chunk_rows) {
    const int64_t c1 = c0 + chunk_rows < row_end ? c0 + chunk_rows : row_end;
    for (int t0 = 0; t0 < n_tokens; t0 += kPass) {
      const int n = n_tokens - t0 < kPass ? n_tokens - t0 : kPass;
      tokens.Prepare(act + t0 * act_row_bytes, act_row_bytes, n, nb);
      for (int64_t g0 = c0; g0 < c1; g0 += kPackRows) {
        const uint8_t* group = packed + g0 / kPackRows * group_bytes;
        float* group_headers =
            header_floats + (g0 - c0) / kPackRows * nb * HeaderFloats<F>();
        const int64_t count = c1 - g0 < kPackRows ? c1 - g0 : kPackRows;
        const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
        for (int t = 0; t < n; ++t) outs[t] = out + (t0 + t) * out_stride + g0;
        if (t0 == 0) {  // the pass that streams the chunk and its headers
          GroupPass<F, kBlockSums, true>(n, group, group_headers, nb,
                                         tokens.Pass(0), outs, mask);
        } else {
          GroupPass<F, kBlockSums>(n, group, group_headers, nb, tokens.Pass(0),
                                   outs, mask);
        }
      }
    }
  }
}

template <class F>
void PackRowsOf(const uint8_t* weights, int64_t rows, int64_t nb,
                uint8_t* out) {
  constexpr int kBlockBytes = PackedBlockBytes<F>();
  constexpr int kQuantVectors = kBlockBytes / 64 - 1;
  const int64_t row_bytes = nb * F::kBlockBytes;
  const int64_t groups = (rows + kPackRows - 1) / kPackRows;
  std::memset(out, 0, groups * nb * kBlockBytes);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = out + (g * nb + b) * kBlockBytes;
      for (int k = 0; k < kPackRows && g * kPackRows + k < rows; ++k) {
        const uint8_t* src =
            weights + (g * kPackRows + k) * row_bytes + b * F::kBlockBytes;
        std::memcpy(dst + 4 * k, src, F::kHasMin ? 4 : 2);  // d (and m)
        for (int i = 0; i < kQuantVectors; ++i) {
          std::memcpy(dst + 64 + 64 * i + 4 * k, src + F::kQuantOffset + 4 * i,
                      4);
        }
      }
    }
  }
}

}  // namespace

int64_t PackedBytes(GgmlType type, int64_t rows, int64_t cols) {
  const int64_t group_blocks = (rows + kPackRows - 1) / kPackRows * (cols / 32);
  switch (type) {
    case GgmlType::kQ4_0:
      return group_blocks * PackedBlockBytes<Q4_0Format>();
    case GgmlType::kQ4_1:
      return group_blocks * PackedBlockBytes<Q4_1Format>();
    case GgmlType::kQ8_0:
      return group_blocks * PackedBlockBytes<Q8_0Format>();
    default:
      return 0;
  }
}

bool PackRows(GgmlType type, const uint8_t* weights, int64_t rows, int64_t cols,
              uint8_t* out) {
  switch (type) {
    case GgmlType::kQ4_0:
      PackRowsOf<Q4_0Format>(weights, rows, cols / 32, out);
      return true;
    case GgmlType::kQ4_1:
      PackRowsOf<Q4_1Format>(weights, rows, cols / 32, out);
      return true;
    case GgmlType::kQ8_0:
      PackRowsOf<Q8_0Format>(weights, rows, cols / 32, out);
      return true;
    default:
      return false;
  }
}

// Products of more than kMaxFewTokens tokens (prefill) take
// MatMulPackedRows' L2 chunks only where a chunk holds at least this many
// groups; wider rows take the few-tokens order kMaxFewTokens tokens at a
// time. A chunk re-prepares every pass's tokens (their scales, block
// starts and, in block sums, quants) once per chunk: every 16 rows for the
// 1B shape's 8192-wide Q8_0 rows, every 112 for its 2048-wide ones, where
// the few-tokens order prepares them once per 64 tokens and streams the
// weights once per 64 tokens instead of once (a small price: a 512-token
// prefill reads the 1B shape's weights eight times in about 2 s). Block
// sums, engine_bench prefill 512, alternating: 1B Q8_0 one thread 127 ->
// 150-152 tokens/s, two threads 246-252 -> 296-298; 1B Q4_1 one thread
// 139-140 -> 143; the default model (576- and 1536-wide rows, 45 and 17
// groups a chunk) 880-906 -> 866-897 in the few-tokens order, so it keeps
// the chunks.
inline constexpr int64_t kMinChunkGroups = 16;

// MatMulPacked for one format and arithmetic.
template <class F, bool kBlockSums>
void PackedProductIn(const uint8_t* packed, int64_t nb, int64_t row_begin,
                     int64_t row_end, const uint8_t* act, int n_tokens,
                     float* out, int64_t out_stride) {
  if (n_tokens == 1) {
    if constexpr (kBlockSums) {
      MatVecPackedBlockSums<F>(packed, nb, row_begin, row_end, act, out);
    } else {
      MatVecPackedRows<F>(packed, nb, row_begin, row_end, act, out);
    }
  } else if (n_tokens <= kMaxFewTokens) {
    MatMulPackedFewTokens<F, kBlockSums>(packed, nb, row_begin, row_end, act,
                                         n_tokens, out, out_stride);
  } else if (kChunkBytes / (nb * PackedBlockBytes<F>()) < kMinChunkGroups) {
    for (int t0 = 0; t0 < n_tokens; t0 += kMaxFewTokens) {
      const int n =
          n_tokens - t0 < kMaxFewTokens ? n_tokens - t0 : kMaxFewTokens;
      MatMulPackedFewTokens<F, kBlockSums>(packed, nb, row_begin, row_end,
                                           act + t0 * nb * F::kActBytes, n,
                                           out + t0 * out_stride, out_stride);
    }
  } else {
    MatMulPackedRows<F, kBlockSums>(packed, nb, row_begin, row_end, act,
                                    n_tokens, out, out_stride);
  }
}

template <class F>
void PackedProduct(bool block_sums, const uint8_t* packed, int64_t nb,
                   int64_t row_begin, int64_t row_end, const uint8_t* act,
                   int n_tokens, float* out, int64_t out_stride) {
  if (block_sums) {
    PackedProductIn<F, true>(packed, nb, row_begin, row_end, act, n_tokens, out,
                             out_stride);
  } else {
    PackedProductIn<F, false>(packed, nb, row_begin, row_end, act, n_tokens,
                              out, out_stride);
  }
}

void MatMulPacked(GgmlType type, bool block_sums, const uint8_t* packed,
                  int64_t cols, int64_t row_begin, int64_t row_end,
                  const uint8_t* activations, int n_tokens, float* out,
                  int64_t out_stride) {
  const int64_t nb = cols / 32;
  switch (type) {
    case GgmlType::kQ4_0:
      PackedProduct<Q4_0Format>(block_sums, packed, nb, row_begin, row_end,
                                activations, n_tokens, out, out_stride);
      return;
    case GgmlType::kQ4_1:
      PackedProduct<Q4_1Format>(block_sums, packed, nb, row_begin, row_end,
                                activations, n_tokens, out, out_stride);
      return;
    case GgmlType::kQ8_0:
      PackedProduct<Q8_0Format>(block_sums, packed, nb, row_begin, row_end,
                                activations, n_tokens, out, out_stride);
      return;
    default:
      return;
  }
}

void QuantizeQ8Avx512(bool with_sum, const float* x, int64_t n, uint8_t* out) {
  const int block_bytes = with_sum ? 36 : 34;
  const int quant_offset = with_sum ? 4 : 2;
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m512 lo = _mm512_loadu_ps(x + 32 * b);
    const __m512 hi = _mm512_loadu_ps(x + 32 * b + 16);
    // Activations are finite (matmul.h), so max is order-independent.
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 scale = _mm512_set1_ps(id);
    // |x * id| <= 127: the conversion (round half to even) is exact as an
    // integer and so is the narrowing.
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, scale));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, scale));
    uint8_t* ob = out + b * block_bytes;
    const uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    std::memcpy(ob, &dh, 2);
    if (with_sum) {
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
      const uint16_t sh =
          _cvtss_sh(static_cast<float>(sum) * d, _MM_FROUND_TO_NEAREST_INT);
      std::memcpy(ob + 2, &sh, 2);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ob + quant_offset),
                     _mm512_cvtepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ob + quant_offset + 16),
                     _mm512_cvtepi32_epi8(qhi));
  }
}

bool MatMulRowsAvx512(GgmlType weight_type, const uint8_t* weights, int64_t n,
                      int64_t row_begin, int64_t row_end,
                      const uint8_t* activations, int n_tokens, float* out,
                      int64_t out_stride) {
  switch (weight_type) {
    case GgmlType::kQ4_0:
      return Run<Q4_0Format>(weights, n, row_begin, row_end, activations,
                             n_tokens, out, out_stride);
    case GgmlType::kQ4_1:
      return Run<Q4_1Format>(weights, n, row_begin, row_end, activations,
                             n_tokens, out, out_stride);
    case GgmlType::kQ8_0:
      return Run<Q8_0Format>(weights, n, row_begin, row_end, activations,
                             n_tokens, out, out_stride);
    default:
      return false;
  }
}

}  // namespace pdserve::kernels::internal
