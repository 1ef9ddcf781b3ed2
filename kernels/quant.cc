#include "kernels/quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
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

namespace pdserve::kernels {
namespace {

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// Little-endian loads from possibly unaligned bytes.
inline uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
inline float LoadF16(const uint8_t* p) { return Fp16ToFp32(LoadU16(p)); }

// Elements per chunk in DotRow (and the size of its stack buffer).
constexpr int kChunk = 256;

// Each codec describes one ggml type: kBlock elements in kBytes bytes, and
// Decode(src, y) writes the kBlock floats of the block at `src` to `y`.

struct F32Codec {
  static constexpr int kBlock = 1;
  static constexpr int kBytes = 4;
  static void Decode(const uint8_t* src, float* y) {
    y[0] = BitsToFloat(LoadU32(src));
  }
};

struct F16Codec {
  static constexpr int kBlock = 1;
  static constexpr int kBytes = 2;
  static void Decode(const uint8_t* src, float* y) { y[0] = LoadF16(src); }
};

struct Bf16Codec {
  static constexpr int kBlock = 1;
  static constexpr int kBytes = 2;
  static void Decode(const uint8_t* src, float* y) {
    y[0] = Bf16ToFp32(LoadU16(src));
  }
};

struct Q8_0Codec {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 34;
  static void Decode(const uint8_t* src, float* y) {
    const float d = LoadF16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 32; ++j) {
      y[j] = static_cast<float>(static_cast<int8_t>(qs[j])) * d;
    }
  }
};

struct Q4_0Codec {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 18;
  static void Decode(const uint8_t* src, float* y) {
    const float d = LoadF16(src);
    uint8_t q[32];
    internal::UnpackQ4(src + 2, q);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - 8) * d;
  }
};

struct Q4_1Codec {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 20;
  static void Decode(const uint8_t* src, float* y) {
    const float d = LoadF16(src);
    const float m = LoadF16(src + 2);
    uint8_t q[32];
    internal::UnpackQ4(src + 4, q);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d + m;
  }
};

struct Q5_0Codec {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 22;
  static void Decode(const uint8_t* src, float* y) {
    const float d = LoadF16(src);
    uint8_t q[32];
    internal::UnpackQ5(LoadU32(src + 2), src + 6, q);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
  }
};

struct Q5_1Codec {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 24;
  static void Decode(const uint8_t* src, float* y) {
    const float d = LoadF16(src);
    const float m = LoadF16(src + 2);
    uint8_t q[32];
    internal::UnpackQ5(LoadU32(src + 4), src + 8, q);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d + m;
  }
};

// Q4_K / Q5_K: element e of sub-block s = e / 32 is
// (d * sc[s]) * q[e] - dmin * mn[s].
inline void DecodeK4(const uint8_t* src, const uint8_t* q, float* y) {
  const float d = LoadF16(src);
  const float dmin = LoadF16(src + 2);
  int32_t sc[8], mn[8];
  internal::UnpackScalesMinsK4(src + 4, sc, mn);
  for (int s = 0; s < 8; ++s) {
    const float ds = d * static_cast<float>(sc[s]);
    const float ms = dmin * static_cast<float>(mn[s]);
    for (int l = 0; l < 32; ++l) {
      y[32 * s + l] = ds * static_cast<float>(q[32 * s + l]) - ms;
    }
  }
}

struct Q4_KCodec {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 144;
  static void Decode(const uint8_t* src, float* y) {
    uint8_t q[256];
    internal::UnpackQ4_K(src + 16, q);
    DecodeK4(src, q, y);
  }
};

struct Q5_KCodec {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 176;
  static void Decode(const uint8_t* src, float* y) {
    uint8_t q[256];
    internal::UnpackQ5_K(src + 16, src + 48, q);
    DecodeK4(src, q, y);
  }
};

struct Q6_KCodec {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 210;
  static void Decode(const uint8_t* src, float* y) {
    const float d = LoadF16(src + 208);
    const uint8_t* sc = src + 192;  // int8 scales[16], one per 16 elements
    uint8_t q[256];
    internal::UnpackQ6_K(src, src + 128, q);
    for (int e = 0; e < 256; ++e) {
      y[e] = d * static_cast<float>(static_cast<int8_t>(sc[e / 16])) *
             static_cast<float>(q[e] - 32);
    }
  }
};

// Calls fn(Codec{}) for a supported type; false for any other type.
template <typename Fn>
bool VisitCodec(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::kF32:
      fn(F32Codec{});
      return true;
    case GgmlType::kF16:
      fn(F16Codec{});
      return true;
    case GgmlType::kBF16:
      fn(Bf16Codec{});
      return true;
    case GgmlType::kQ8_0:
      fn(Q8_0Codec{});
      return true;
    case GgmlType::kQ4_0:
      fn(Q4_0Codec{});
      return true;
    case GgmlType::kQ4_1:
      fn(Q4_1Codec{});
      return true;
    case GgmlType::kQ5_0:
      fn(Q5_0Codec{});
      return true;
    case GgmlType::kQ5_1:
      fn(Q5_1Codec{});
      return true;
    case GgmlType::kQ4_K:
      fn(Q4_KCodec{});
      return true;
    case GgmlType::kQ5_K:
      fn(Q5_KCodec{});
      return true;
    case GgmlType::kQ6_K:
      fn(Q6_KCodec{});
      return true;
    default:
      return false;
  }
}

// Block size of a supported type, or 0 when unsupported.
int BlockSize(GgmlType type) {
  int block = 0;
  VisitCodec(type, [&](auto codec) { block = decltype(codec)::kBlock; });
  return block;
}

absl::Status CheckArgs(const char* what, GgmlType type, int64_t n) {
  const int block = BlockSize(type);
  if (block == 0) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": ggml type ", GgmlTypeName(type), " (id ",
                     static_cast<uint32_t>(type), ") is not supported"));
  }
  if (n < 0 || n % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": n = ", n, " is not a non-negative multiple of the block size ",
        block, " of ", GgmlTypeName(type)));
  }
  return absl::OkStatus();
}

// Sum of a[i] * x[i] for i < len (len <= kChunk), in float with eight
// partial sums so that the main loop vectorizes without -ffast-math.
inline float DotChunk(const float* a, const float* x, int len) {
  constexpr int kLanes = 8;
  float acc[kLanes] = {};
  const int main = len - len % kLanes;
  for (int i = 0; i < main; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += a[i + k] * x[i + k];
  }
  for (int i = main; i < len; ++i) acc[i - main] += a[i] * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
         ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename Codec>
void DequantizeImpl(const uint8_t* src, int64_t n_blocks, float* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    Codec::Decode(src + b * Codec::kBytes, out + b * Codec::kBlock);
  }
}

template <typename Codec>
double DotImpl(const uint8_t* src, const float* x, int64_t n_blocks) {
  constexpr int64_t kBlocksPerChunk = kChunk / Codec::kBlock;
  static_assert(kBlocksPerChunk * Codec::kBlock == kChunk);
  float buf[kChunk];
  double total = 0.0;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kBlocksPerChunk) {
    const int64_t nb =
        n_blocks - b0 < kBlocksPerChunk ? n_blocks - b0 : kBlocksPerChunk;
    const uint8_t* s = src + b0 * Codec::kBytes;
    for (int64_t b = 0; b < nb; ++b) {
      Codec::Decode(s + b * Codec::kBytes, buf + b * Codec::kBlock);
    }
    total += DotChunk(buf, x + b0 * Codec::kBlock,
                      static_cast<int>(nb * Codec::kBlock));
  }
  return total;
}

}  // namespace

namespace {

#if defined(__x86_64__)
bool HaveAvx512F16c() {
  static const bool have =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c");
  return have;
}

// (maskz forms: the plain ones trip GCC 12's -Wmaybe-uninitialized.)
// vcvtps2ph rounds to nearest even and quiets NaNs keeping the top payload
// bits, as Fp32ToFp16; vcvtph2ps is exact, as Fp16ToFp32.
__attribute__((target("avx512f,f16c"))) int64_t Fp32ToFp16Avx512(
    const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_maskz_cvtps_ph(0xFFFF, _mm512_loadu_ps(x + i),
                                              _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

__attribute__((target("avx512f,f16c"))) int64_t Fp16ToFp32Avx512(
    const uint16_t* h, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i,
                     _mm512_maskz_cvtph_ps(
                         0xFFFF, _mm256_loadu_si256(
                                     reinterpret_cast<const __m256i*>(h + i))));
  }
  return i;
}
#endif

}  // namespace

uint8_t Fp32ToFp8E4M3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7F;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7E;  // saturate (infinities included)
  if (a == 0.0f) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
  // Quantum: 2^(e - 1 - 3) for normals, 2^-9 for subnormals (e - 1 < -6).
  const int quantum_exp = std::max(e - 1, -6) - 3;
  // a / quantum is exact (a power of two); nearbyint rounds half to even.
  const int q = static_cast<int>(std::nearbyint(std::ldexp(a, -quantum_exp)));
  if (quantum_exp == -9) {  // subnormal range: q in [0, 8]; 8 is 2^-6
    return sign | static_cast<uint8_t>(q);
  }
  // Normal: q in [8, 16]; 16 carries into the next binade.
  const int exponent = quantum_exp + 3 + 7 + (q == 16 ? 1 : 0);
  const int mantissa = q == 16 ? 0 : q - 8;
  const int code = (exponent << 3) | mantissa;
  return sign | static_cast<uint8_t>(code > 0x7E ? 0x7E : code);
}

float Fp8E4M3ToFp32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exponent = (v >> 3) & 0xF;
  const int mantissa = v & 0x7;
  if (exponent == 0xF && mantissa == 0x7) {
    return std::copysign(std::numeric_limits<float>::quiet_NaN(), sign);
  }
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
}

void Fp32ToFp8E4M3Row(const float* x, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Fp32ToFp8E4M3(x[i]);
}

void Fp8E4M3ToFp16Row(const uint8_t* v, int64_t n, uint16_t* out) {
  static const std::array<uint16_t, 256>* table = [] {
    auto* t = new std::array<uint16_t, 256>;
    for (int i = 0; i < 256; ++i) {
      (*t)[i] = Fp32ToFp16(Fp8E4M3ToFp32(static_cast<uint8_t>(i)));
    }
    return t;
  }();
  for (int64_t i = 0; i < n; ++i) out[i] = (*table)[v[i]];
}

void Fp32ToFp16Row(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HaveAvx512F16c()) i = Fp32ToFp16Avx512(x, n, out);
#endif
  for (; i < n; ++i) out[i] = Fp32ToFp16(x[i]);
}

void Fp16ToFp32Row(const uint16_t* h, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HaveAvx512F16c()) i = Fp16ToFp32Avx512(h, n, out);
#endif
  for (; i < n; ++i) out[i] = Fp16ToFp32(h[i]);
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) {  // inf or NaN (made quiet, payload kept)
    return BitsToFloat(sign | 0x7F800000u | (mant << 13) |
                       (mant != 0 ? 0x00400000u : 0u));
  }
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);  // +-0
    // Subnormal: mant * 2^-24. Normalize into a binary32 normal.
    int e = 127 - 15 + 1;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3FF;
    return BitsToFloat(sign | (static_cast<uint32_t>(e) << 23) | (mant << 13));
  }
  return BitsToFloat(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

uint16_t Fp32ToFp16(float f) {
  const uint32_t bits = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    if (abs == 0x7F800000u) return sign | 0x7C00;
    return static_cast<uint16_t>(sign | 0x7E00 | ((abs >> 13) & 0x3FF));
  }
  const int e = static_cast<int>(abs >> 23) - 127;  // unbiased exponent
  if (e > 15) return sign | 0x7C00;                 // overflow
  uint32_t h;
  uint32_t rem;
  uint32_t half;
  if (e >= -14) {  // half normal (rounding may carry into inf)
    h = (static_cast<uint32_t>(e + 15) << 10) | ((abs >> 13) & 0x3FF);
    rem = abs & 0x1FFF;
    half = 0x1000;
  } else {  // half subnormal or zero: units of 2^-24
    const uint32_t m = (abs & 0x7FFFFF) | 0x800000;  // value m * 2^(e-23)
    const int shift = -(e + 1);                      // >= 14
    if (shift >= 25) return sign;                    // < 2^-25: rounds to 0
    h = m >> shift;
    rem = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  }
  if (rem > half || (rem == half && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float Bf16ToFp32(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

bool IsQuantTypeSupported(GgmlType type) { return BlockSize(type) != 0; }

absl::Status DequantizeRow(GgmlType type, const void* blocks, int64_t n,
                           float* out) {
  if (absl::Status s = CheckArgs("DequantizeRow", type, n); !s.ok()) return s;
  const auto* src = static_cast<const uint8_t*>(blocks);
  VisitCodec(type, [&](auto codec) {
    using Codec = decltype(codec);
    DequantizeImpl<Codec>(src, n / Codec::kBlock, out);
  });
  return absl::OkStatus();
}

absl::StatusOr<float> DotRow(GgmlType type, const void* blocks, const float* x,
                             int64_t n) {
  if (absl::Status s = CheckArgs("DotRow", type, n); !s.ok()) return s;
  const auto* src = static_cast<const uint8_t*>(blocks);
  double total = 0.0;
  VisitCodec(type, [&](auto codec) {
    using Codec = decltype(codec);
    total = DotImpl<Codec>(src, x, n / Codec::kBlock);
  });
  return static_cast<float>(total);
}

}  // namespace pdserve::kernels
