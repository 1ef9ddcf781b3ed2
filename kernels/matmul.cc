#include "kernels/matmul.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/block_unpack.h"
#include "kernels/ggml_type.h"
#include "kernels/matmul_avx512.h"
#include "kernels/quant.h"

namespace pdserve::kernels {
namespace {

// The block layouts are read with memcpy-based little-endian loads.
static_assert(std::endian::native == std::endian::little,
              "ggml block layouts are little-endian");

// Activation block geometry (ggml's block_q8_0 / block_q8_1 / block_q8_K).
constexpr int kQ8_0Bytes = 34;   // f16 d; int8 qs[32]
constexpr int kQ8_1Bytes = 36;   // f16 d; f16 s; int8 qs[32]
constexpr int kQ8_KBytes = 292;  // f32 d; int8 qs[256]; int16 bsums[16]
constexpr int kQ8_KQs = 4;       // offset of qs in a Q8_K block
constexpr int kQ8_KBsums = 260;  // offset of bsums in a Q8_K block

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

// binary16 -> binary32, with the same results as Fp16ToFp32 (bit for bit,
// NaNs made quiet) but inline. Two variants: HalfToFloat for block scales
// (one instruction with F16C, else integer code whose branches are always
// predicted, since scales are normal numbers), and HalfToFloatLanes for F16
// rows, branch-free (selects by masks) so that the F16 dot product
// vectorizes. Subnormal halves use normal-range arithmetic only:
// (0.5 + m * 2^-24) - 0.5 is exact.
inline float HalfToFloatLanes(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  const uint32_t inf_nan = 0u - static_cast<uint32_t>(em >= 0x7C00u);
  const uint32_t nan = 0u - static_cast<uint32_t>(em > 0x7C00u);
  const uint32_t subnormal = 0u - static_cast<uint32_t>(em < 0x0400u);
  // Rebias the exponent from 15 to 127; inf/NaN (exponent 31) go to 255.
  uint32_t bits = (em << 13) + (112u << 23) + (inf_nan & (112u << 23));
  bits |= nan & 0x00400000u;  // quiet NaN
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(0x3F000000u | em) - 0.5f);
  return std::bit_cast<float>(sign | (bits & ~subnormal) | (sub & subnormal));
}

inline float HalfToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  if (em >= 0x0400u && em < 0x7C00u) {  // normal
    return std::bit_cast<float>(sign | ((em << 13) + (112u << 23)));
  }
  return HalfToFloatLanes(h);
#endif
}
inline float LoadF16(const uint8_t* p) { return HalfToFloat(LoadU16(p)); }

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// ggml_compute_fp32_to_bf16: round to nearest even; NaN stays NaN (quiet).
inline uint16_t FloatToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

// ggml's nearest_int: round half to even through the float adder, valid for
// |v| < 2^22.
inline int NearestInt(float v) {
  const int32_t bits = std::bit_cast<int32_t>(v + 12582912.0f);  // 1.5 * 2^23
  return (bits & 0x007FFFFF) - 0x00400000;
}

// Absolute maximum of 32 floats, as ggml's MAX(amax, fabsf(v)) loop.
inline float AbsMax32(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    amax = amax > a ? amax : a;
  }
  return amax;
}

// ---------------------------------------------------------------------------
// Activation quantization, fp32 -> fp16 / bf16 and the Q8 formats.
//
// Q8_0 and Q8_1 follow what ggml's x86 CPU backend (AVX2 / AVX-512) computes,
// not its portable _ref functions: the reciprocal scale is 127 / amax (not
// 1 / (amax / 127)) and quants round half to even (_mm256_round_ps). The two
// differ in about one block in ten thousand, enough to flip a greedy token
// now and then; the reference we are checked against is llama.cpp on x86.
// Q8_K uses q8_K_ref, which is also what ggml runs on x86.

void QuantizeQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + kQ8_0Bytes * b;
    const float amax = AbsMax32(xb);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    StoreU16(ob, Fp32ToFp16(d));
    int8_t q[32];
    for (int j = 0; j < 32; ++j) {
      q[j] = static_cast<int8_t>(NearestInt(xb[j] * id));
    }
    std::memcpy(ob + 2, q, sizeof(q));
  }
}

void QuantizeQ8_1(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + kQ8_1Bytes * b;
    const float amax = AbsMax32(xb);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int8_t q[32];
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      q[j] = static_cast<int8_t>(NearestInt(xb[j] * id));
      sum += q[j];
    }
    StoreU16(ob, Fp32ToFp16(d));
    // ggml rounds s from the unrounded d.
    StoreU16(ob + 2, Fp32ToFp16(static_cast<float>(sum) * d));
    std::memcpy(ob + 4, q, sizeof(q));
  }
}

void QuantizeQ8_K(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* xb = x + 256 * b;
    uint8_t* ob = out + kQ8_KBytes * b;
    // The element of largest magnitude, the first one on ties, sign kept.
    float max = 0.0f;
    float amax = 0.0f;
    for (int j = 0; j < 256; ++j) {
      const float a = std::fabs(xb[j]);
      if (a > amax) {
        amax = a;
        max = xb[j];
      }
    }
    int8_t q[256];
    int16_t bsums[16];
    float d = 0.0f;
    if (amax == 0.0f) {
      std::memset(q, 0, sizeof(q));
      std::memset(bsums, 0, sizeof(bsums));  // ggml leaves them unset
    } else {
      const float iscale = -127.0f / max;
      for (int j = 0; j < 256; ++j) {
        const int v = NearestInt(iscale * xb[j]);
        q[j] = static_cast<int8_t>(v < 127 ? v : 127);
      }
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += q[16 * g + j];
        bsums[g] = static_cast<int16_t>(sum);
      }
      d = 1.0f / iscale;
    }
    std::memcpy(ob, &d, sizeof(d));
    std::memcpy(ob + kQ8_KQs, q, sizeof(q));
    std::memcpy(ob + kQ8_KBsums, bsums, sizeof(bsums));
  }
}

// ---------------------------------------------------------------------------
// Dot products, one function per weight type: (weight row, activation row,
// n elements) -> float. Each follows ggml's *_generic vec_dot function's
// float operations in order; integer sums are exact, so they are grouped
// however vectorizes best. A SIMD kernel replaces one of these by changing
// its entry in FindKernel.

using DotFn = float (*)(const uint8_t* w, const uint8_t* a, int64_t n);

// Sum of 16 float lanes in a fixed tree order.
inline float SumLanes16(const float* acc) {
  float s8[8];
  for (int k = 0; k < 8; ++k) s8[k] = acc[k] + acc[k + 8];
  return ((s8[0] + s8[4]) + (s8[2] + s8[6])) +
         ((s8[1] + s8[5]) + (s8[3] + s8[7]));
}

float DotF32(const uint8_t* w, const uint8_t* a, int64_t n) {
  float acc[16] = {};
  const int64_t main = n - n % 16;
  for (int64_t i = 0; i < main; i += 16) {
    float wv[16], av[16];
    std::memcpy(wv, w + 4 * i, sizeof(wv));
    std::memcpy(av, a + 4 * i, sizeof(av));
    for (int k = 0; k < 16; ++k) acc[k] += wv[k] * av[k];
  }
  for (int64_t i = main; i < n; ++i) {
    acc[i - main] += LoadF32(w + 4 * i) * LoadF32(a + 4 * i);
  }
  return SumLanes16(acc);
}

template <float (*kDecode)(uint16_t)>
float Dot16Bit(const uint8_t* w, const uint8_t* a, int64_t n) {
  float acc[16] = {};
  const int64_t main = n - n % 16;
  for (int64_t i = 0; i < main; i += 16) {
    uint16_t wv[16], av[16];
    std::memcpy(wv, w + 2 * i, sizeof(wv));
    std::memcpy(av, a + 2 * i, sizeof(av));
    for (int k = 0; k < 16; ++k) acc[k] += kDecode(wv[k]) * kDecode(av[k]);
  }
  for (int64_t i = main; i < n; ++i) {
    acc[i - main] += kDecode(LoadU16(w + 2 * i)) * kDecode(LoadU16(a + 2 * i));
  }
  return SumLanes16(acc);
}

float DotF16(const uint8_t* w, const uint8_t* a, int64_t n) {
  return Dot16Bit<HalfToFloatLanes>(w, a, n);
}
float DotBF16(const uint8_t* w, const uint8_t* a, int64_t n) {
  return Dot16Bit<Bf16ToFloat>(w, a, n);
}

inline const int8_t* AsI8(const uint8_t* p) {
  return reinterpret_cast<const int8_t*>(p);
}

// Sums for the Q4_0 / Q8_0 x Q8_0 and Q4_1 / Q5_1 x Q8_1 products, in the
// order of ggml's x86 kernels (ggml_vec_dot_q4_1_q8_1 etc., AVX2): eight
// float lanes,
// lane i accumulating (d_w * d_x) * (integer sum of elements 4i..4i+3 of each
// block) with a fused multiply-add, reduced at the end as hsum_float_8 does
// ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)), plus the block offsets
// m_w * s_x summed separately (_1 formats). Any other order differs from
// llama.cpp in the last bit of most outputs, and those differences flip fp16 /
// Q8 roundings downstream often enough to change greedy tokens.
struct GgmlLanes {
  float lane[8] = {};
  float summs = 0.0f;
  void Add(float d, const int32_t* sums, float m_s) {
    summs += m_s;
    for (int i = 0; i < 8; ++i) {
      lane[i] = std::fma(d, static_cast<float>(sums[i]), lane[i]);
    }
  }
  float Finish() const {
    const float r0 = lane[0] + lane[4], r1 = lane[1] + lane[5];
    const float r2 = lane[2] + lane[6], r3 = lane[3] + lane[7];
    return ((r0 + r2) + (r1 + r3)) + summs;
  }
};

// Lane sums of (q - offset) * y over one 32-element block, lane i taking
// elements 4i..4i+3 (the integers ggml's x86 kernels convert to float).
// Computed as q * y - offset * y: the same integers, in a form GCC 12
// compiles correctly (with AVX-VNNI / AVX512-VNNI enabled it miscompiles
// the reduction of the direct form).
inline void BlockLaneSums(const uint8_t* q, const int8_t* y, int offset,
                          int32_t* sums) {
  int32_t qy[8] = {}, ys[8] = {};
  for (int j = 0; j < 32; ++j) {
    qy[j / 4] += q[j] * y[j];
    ys[j / 4] += y[j];
  }
  for (int l = 0; l < 8; ++l) sums[l] = qy[l] - offset * ys[l];
}

// Q4_0 x Q8_0 in ggml's order (lanes, as DotQ8_0).
float DotQ4_0(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 18 * b;
    const uint8_t* ab = a + kQ8_0Bytes * b;
    uint8_t q[32];
    internal::UnpackQ4(wb + 2, q);
    int32_t sums[8];
    BlockLaneSums(q, AsI8(ab + 2), 8, sums);
    acc.Add(LoadF16(wb) * LoadF16(ab), sums, 0.0f);
  }
  return acc.Finish();
}

// Q4_1 x Q8_1: sum of (d_w * d_x) * sumi + m_w * s_x, in ggml's order.
float DotQ4_1(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 20 * b;
    const uint8_t* ab = a + kQ8_1Bytes * b;
    uint8_t q[32];
    internal::UnpackQ4(wb + 4, q);
    int32_t sums[8];
    BlockLaneSums(q, AsI8(ab + 4), 0, sums);
    acc.Add(LoadF16(wb) * LoadF16(ab), sums, LoadF16(wb + 2) * LoadF16(ab + 2));
  }
  return acc.Finish();
}

// Q5_0 x Q8_0 in ggml's order (lanes, as DotQ8_0).
float DotQ5_0(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 22 * b;
    const uint8_t* ab = a + kQ8_0Bytes * b;
    uint8_t q[32];
    internal::UnpackQ5(LoadU32(wb + 2), wb + 6, q);
    int32_t sums[8];
    BlockLaneSums(q, AsI8(ab + 2), 16, sums);
    acc.Add(LoadF16(wb) * LoadF16(ab), sums, 0.0f);
  }
  return acc.Finish();
}

// Q5_1 x Q8_1: sum of (d_w * d_x) * sumi + m_w * s_x, in ggml's order.
float DotQ5_1(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 24 * b;
    const uint8_t* ab = a + kQ8_1Bytes * b;
    uint8_t q[32];
    internal::UnpackQ5(LoadU32(wb + 4), wb + 8, q);
    int32_t sums[8];
    BlockLaneSums(q, AsI8(ab + 4), 0, sums);
    acc.Add(LoadF16(wb) * LoadF16(ab), sums, LoadF16(wb + 2) * LoadF16(ab + 2));
  }
  return acc.Finish();
}

// Q8_0 x Q8_0 in ggml's order (its AVX2 kernel): eight float lanes, lane i
// taking (d_w * d_x) * (sum of products 4i..4i+3) by FMA, block after
// block, added up as in GgmlLanes.
float DotQ8_0(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 34 * b;
    const uint8_t* ab = a + kQ8_0Bytes * b;
    const int8_t* qw = AsI8(wb + 2);
    const int8_t* qa = AsI8(ab + 2);
    int32_t sums[8] = {};
    for (int j = 0; j < 32; ++j) sums[j / 4] += qw[j] * qa[j];
    acc.Add(LoadF16(wb) * LoadF16(ab), sums, 0.0f);
  }
  return acc.Finish();
}

// The K-quant kernels unpack a super-block's quants to 256 values in
// element order and follow ggml's x86 (AVX2) kernels: integer lane sums
// (lane i takes elements 4i..4i+3 of every 32-element chunk, each product
// times its sub-block's scale; exact, so their order does not matter), then
// per super-block one fused multiply-add of d into eight float lanes, added
// up as hsum_float_8 does at the end (GgmlLanes).
template <int kSub>
inline void AddX86LaneSums(const uint8_t* q, const int8_t* y,
                           const int32_t* scale, int32_t* lane) {
  for (int e = 0; e < 256; ++e) {
    lane[(e & 31) >> 2] += scale[e / kSub] * (q[e] * y[e]);
  }
}

// The Q4_K / Q5_K min terms as ggml's AVX2 kernels pair them: prod[i] =
// mn[2i] * s[2i] + mn[2i+1] * s[2i+1], s[k] the sum of the 32 activations
// of sub-block k (two bsums).
inline void MinProducts(const uint8_t* ab, const int32_t* mn, int32_t* prod) {
  int16_t bsums[16];
  std::memcpy(bsums, ab + kQ8_KBsums, sizeof(bsums));
  for (int i = 0; i < 4; ++i) {
    const int32_t s0 = bsums[4 * i] + bsums[4 * i + 1];
    const int32_t s1 = bsums[4 * i + 2] + bsums[4 * i + 3];
    prod[i] = mn[2 * i] * s0 + mn[2 * i + 1] * s1;
  }
}

// Q4_K x Q8_K; the min terms go to four lanes of their own (ggml's acc_m).
float DotQ4_K(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  float acc_m[4] = {};
  for (int64_t b = 0; b < n / 256; ++b) {
    const uint8_t* wb = w + 144 * b;
    const uint8_t* ab = a + kQ8_KBytes * b;
    int32_t sc[8], mn[8];
    internal::UnpackScalesMinsK4(wb + 4, sc, mn);
    uint8_t q[256];
    internal::UnpackQ4_K(wb + 16, q);
    const float d_x = LoadF32(ab);
    int32_t prod[4];
    MinProducts(ab, mn, prod);
    const float dmin = -(d_x * LoadF16(wb + 2));
    for (int i = 0; i < 4; ++i) {
      acc_m[i] = std::fma(dmin, static_cast<float>(prod[i]), acc_m[i]);
    }
    int32_t lane[8] = {};
    AddX86LaneSums<32>(q, AsI8(ab + kQ8_KQs), sc, lane);
    acc.Add(d_x * LoadF16(wb), lane, 0.0f);
  }
  return acc.Finish() + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
}

// Q5_K x Q8_K; the min terms are summed in one float (ggml's summs).
float DotQ5_K(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  for (int64_t b = 0; b < n / 256; ++b) {
    const uint8_t* wb = w + 176 * b;
    const uint8_t* ab = a + kQ8_KBytes * b;
    int32_t sc[8], mn[8];
    internal::UnpackScalesMinsK4(wb + 4, sc, mn);
    uint8_t q[256];
    internal::UnpackQ5_K(wb + 16, wb + 48, q);
    const float d_x = LoadF32(ab);
    int32_t prod[4];
    MinProducts(ab, mn, prod);
    const float dmin = -(d_x * LoadF16(wb + 2));
    const int32_t prod_total = (prod[0] + prod[1]) + (prod[2] + prod[3]);
    int32_t lane[8] = {};
    AddX86LaneSums<32>(q, AsI8(ab + kQ8_KQs), sc, lane);
    acc.Add(d_x * LoadF16(wb), lane, 0.0f);
    // ggml's build fuses summs += dmin * prod into one FMA.
    acc.summs = std::fma(dmin, static_cast<float>(prod_total), acc.summs);
  }
  return acc.Finish();
}

// Q6_K x Q8_K.
float DotQ6_K(const uint8_t* w, const uint8_t* a, int64_t n) {
  GgmlLanes acc;
  for (int64_t b = 0; b < n / 256; ++b) {
    const uint8_t* wb = w + 210 * b;
    const uint8_t* ab = a + kQ8_KBytes * b;
    // The 6-bit quants without their -32 offset: ggml's AVX2 kernel takes
    // the offset out afterwards through the block sums, and which lane a
    // term lands in depends on that.
    uint8_t q[256];
    internal::UnpackQ6_K(wb, wb + 128, q);
    int32_t sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(wb[192 + j]);
    int32_t lane[8] = {};
    AddX86LaneSums<16>(q, AsI8(ab + kQ8_KQs), sc, lane);
    int16_t bsums[16];
    std::memcpy(bsums, ab + kQ8_KBsums, sizeof(bsums));
    for (int k = 0; k < 8; ++k) {
      lane[k] -=
          32 * (bsums[2 * k] * sc[2 * k] + bsums[2 * k + 1] * sc[2 * k + 1]);
    }
    acc.Add(LoadF32(ab) * LoadF16(wb + 208), lane, 0.0f);
  }
  return acc.Finish();
}

// ---------------------------------------------------------------------------
// AVX2 versions of the default model's formats (Q4_1 matrices, Q8_0
// embeddings/output) and Q4_0: eight float lanes in one register, exactly
// the scalar kernels' (and ggml's) operations in the same order, so results
// are bitwise identical to them (matmul_test checks this against
// VecDotReference). Chosen at run time when the CPU has AVX2, F16C and FMA.
// The full SIMD work (AVX-512 VNNI, repacking, every format) is the
// engine-speed issue's.
#if defined(__x86_64__)
#define PD_AVX2 __attribute__((target("avx2,f16c")))
#define PD_AVX2_FMA __attribute__((target("avx2,f16c,fma")))

PD_AVX2 inline float F16Avx2(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// Same order as DotQ4_1 (see GgmlLanes), eight lanes in one register.
PD_AVX2_FMA float DotQ4_1Avx2(const uint8_t* w, const uint8_t* a, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 20 * b;
    const uint8_t* ab = a + kQ8_1Bytes * b;
    summs += F16Avx2(wb + 2) * F16Avx2(ab + 2);
    const __m128i packed =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 4));
    const __m256i nibbles =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed),
                         _mm256_set1_epi8(0x0F));
    const __m256i y =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 4));
    const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles, y),
                                            _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(F16Avx2(wb) * F16Avx2(ab)),
                          _mm256_cvtepi32_ps(lanes), acc);
  }
  __m128 r =
      _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r) + summs;
}

// Same order as DotQ4_0 (ggml's): lane i = (q - 8) . y over elements
// 4i..4i+3, computed as q . y - 8 * sum(y) (nibbles as unsigned bytes).
PD_AVX2_FMA float DotQ4_0Avx2(const uint8_t* w, const uint8_t* a, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 18 * b;
    const uint8_t* ab = a + kQ8_0Bytes * b;
    const __m128i packed =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 2));
    const __m256i q = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low4);
    const __m256i y =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 2));
    const __m256i qy = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones16);
    const __m256i ys =
        _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, y), ones16);
    const __m256i lanes = _mm256_sub_epi32(qy, _mm256_slli_epi32(ys, 3));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(F16Avx2(wb) * F16Avx2(ab)),
                          _mm256_cvtepi32_ps(lanes), acc);
  }
  __m128 r =
      _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// Same order as DotQ8_0 (ggml's): int32 lanes of four products each,
// widened through int16 so that every int8 value, -128 included, is exact.
PD_AVX2_FMA float DotQ8_0Avx2(const uint8_t* w, const uint8_t* a, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + 34 * b;
    const uint8_t* ab = a + kQ8_0Bytes * b;
    const __m256i x =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2));
    const __m256i y =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 2));
    // Products of elements 0-15 and 16-31 as int32 pairs...
    const __m256i lo =
        _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(x)),
                          _mm256_cvtepi8_epi16(_mm256_castsi256_si128(y)));
    const __m256i hi =
        _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1)),
                          _mm256_cvtepi8_epi16(_mm256_extracti128_si256(y, 1)));
    // ...then neighbouring pairs added: lane i = products 4i..4i+3.
    const __m256i lanes =
        _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xD8);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(F16Avx2(wb) * F16Avx2(ab)),
                          _mm256_cvtepi32_ps(lanes), acc);
  }
  __m128 r =
      _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("f16c") &&
                          __builtin_cpu_supports("fma");
  return has;
}

bool CpuHasAvx512Vnni() {
  static const bool has = CpuHasAvx2() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}
#else
bool CpuHasAvx2() { return false; }
bool CpuHasAvx512Vnni() { return false; }
#endif

struct WeightKernel {
  GgmlType act_type;
  int block;        // elements per weight (and activation) block
  int block_bytes;  // bytes per weight block
  DotFn dot;
};

// The portable kernels: the reference every SIMD kernel must equal.
const WeightKernel* FindScalarKernel(GgmlType weight_type) {
  static constexpr WeightKernel kF32{GgmlType::kF32, 1, 4, DotF32};
  static constexpr WeightKernel kF16{GgmlType::kF16, 1, 2, DotF16};
  static constexpr WeightKernel kBF16{GgmlType::kBF16, 1, 2, DotBF16};
  static constexpr WeightKernel kQ4_0{GgmlType::kQ8_0, 32, 18, DotQ4_0};
  static constexpr WeightKernel kQ4_1{GgmlType::kQ8_1, 32, 20, DotQ4_1};
  static constexpr WeightKernel kQ5_0{GgmlType::kQ8_0, 32, 22, DotQ5_0};
  static constexpr WeightKernel kQ5_1{GgmlType::kQ8_1, 32, 24, DotQ5_1};
  static constexpr WeightKernel kQ8_0{GgmlType::kQ8_0, 32, 34, DotQ8_0};
  static constexpr WeightKernel kQ4_K{GgmlType::kQ8_K, 256, 144, DotQ4_K};
  static constexpr WeightKernel kQ5_K{GgmlType::kQ8_K, 256, 176, DotQ5_K};
  static constexpr WeightKernel kQ6_K{GgmlType::kQ8_K, 256, 210, DotQ6_K};
  switch (weight_type) {
    case GgmlType::kF32:
      return &kF32;
    case GgmlType::kF16:
      return &kF16;
    case GgmlType::kBF16:
      return &kBF16;
    case GgmlType::kQ4_0:
      return &kQ4_0;
    case GgmlType::kQ4_1:
      return &kQ4_1;
    case GgmlType::kQ5_0:
      return &kQ5_0;
    case GgmlType::kQ5_1:
      return &kQ5_1;
    case GgmlType::kQ8_0:
      return &kQ8_0;
    case GgmlType::kQ4_K:
      return &kQ4_K;
    case GgmlType::kQ5_K:
      return &kQ5_K;
    case GgmlType::kQ6_K:
      return &kQ6_K;
    default:
      return nullptr;
  }
}

const WeightKernel* FindKernel(GgmlType weight_type) {
#if defined(__x86_64__)
  static constexpr WeightKernel kQ4_0{GgmlType::kQ8_0, 32, 18, DotQ4_0Avx2};
  static constexpr WeightKernel kQ4_1{GgmlType::kQ8_1, 32, 20, DotQ4_1Avx2};
  static constexpr WeightKernel kQ8_0{GgmlType::kQ8_0, 32, 34, DotQ8_0Avx2};
  if (CpuHasAvx2()) {
    if (weight_type == GgmlType::kQ4_0) return &kQ4_0;
    if (weight_type == GgmlType::kQ4_1) return &kQ4_1;
    if (weight_type == GgmlType::kQ8_0) return &kQ8_0;
  }
#endif
  return FindScalarKernel(weight_type);
}

// MatMulRows keeps a tile of weight rows of about this many bytes hot in L1
// while it runs every token against it.
constexpr int64_t kRowTileBytes = 16 * 1024;
constexpr int64_t kMaxRowTile = 16;

}  // namespace

absl::StatusOr<GgmlType> VecDotType(GgmlType weight_type) {
  const WeightKernel* k = FindKernel(weight_type);
  if (k == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "no dot product for weights of ggml type ", GgmlTypeName(weight_type),
        " (id ", static_cast<uint32_t>(weight_type), ")"));
  }
  return k->act_type;
}

absl::Status ValidateVecDot(GgmlType weight_type, int64_t n) {
  absl::StatusOr<GgmlType> act = VecDotType(weight_type);
  if (!act.ok()) return act.status();
  const int block = FindKernel(weight_type)->block;
  if (n <= 0 || n % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows of ", n, " elements of ", GgmlTypeName(weight_type),
                     ": need a positive multiple of the block size ", block));
  }
  return absl::OkStatus();
}

int64_t ActivationRowBytes(GgmlType vec_dot_type, int64_t n) {
  switch (vec_dot_type) {
    case GgmlType::kQ8_0:
      return n / 32 * kQ8_0Bytes;
    case GgmlType::kQ8_1:
      return n / 32 * kQ8_1Bytes;
    case GgmlType::kQ8_K:
      return n / 256 * kQ8_KBytes;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 2 * n;
    case GgmlType::kF32:
      return 4 * n;
    default:
      return -1;
  }
}

void QuantizeActivations(GgmlType vec_dot_type, const float* x, int64_t n,
                         void* out) {
  auto* o = static_cast<uint8_t*>(out);
  switch (vec_dot_type) {
    case GgmlType::kQ8_0:
      if (CpuHasAvx512Vnni()) {
        internal::QuantizeQ8Avx512(/*with_sum=*/false, x, n, o);
        return;
      }
      QuantizeQ8_0(x, n, o);
      return;
    case GgmlType::kQ8_1:
      if (CpuHasAvx512Vnni()) {
        internal::QuantizeQ8Avx512(/*with_sum=*/true, x, n, o);
        return;
      }
      QuantizeQ8_1(x, n, o);
      return;
    case GgmlType::kQ8_K:
      QuantizeQ8_K(x, n, o);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(o + 2 * i, Fp32ToFp16(x[i]));
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(o + 2 * i, FloatToBf16(x[i]));
      return;
    case GgmlType::kF32:
      if (n > 0) std::memcpy(o, x, sizeof(float) * n);
      return;
    default:
      return;
  }
}

float VecDot(GgmlType weight_type, const void* weight_row,
             const void* activations, int64_t n) {
  const WeightKernel* k = FindKernel(weight_type);
  if (k == nullptr) return std::numeric_limits<float>::quiet_NaN();
  return k->dot(static_cast<const uint8_t*>(weight_row),
                static_cast<const uint8_t*>(activations), n);
}

float VecDotReference(GgmlType weight_type, const void* weight_row,
                      const void* activations, int64_t n) {
  const WeightKernel* k = FindScalarKernel(weight_type);
  if (k == nullptr) return std::numeric_limits<float>::quiet_NaN();
  return k->dot(static_cast<const uint8_t*>(weight_row),
                static_cast<const uint8_t*>(activations), n);
}

absl::StatusOr<PackedArithmetic> ParsePackedArithmetic(absl::string_view name) {
  if (name == "ggml") return PackedArithmetic::kGgml;
  if (name == "block_sums") return PackedArithmetic::kBlockSums;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown matmul arithmetic \"", name, "\": expected ggml or block_sums"));
}

const char* PackedArithmeticName(PackedArithmetic arithmetic) {
  return arithmetic == PackedArithmetic::kBlockSums ? "block_sums" : "ggml";
}

float VecDotBlockSumsReference(GgmlType weight_type, const void* weight_row,
                               const void* activations, int64_t n) {
  int block_bytes, quant_offset, act_bytes, offset;
  switch (weight_type) {
    case GgmlType::kQ4_0:
      block_bytes = 18, quant_offset = 2, act_bytes = kQ8_0Bytes, offset = 8;
      break;
    case GgmlType::kQ4_1:
      block_bytes = 20, quant_offset = 4, act_bytes = kQ8_1Bytes, offset = 0;
      break;
    case GgmlType::kQ8_0:
      block_bytes = 34, quant_offset = 2, act_bytes = kQ8_0Bytes, offset = 128;
      break;
    default:
      return std::numeric_limits<float>::quiet_NaN();
  }
  const auto* w = static_cast<const uint8_t*>(weight_row);
  const auto* a = static_cast<const uint8_t*>(activations);
  const int act_quant_offset = act_bytes - 32;
  float acc = 0.0f, mins = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* wb = w + block_bytes * b;
    const uint8_t* ab = a + act_bytes * b;
    const int8_t* y = AsI8(ab + act_quant_offset);
    uint8_t q[32];
    if (weight_type == GgmlType::kQ8_0) {
      for (int j = 0; j < 32; ++j) q[j] = wb[quant_offset + j] ^ 0x80;
    } else {
      internal::UnpackQ4(wb + quant_offset, q);
    }
    // ggml's lane sums, added up: the same exact integer as any order.
    int32_t lanes[8];
    BlockLaneSums(q, y, offset, lanes);
    int32_t sum = 0;
    for (int32_t l : lanes) sum += l;
    acc = std::fma(LoadF16(wb) * LoadF16(ab), static_cast<float>(sum), acc);
    if (weight_type == GgmlType::kQ4_1) {
      mins = std::fma(LoadF16(wb + 2), LoadF16(ab + 2), mins);
    }
  }
  return weight_type == GgmlType::kQ4_1 ? acc + mins : acc;
}

void MatMulRows(GgmlType weight_type, const void* weights, int64_t n,
                int64_t row_begin, int64_t row_end, const void* activations,
                int n_tokens, float* out, int64_t out_stride) {
  const WeightKernel* k = FindKernel(weight_type);
  if (k == nullptr) {
    for (int t = 0; t < n_tokens; ++t) {
      for (int64_t r = row_begin; r < row_end; ++r) {
        out[t * out_stride + r] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    return;
  }
  if (CpuHasAvx512Vnni() &&
      internal::MatMulRowsAvx512(
          weight_type, static_cast<const uint8_t*>(weights), n, row_begin,
          row_end, static_cast<const uint8_t*>(activations), n_tokens, out,
          out_stride)) {
    return;
  }
  MatMulRowsByVecDot(weight_type, weights, n, row_begin, row_end, activations,
                     n_tokens, out, out_stride);
}

static_assert(PackedMatrix::kRowGrain == internal::kPackRows);

int64_t PackedMatrix::StorageBytes(GgmlType weight_type, int64_t rows,
                                   int64_t n) {
  if (!CpuHasAvx512Vnni() || rows <= 0 || n <= 0 || n % 32 != 0 ||
      n / 32 > internal::kMaxAvx512Blocks) {
    return 0;
  }
  return (internal::PackedBytes(weight_type, rows, n) + kStorageAlignment - 1) /
         kStorageAlignment * kStorageAlignment;
}

std::unique_ptr<PackedMatrix> PackedMatrix::PackInto(
    GgmlType weight_type, const void* weights, int64_t rows, int64_t n,
    PackedArithmetic arithmetic, uint8_t* storage) {
  if (StorageBytes(weight_type, rows, n) == 0) return nullptr;
  std::unique_ptr<PackedMatrix> m(
      new PackedMatrix(weight_type, rows, n, arithmetic));
  internal::PackRows(weight_type, static_cast<const uint8_t*>(weights), rows, n,
                     storage);
  m->bytes_ = storage;
  return m;
}

std::unique_ptr<PackedMatrix> PackedMatrix::Pack(GgmlType weight_type,
                                                 const void* weights,
                                                 int64_t rows, int64_t n,
                                                 PackedArithmetic arithmetic) {
  const int64_t bytes = StorageBytes(weight_type, rows, n);
  if (bytes == 0) return nullptr;
  std::unique_ptr<uint8_t, FreeBytes> storage(static_cast<uint8_t*>(
      std::aligned_alloc(kStorageAlignment, static_cast<size_t>(bytes))));
  if (storage == nullptr) return nullptr;
  std::unique_ptr<PackedMatrix> m =
      PackInto(weight_type, weights, rows, n, arithmetic, storage.get());
  m->owned_ = std::move(storage);
  return m;
}

void PackedMatrix::FreeBytes::operator()(uint8_t* p) const { std::free(p); }

void PackedMatrix::MatMul(int64_t row_begin, int64_t row_end,
                          const void* activations, int n_tokens, float* out,
                          int64_t out_stride) const {
  internal::MatMulPacked(type_, arithmetic_ == PackedArithmetic::kBlockSums,
                         bytes_, n_, row_begin, row_end,
                         static_cast<const uint8_t*>(activations), n_tokens,
                         out, out_stride);
}

void MatMulRowsByVecDot(GgmlType weight_type, const void* weights, int64_t n,
                        int64_t row_begin, int64_t row_end,
                        const void* activations, int n_tokens, float* out,
                        int64_t out_stride) {
  const WeightKernel* k = FindKernel(weight_type);
  if (k == nullptr) {
    for (int t = 0; t < n_tokens; ++t) {
      for (int64_t r = row_begin; r < row_end; ++r) {
        out[t * out_stride + r] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    return;
  }
  const DotFn dot = k->dot;
  const int64_t row_bytes = n / k->block * k->block_bytes;
  const int64_t act_bytes = ActivationRowBytes(k->act_type, n);
  int64_t tile = row_bytes > 0 ? kRowTileBytes / row_bytes : kMaxRowTile;
  tile = tile < 1 ? 1 : (tile > kMaxRowTile ? kMaxRowTile : tile);
  const auto* w = static_cast<const uint8_t*>(weights);
  const auto* a = static_cast<const uint8_t*>(activations);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += tile) {
    const int64_t r1 = r0 + tile < row_end ? r0 + tile : row_end;
    for (int t = 0; t < n_tokens; ++t) {
      const uint8_t* at = a + t * act_bytes;
      float* ot = out + t * out_stride;
      for (int64_t r = r0; r < r1; ++r) ot[r] = dot(w + r * row_bytes, at, n);
    }
  }
}

}  // namespace pdserve::kernels
