#include "kernels/ggml_ops.h"

#include <immintrin.h>

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
  static const bool have = __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("f16c") &&
                           __builtin_cpu_supports("fma");
  return have;
}

// Per-thread accumulators for WeightedRowSumF16: [slot][lane][d] floats.
std::vector<float>& Scratch() {
  thread_local std::vector<float> scratch;
  return scratch;
}

// Portable form: acc[(j / 16) % slots][j % 16][i] += p[j] * rows[j][i].
void AccumulateScalar(int slots, int64_t n, const float* p,
                      const uint16_t* const* rows, int d, float* acc) {
  const float* half = HalfTable();
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const uint16_t* row = rows[j];
    float* a = acc + (((j / kLanes) % slots) * kLanes + j % kLanes) * d;
    for (int i = 0; i < d; ++i) a[i] = std::fma(pj, half[row[i]], a[i]);
  }
}

// The same with AVX-512 over i (d % 16 == 0): every element still gets one
// rounding per fused multiply-add, so the result is the scalar one bit for
// bit.
__attribute__((target("avx512f,f16c,fma"))) void AccumulateAvx512(
    int slots, int64_t n, const float* p, const uint16_t* const* rows, int d,
    float* acc) {
  for (int64_t j = 0; j < n; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    const uint16_t* row = rows[j];
    float* a = acc + (((j / kLanes) % slots) * kLanes + j % kLanes) * d;
    for (int i = 0; i < d; i += kLanes) {
      // maskz: the plain form trips GCC 12's -Wmaybe-uninitialized.
      const __m512 v = _mm512_maskz_cvtph_ps(
          0xFFFF,
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i)));
      _mm512_storeu_ps(a + i, _mm512_fmadd_ps(pj, v, _mm512_loadu_ps(a + i)));
    }
  }
}

}  // namespace

float DotF16Ggml(int64_t n, const uint16_t* x, const uint16_t* y) {
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

void WeightedRowSumF16(F16DotOrder order, int64_t n, const float* p,
                       const uint16_t* const* rows, int d, float* out) {
  const int slots = order == F16DotOrder::kVecDot ? 4 : 1;
  std::vector<float>& acc = Scratch();
  acc.assign(static_cast<size_t>(slots) * kLanes * d, 0.0f);
  if (d % kLanes == 0 && HaveAvx512()) {
    AccumulateAvx512(slots, n, p, rows, d, acc.data());
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
  double sum = 0;
  int64_t i = 0;
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

void SwiGluGgml(int64_t n, const float* g, const float* u, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      out[i + l] = SiluGgml(g[i + l]) * u[i + l];
    }
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace pdserve::kernels
