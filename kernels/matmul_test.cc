#include "kernels/matmul.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/ggml_type.h"
#include "kernels/quant.h"
#include "model/default_model.h"
#include "model/gguf.h"

namespace pdserve::kernels {
namespace {

// Every weight type with a dot product, and its activation format.
struct TypePair {
  GgmlType weight;
  GgmlType act;
};
constexpr TypePair kPairs[] = {
    {GgmlType::kF32, GgmlType::kF32},   {GgmlType::kF16, GgmlType::kF16},
    {GgmlType::kBF16, GgmlType::kBF16}, {GgmlType::kQ4_0, GgmlType::kQ8_0},
    {GgmlType::kQ4_1, GgmlType::kQ8_1}, {GgmlType::kQ5_0, GgmlType::kQ8_0},
    {GgmlType::kQ5_1, GgmlType::kQ8_1}, {GgmlType::kQ8_0, GgmlType::kQ8_0},
    {GgmlType::kQ4_K, GgmlType::kQ8_K}, {GgmlType::kQ5_K, GgmlType::kQ8_K},
    {GgmlType::kQ6_K, GgmlType::kQ8_K},
};

std::string Name(GgmlType t) { return GgmlTypeName(t); }

// ---------------------------------------------------------------------------
// Byte helpers and block encoders, written from the layouts in matmul.h and
// quant.h (independently of the code under test).

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xFF);
  p[1] = static_cast<uint8_t>(v >> 8);
}
uint16_t GetU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
void PutF16(uint8_t* p, float v) { PutU16(p, Fp32ToFp16(v)); }
float GetF16(const uint8_t* p) { return Fp16ToFp32(GetU16(p)); }
void PutF32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
float GetF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// 32-element blocks. q holds the stored (unsigned, offset) quant values.
void EncodeQ4_0(float d, const int* q, uint8_t* out) {
  PutF16(out, d);
  for (int j = 0; j < 16; ++j) out[2 + j] = q[j] | (q[j + 16] << 4);
}
void EncodeQ4_1(float d, float m, const int* q, uint8_t* out) {
  PutF16(out, d);
  PutF16(out + 2, m);
  for (int j = 0; j < 16; ++j) out[4 + j] = q[j] | (q[j + 16] << 4);
}
uint32_t FifthBits(const int* q) {
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j)
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  return qh;
}
void EncodeQ5_0(float d, const int* q, uint8_t* out) {
  PutF16(out, d);
  const uint32_t qh = FifthBits(q);
  for (int k = 0; k < 4; ++k) out[2 + k] = (qh >> (8 * k)) & 0xFF;
  for (int j = 0; j < 16; ++j) {
    out[6 + j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
  }
}
void EncodeQ5_1(float d, float m, const int* q, uint8_t* out) {
  PutF16(out, d);
  PutF16(out + 2, m);
  const uint32_t qh = FifthBits(q);
  for (int k = 0; k < 4; ++k) out[4 + k] = (qh >> (8 * k)) & 0xFF;
  for (int j = 0; j < 16; ++j) {
    out[8 + j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
  }
}
// Also the Q8_0 activation block.
void EncodeQ8_0(float d, const int* q, uint8_t* out) {
  PutF16(out, d);
  for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(q[j]);
}
void EncodeQ8_1(float d, float s, const int* q, uint8_t* out) {
  PutF16(out, d);
  PutF16(out + 2, s);
  for (int j = 0; j < 32; ++j) out[4 + j] = static_cast<uint8_t>(q[j]);
}

// 256-element super-blocks.
// Packs eight 6-bit scales and mins the way ggml's get_scale_min_k4 reads
// them: bytes 0-3 / 4-7 hold scales / mins 0-3 in their low six bits and
// the top two bits of scales / mins 4-7; bytes 8-11 hold the low nibbles of
// scales 4-7 (low) and mins 4-7 (high).
void PackScalesK4(const int* sc, const int* mn, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
    s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
    s[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
  }
}
void EncodeQ4_K(float d, float dmin, const int* sc, const int* mn, const int* q,
                uint8_t* out) {
  PutF16(out, d);
  PutF16(out + 2, dmin);
  PackScalesK4(sc, mn, out + 4);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out[16 + 32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
    }
  }
}
void EncodeQ5_K(float d, float dmin, const int* sc, const int* mn, const int* q,
                uint8_t* out) {
  PutF16(out, d);
  PutF16(out + 2, dmin);
  PackScalesK4(sc, mn, out + 4);
  uint8_t* qh = out + 16;
  std::memset(qh, 0, 32);
  for (int e = 0; e < 256; ++e) {  // bit (e / 32) of qh[e % 32]
    qh[e % 32] |= ((q[e] >> 4) & 1) << (e / 32);
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out[48 + 32 * c + l] =
          (q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4);
    }
  }
}
// q in 0..63 (stored value; the element is d * sc[e / 16] * (q - 32)).
void EncodeQ6_K(float d, const int* sc, const int* q, uint8_t* out) {
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  std::memset(out, 0, 192);
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int v = q[128 * h + 32 * g + l];
        ql[64 * h + (g & 1) * 32 + l] |= (v & 0xF) << (4 * (g >> 1));
        qh[32 * h + l] |= ((v >> 4) & 3) << (2 * g);
      }
    }
  }
  for (int j = 0; j < 16; ++j) out[192 + j] = static_cast<uint8_t>(sc[j]);
  PutF16(out + 208, d);
}
void EncodeQ8_K(float d, const int* q, const int* bsums, uint8_t* out) {
  PutF32(out, d);
  for (int j = 0; j < 256; ++j) out[4 + j] = static_cast<uint8_t>(q[j]);
  for (int j = 0; j < 16; ++j) {
    PutU16(out + 260 + 2 * j, static_cast<uint16_t>(bsums[j]));
  }
}

// Activation rows decoded by the test: per element x = d * q (or the plain
// value), plus Q8_1's stored s per block.
struct DecodedActivations {
  std::vector<double> x;
  std::vector<double> s;     // Q8_1 only: stored s per block
  std::vector<double> dsum;  // Q8_1 only: d * sum(q) per block, exactly
};
DecodedActivations DecodeActivations(GgmlType type, const uint8_t* a,
                                     int64_t n) {
  DecodedActivations out;
  out.x.resize(n);
  switch (type) {
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* p = a + 34 * b;
        for (int j = 0; j < 32; ++j) {
          out.x[32 * b + j] = double{GetF16(p)} * static_cast<int8_t>(p[2 + j]);
        }
      }
      break;
    case GgmlType::kQ8_1:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* p = a + 36 * b;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
          const int q = static_cast<int8_t>(p[4 + j]);
          out.x[32 * b + j] = double{GetF16(p)} * q;
          sum += q;
        }
        out.s.push_back(GetF16(p + 2));
        out.dsum.push_back(double{GetF16(p)} * sum);
      }
      break;
    case GgmlType::kQ8_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const uint8_t* p = a + 292 * b;
        for (int j = 0; j < 256; ++j) {
          out.x[256 * b + j] =
              double{GetF32(p)} * static_cast<int8_t>(p[4 + j]);
        }
      }
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) out.x[i] = GetF16(a + 2 * i);
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) out.x[i] = Bf16ToFp32(GetU16(a + 2 * i));
      break;
    case GgmlType::kF32:
      for (int64_t i = 0; i < n; ++i) out.x[i] = GetF32(a + 4 * i);
      break;
    default:
      ADD_FAILURE() << "not an activation type: " << Name(type);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Type mapping and sizes.

TEST(MatMulTypesTest, VecDotTypeMapping) {
  for (const TypePair& p : kPairs) {
    absl::StatusOr<GgmlType> got = VecDotType(p.weight);
    ASSERT_TRUE(got.ok()) << Name(p.weight) << ": " << got.status();
    EXPECT_EQ(*got, p.act) << Name(p.weight);
  }
  for (GgmlType t : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ8_1,
                     GgmlType::kQ8_K, GgmlType::kI8, GgmlType::kF64}) {
    absl::StatusOr<GgmlType> got = VecDotType(t);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnimplemented) << Name(t);
    EXPECT_NE(got.status().message().find(Name(t)), std::string::npos)
        << got.status();
  }
}

TEST(MatMulTypesTest, ValidateVecDot) {
  EXPECT_TRUE(ValidateVecDot(GgmlType::kQ4_1, 576).ok());
  EXPECT_TRUE(ValidateVecDot(GgmlType::kQ4_K, 512).ok());
  EXPECT_TRUE(ValidateVecDot(GgmlType::kF16, 3).ok());
  EXPECT_EQ(ValidateVecDot(GgmlType::kQ4_0, 48).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateVecDot(GgmlType::kQ6_K, 576).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateVecDot(GgmlType::kQ8_0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateVecDot(GgmlType::kF32, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateVecDot(GgmlType::kQ2_K, 256).code(),
            absl::StatusCode::kUnimplemented);
}

TEST(MatMulTypesTest, ActivationRowBytesMatchGgmlSizes) {
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ8_1, GgmlType::kQ8_K,
                     GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32}) {
    for (int64_t n : {256, 512, 1024}) {
      absl::StatusOr<uint64_t> want = GgmlTypeBytes(t, n);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(ActivationRowBytes(t, n), static_cast<int64_t>(*want))
          << Name(t) << " n=" << n;
    }
  }
  EXPECT_EQ(ActivationRowBytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(ActivationRowBytes(GgmlType::kQ8_1, 64), 72);
  EXPECT_EQ(ActivationRowBytes(GgmlType::kQ8_K, 512), 584);
  EXPECT_EQ(ActivationRowBytes(GgmlType::kQ4_0, 64), -1);
}

// ---------------------------------------------------------------------------
// QuantizeActivations on hand-picked values.

TEST(QuantizeActivationsTest, Q8_0) {
  // ggml's x86 rounding: id = 127 / amax, halves to even.
  // Block 0: amax 127 -> d = 1 (f16 0x3C00), id = 1, q = x rounded half to
  // even. Block 1: all zero -> d = 0, q = 0. Block 2: amax 63.5
  // (negative) -> d = 0.5 (0x3800), id = 2. Block 3: amax 1 -> d = 1/127,
  // stored as f16 0x2008 (2^-7 * 1.0078125); id = 1/d is exactly 127 in
  // float, so q = x * 127 rounded half to even.
  std::vector<float> x(128, 0.0f);
  std::vector<int> q0(32), q2(32), q3(32);
  const float head0[] = {127.0f, -2.5f, 2.5f,  0.49999997f, -0.5f,
                         0.5f,   1.4f,  -1.6f, 100.25f,     -126.5f};
  const int want0[] = {127, -2, 2, 0, 0, 0, 1, -2, 100, -126};
  for (int j = 0; j < 32; ++j) {
    x[j] = j < 10 ? head0[j] : static_cast<float>(j - 20);
    q0[j] = j < 10 ? want0[j] : j - 20;
  }
  const float head2[] = {-63.5f, 1.25f, -1.25f, 0.2f, 0.25f, 31.75f};
  const int want2[] = {-127, 2, -2, 0, 0, 64};  // 2.5 -> 2, 0.5 -> 0
  for (int j = 0; j < 32; ++j) {
    x[64 + j] = j < 6 ? head2[j] : 0.5f * static_cast<float>(j - 16);
    q2[j] = j < 6 ? want2[j] : j - 16;
  }
  for (int j = 0; j < 32; ++j) {
    x[96 + j] = j % 2 == 0 ? 1.0f : -0.5f;  // id = 127: -63.5 -> -64
    q3[j] = j % 2 == 0 ? 127 : -64;
  }
  std::vector<uint8_t> got(ActivationRowBytes(GgmlType::kQ8_0, 128), 0xAA);
  ASSERT_EQ(got.size(), 4u * 34u);
  QuantizeActivations(GgmlType::kQ8_0, x.data(), 128, got.data());

  std::vector<uint8_t> want(4 * 34);
  EncodeQ8_0(1.0f, q0.data(), want.data());
  const std::vector<int> zeros(32, 0);
  EncodeQ8_0(0.0f, zeros.data(), want.data() + 34);
  EncodeQ8_0(0.5f, q2.data(), want.data() + 68);
  EncodeQ8_0(0.0f, q3.data(), want.data() + 102);
  PutU16(want.data() + 102, 0x2008);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "byte " << i << " (block " << i / 34 << ")";
  }
}

TEST(QuantizeActivationsTest, Q8_1KeepsSumOfQuantsTimesUnroundedD) {
  // Block 0: x = 4, -3, 2, 0, ... and 127 last: d = 1, s = sum(q) = 130.
  // Block 1: all 1.0: d = 1/127 (f16 0x2008), q = 127, and
  //   s = 4064 * (float)(1/127) = 32 (0x5000) -- from the f16 d it would be
  //   4064 * 0.00788879... = 32.06 -> 0x5002.
  // Block 2: zero -> d = s = 0.
  std::vector<float> x(96, 0.0f);
  std::vector<int> q0(32, 0);
  const int head[] = {4, -3, 2};
  for (int j = 0; j < 3; ++j) {
    x[j] = static_cast<float>(head[j]);
    q0[j] = head[j];
  }
  x[31] = 127.0f;
  q0[31] = 127;
  for (int j = 32; j < 64; ++j) x[j] = 1.0f;
  std::vector<uint8_t> got(ActivationRowBytes(GgmlType::kQ8_1, 96), 0xAA);
  ASSERT_EQ(got.size(), 3u * 36u);
  QuantizeActivations(GgmlType::kQ8_1, x.data(), 96, got.data());

  std::vector<uint8_t> want(3 * 36);
  EncodeQ8_1(1.0f, 130.0f, q0.data(), want.data());
  const std::vector<int> q1(32, 127), zeros(32, 0);
  EncodeQ8_1(0.0f, 0.0f, q1.data(), want.data() + 36);
  PutU16(want.data() + 36, 0x2008);
  PutU16(want.data() + 38, 0x5000);
  EncodeQ8_1(0.0f, 0.0f, zeros.data(), want.data() + 72);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "byte " << i << " (block " << i / 36 << ")";
  }
}

TEST(QuantizeActivationsTest, Q8_K) {
  // Block 0: the largest magnitude is -127 (negative) -> iscale = 1, d = 1,
  //   q = round-half-even(x): 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, 0.5 -> 0.
  // Block 1: largest magnitude 63.5 (positive, first of a +-63.5 tie) ->
  //   iscale = -2, d = -0.5, q = round-half-even(-2x).
  // Block 2: all zero -> d = 0, q = 0, bsums = 0.
  std::vector<float> x(768, 0.0f);
  std::vector<int> q0(256), q1(256);
  const float head0[] = {-127.0f, 2.5f, 3.5f, -2.5f, 0.5f, 1.5f, 100.0f};
  const int want0[] = {-127, 2, 4, -2, 0, 2, 100};
  for (int j = 0; j < 256; ++j) {
    x[j] = j < 7 ? head0[j] : static_cast<float>(j % 41 - 20);
    q0[j] = j < 7 ? want0[j] : j % 41 - 20;
  }
  // x = 0.25 * (j % 9 - 4), so -2x runs 2, 1.5, 1, 0.5, 0, -0.5, -1, -1.5, -2
  // and rounds (half to even) to:
  const int want1[9] = {2, 2, 1, 0, 0, 0, -1, -2, -2};
  for (int j = 0; j < 256; ++j) {
    x[256 + j] = 0.25f * static_cast<float>(j % 9 - 4);
    q1[j] = want1[j % 9];
  }
  x[256 + 5] = 63.5f;
  q1[5] = -127;
  x[256 + 9] = -63.5f;
  q1[9] = 127;
  std::vector<uint8_t> got(ActivationRowBytes(GgmlType::kQ8_K, 768), 0xAA);
  ASSERT_EQ(got.size(), 3u * 292u);
  QuantizeActivations(GgmlType::kQ8_K, x.data(), 768, got.data());

  auto bsums = [](const std::vector<int>& q) {
    std::vector<int> s(16, 0);
    for (int j = 0; j < 256; ++j) s[j / 16] += q[j];
    return s;
  };
  std::vector<uint8_t> want(3 * 292);
  EncodeQ8_K(1.0f, q0.data(), bsums(q0).data(), want.data());
  EncodeQ8_K(-0.5f, q1.data(), bsums(q1).data(), want.data() + 292);
  const std::vector<int> zeros(256, 0);
  EncodeQ8_K(0.0f, zeros.data(), zeros.data(), want.data() + 584);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "byte " << i << " (block " << i / 292
                               << ", offset " << i % 292 << ")";
  }
}

TEST(QuantizeActivationsTest, PlainTypes) {
  const float x[] = {1.0f,     1.0f / 3.0f, 65504.0f,    1e-8f,
                     70000.0f, -2.5f,       1.00390625f, 1.01171875f};
  // f16: 1/3 rounds to 0x3555; 1e-8 < 2^-25 -> +0; 70000 -> inf;
  // 1 + 2^-8 and 1 + 3 * 2^-8 are exact.
  const uint16_t want_f16[] = {0x3C00, 0x3555, 0x7BFF, 0x0000,
                               0x7C00, 0xC100, 0x3C04, 0x3C0C};
  // bf16: the top 16 bits, rounded to nearest even: 1/3 = 0x3EAAAAAB rounds
  // up; 1 + 2^-8 = 0x3F808000 is a tie that stays at 0x3F80 (even);
  // 1 + 3 * 2^-8 = 0x3F818000 is a tie that goes up to 0x3F82.
  const uint16_t want_bf16[] = {0x3F80, 0x3EAB, 0x4780, 0x322C,
                                0x4789, 0xC020, 0x3F80, 0x3F82};
  uint8_t got[32];
  QuantizeActivations(GgmlType::kF16, x, 8, got);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(GetU16(got + 2 * i), want_f16[i]) << "f16 " << i;
  }
  QuantizeActivations(GgmlType::kBF16, x, 8, got);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(GetU16(got + 2 * i), want_bf16[i]) << "bf16 " << i;
  }
  const float nan = std::nanf("");
  QuantizeActivations(GgmlType::kBF16, &nan, 1, got);
  EXPECT_TRUE(std::isnan(Bf16ToFp32(GetU16(got))));
  QuantizeActivations(GgmlType::kF32, x, 8, got);
  EXPECT_EQ(std::memcmp(got, x, 32), 0);
  // Not an activation format: nothing written.
  uint8_t untouched[8];
  std::memset(untouched, 0x5A, sizeof(untouched));
  QuantizeActivations(GgmlType::kQ4_0, x, 8, untouched);
  for (uint8_t b : untouched) EXPECT_EQ(b, 0x5A);
}

// QuantizeActivations against the definitions written out with the C
// library's rounding (roundf: halves away from zero; nearbyint: halves to
// even), on random rows with a spread of block magnitudes.
TEST(QuantizeActivationsTest, RandomRowsMatchDefinitions) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t n = 1024;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = u(rng) * std::ldexp(1.0f, static_cast<int>(i / 64) - 6);
  }
  // A block with exact ties after scaling (amax 127 -> id 1).
  for (int j = 0; j < 32; ++j) x[32 * 3 + j] = 0.5f * (j - 16) + 0.0f;
  x[32 * 3] = 127.0f;

  std::vector<uint8_t> q80(ActivationRowBytes(GgmlType::kQ8_0, n));
  std::vector<uint8_t> q81(ActivationRowBytes(GgmlType::kQ8_1, n));
  std::vector<uint8_t> q8k(ActivationRowBytes(GgmlType::kQ8_K, n));
  QuantizeActivations(GgmlType::kQ8_0, x.data(), n, q80.data());
  QuantizeActivations(GgmlType::kQ8_1, x.data(), n, q81.data());
  QuantizeActivations(GgmlType::kQ8_K, x.data(), n, q8k.data());
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(x[32 * b + j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    EXPECT_EQ(GetU16(&q80[34 * b]), Fp32ToFp16(d)) << b;
    EXPECT_EQ(GetU16(&q81[36 * b]), Fp32ToFp16(d)) << b;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int want = static_cast<int>(std::nearbyint(x[32 * b + j] * id));
      EXPECT_EQ(static_cast<int8_t>(q80[34 * b + 2 + j]), want)
          << b << " " << j;
      EXPECT_EQ(static_cast<int8_t>(q81[36 * b + 4 + j]), want)
          << b << " " << j;
      sum += want;
    }
    EXPECT_EQ(GetU16(&q81[36 * b + 2]), Fp32ToFp16(static_cast<float>(sum) * d))
        << b;
  }
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* xb = x.data() + 256 * b;
    float max = 0.0f;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(xb[j]) > std::fabs(max)) max = xb[j];
    }
    const float iscale = -127.0f / max;
    const uint8_t* p = &q8k[292 * b];
    EXPECT_EQ(GetF32(p), 1.0f / iscale) << b;
    int bsum[16] = {};
    for (int j = 0; j < 256; ++j) {
      const int want =
          std::min(127, static_cast<int>(std::nearbyint(iscale * xb[j])));
      EXPECT_EQ(static_cast<int8_t>(p[4 + j]), want) << b << " " << j;
      bsum[j / 16] += want;
    }
    for (int g = 0; g < 16; ++g) {
      EXPECT_EQ(static_cast<int16_t>(GetU16(p + 260 + 2 * g)), bsum[g]);
    }
  }
}

// ---------------------------------------------------------------------------
// VecDot on hand-built blocks. All scales are powers of two and all values
// small, so every expected value below is exact in float and in double.

// Quants cycling through a range, with a per-block phase.
std::vector<int> Cycle(int count, int lo, int hi, int phase) {
  std::vector<int> q(count);
  for (int j = 0; j < count; ++j) q[j] = lo + (j * 7 + phase) % (hi - lo + 1);
  return q;
}

TEST(VecDotTest, Q4_0) {
  // Two blocks: w = d_w * (q - 8), x = d_x * qx;
  // expected = sum_b sumi_b * d_w_b * d_x_b.
  const float dw[2] = {0.5f, -2.0f};
  const float dx[2] = {0.25f, 0.125f};
  std::vector<uint8_t> w(36), a(68);
  double want = 0.0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<int> q = Cycle(32, 0, 15, b);
    const std::vector<int> qx = Cycle(32, -128, 127, 3 * b + 1);
    EncodeQ4_0(dw[b], q.data(), w.data() + 18 * b);
    EncodeQ8_0(dx[b], qx.data(), a.data() + 34 * b);
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += (q[j] - 8) * qx[j];
    want += static_cast<double>(sumi) * dw[b] * dx[b];
  }
  EXPECT_EQ(VecDot(GgmlType::kQ4_0, w.data(), a.data(), 64), want);
}

TEST(VecDotTest, Q4_1UsesStoredSum) {
  // expected = sum_b (d_w * d_x) * sumi + m_w * s_x, with s_x taken from
  // the activation block even when it is not d_x * sum(qx) (block 1).
  const float dw[2] = {0.5f, 0.25f}, mw[2] = {-1.5f, 3.0f};
  const float dx[2] = {0.125f, 1.0f}, sx[2] = {0.0f, 10.0f};
  std::vector<uint8_t> w(40), a(72);
  double want = 0.0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<int> q = Cycle(32, 0, 15, b + 5);
    const std::vector<int> qx = Cycle(32, -100, 100, b);
    int sum_qx = 0;
    for (int v : qx) sum_qx += v;
    // Block 0: the consistent s (as stored, rounded to f16).
    const float s = b == 0 ? Fp16ToFp32(Fp32ToFp16(dx[b] * sum_qx)) : sx[b];
    EncodeQ4_1(dw[b], mw[b], q.data(), w.data() + 20 * b);
    EncodeQ8_1(dx[b], s, qx.data(), a.data() + 36 * b);
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += q[j] * qx[j];
    want += double{dw[b]} * dx[b] * sumi + double{mw[b]} * s;
  }
  EXPECT_EQ(VecDot(GgmlType::kQ4_1, w.data(), a.data(), 64), want);
}

TEST(VecDotTest, Q5_0) {
  const float dw[2] = {0.25f, 4.0f}, dx[2] = {0.5f, 0.0625f};
  std::vector<uint8_t> w(44), a(68);
  double want = 0.0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<int> q = Cycle(32, 0, 31, 11 * b);
    const std::vector<int> qx = Cycle(32, -127, 127, b + 2);
    EncodeQ5_0(dw[b], q.data(), w.data() + 22 * b);
    EncodeQ8_0(dx[b], qx.data(), a.data() + 34 * b);
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += (q[j] - 16) * qx[j];
    want += double{dw[b]} * dx[b] * sumi;
  }
  EXPECT_EQ(VecDot(GgmlType::kQ5_0, w.data(), a.data(), 64), want);
}

TEST(VecDotTest, Q5_1UsesStoredSum) {
  const float dw[2] = {0.125f, 1.0f}, mw[2] = {2.0f, -0.5f};
  const float dx[2] = {0.5f, 0.25f}, sx[2] = {-3.0f, 7.5f};
  std::vector<uint8_t> w(48), a(72);
  double want = 0.0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<int> q = Cycle(32, 0, 31, 3 + b);
    const std::vector<int> qx = Cycle(32, -128, 127, 9 * b);
    EncodeQ5_1(dw[b], mw[b], q.data(), w.data() + 24 * b);
    EncodeQ8_1(dx[b], sx[b], qx.data(), a.data() + 36 * b);
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += q[j] * qx[j];
    want += double{dw[b]} * dx[b] * sumi + double{mw[b]} * sx[b];
  }
  EXPECT_EQ(VecDot(GgmlType::kQ5_1, w.data(), a.data(), 64), want);
}

TEST(VecDotTest, Q8_0) {
  const float dw[2] = {0.5f, 0.03125f}, dx[2] = {2.0f, 0.25f};
  std::vector<uint8_t> w(68), a(68);
  double want = 0.0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<int> q = Cycle(32, -128, 127, 5 * b);
    const std::vector<int> qx = Cycle(32, -128, 127, 17 + b);
    EncodeQ8_0(dw[b], q.data(), w.data() + 34 * b);
    EncodeQ8_0(dx[b], qx.data(), a.data() + 34 * b);
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += q[j] * qx[j];
    want += double{dw[b]} * dx[b] * sumi;
  }
  EXPECT_EQ(VecDot(GgmlType::kQ8_0, w.data(), a.data(), 64), want);
}

// K-quants: expected = sum over super-blocks of
//   d_w * d_x * sum_sub sc[sub] * sum_{e in sub} q[e] * qx[e]
//   - dmin_w * d_x * sum_{g < 16} bsums[g] * mn[g / 2]
// where bsums come from the activation block; super-block 0 has consistent
// bsums, super-block 1 deliberately not (the formula must still hold).
void CheckKQuant(GgmlType type) {
  // d_w * d_x and dmin_w * d_x are +-1/8 in both super-blocks, and the
  // integer sums stay below 2^20 (checked), so every float operation of the
  // kernel is exact.
  const float dw[2] = {0.5f, 0.25f}, dmin[2] = {0.5f, 0.25f};
  const float dx[2] = {0.25f, -0.5f};
  const int block_bytes = type == GgmlType::kQ4_K ? 144 : 176;
  const int qmax = type == GgmlType::kQ4_K ? 15 : 31;
  std::vector<uint8_t> w(2 * block_bytes), a(2 * 292);
  double want = 0.0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<int> sc = Cycle(8, 0, 63, 13 * b + 1);
    const std::vector<int> mn = Cycle(8, 0, 63, 29 * b + 6);
    const std::vector<int> q = Cycle(256, 0, qmax, b);
    const std::vector<int> qx = Cycle(256, -128, 127, 40 * b + 3);
    std::vector<int> bsums(16, 0);
    for (int e = 0; e < 256; ++e) bsums[e / 16] += qx[e];
    if (b == 1) bsums[3] += 1000;
    if (type == GgmlType::kQ4_K) {
      EncodeQ4_K(dw[b], dmin[b], sc.data(), mn.data(), q.data(),
                 w.data() + block_bytes * b);
    } else {
      EncodeQ5_K(dw[b], dmin[b], sc.data(), mn.data(), q.data(),
                 w.data() + block_bytes * b);
    }
    EncodeQ8_K(dx[b], qx.data(), bsums.data(), a.data() + 292 * b);
    int64_t isum = 0;
    for (int e = 0; e < 256; ++e) isum += int64_t{sc[e / 32]} * q[e] * qx[e];
    int64_t msum = 0;
    for (int g = 0; g < 16; ++g) msum += int64_t{bsums[g]} * mn[g / 2];
    ASSERT_LT(std::abs(isum), 1 << 20);
    ASSERT_LT(std::abs(msum), 1 << 20);
    want += double{dw[b]} * dx[b] * isum - double{dmin[b]} * dx[b] * msum;
  }
  EXPECT_EQ(VecDot(type, w.data(), a.data(), 512), want) << Name(type);
}

TEST(VecDotTest, Q4_K) { CheckKQuant(GgmlType::kQ4_K); }
TEST(VecDotTest, Q5_K) { CheckKQuant(GgmlType::kQ5_K); }

TEST(VecDotTest, Q6_K) {
  // expected = sum_b d_w * d_x * sum_e sc[e / 16] * (q[e] - 32) * qx[e],
  // with signed 8-bit sub-block scales.
  // d_w * d_x = 1/8 in both super-blocks and |isum| < 2^22 (checked), so
  // every partial sum is a multiple of 1/8 below 2^21: exact in float.
  const float dw[2] = {0.25f, 0.0625f}, dx[2] = {0.5f, 2.0f};
  std::vector<uint8_t> w(2 * 210), a(2 * 292);
  double want = 0.0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<int> sc = Cycle(16, -128, 127, 50 * b + 9);
    const std::vector<int> q = Cycle(256, 0, 63, 5 * b);
    const std::vector<int> qx = Cycle(256, -128, 127, 7 * b + 100);
    std::vector<int> bsums(16, 0);
    for (int e = 0; e < 256; ++e) bsums[e / 16] += qx[e];
    EncodeQ6_K(dw[b], sc.data(), q.data(), w.data() + 210 * b);
    EncodeQ8_K(dx[b], qx.data(), bsums.data(), a.data() + 292 * b);
    int64_t isum = 0;
    for (int e = 0; e < 256; ++e)
      isum += int64_t{sc[e / 16]} * (q[e] - 32) * qx[e];
    ASSERT_LT(std::abs(isum), 1 << 22);
    want += double{dw[b]} * dx[b] * isum;
  }
  EXPECT_EQ(VecDot(GgmlType::kQ6_K, w.data(), a.data(), 512), want);
}

TEST(VecDotTest, PlainTypes) {
  // n = 37 (not a multiple of the 16 lanes): w_i = (i % 9 - 4) / 4,
  // x_i = (i % 5 - 2) / 2, all exact in f16, bf16 and f32.
  const int n = 37;
  std::vector<float> wf(n), xf(n);
  double want = 0.0;
  for (int i = 0; i < n; ++i) {
    wf[i] = (i % 9 - 4) / 4.0f;
    xf[i] = (i % 5 - 2) / 2.0f;
    want += double{wf[i]} * xf[i];
  }
  std::vector<uint8_t> w16(2 * n), wb16(2 * n), a(4 * n);
  for (int i = 0; i < n; ++i) {
    PutU16(&w16[2 * i], Fp32ToFp16(wf[i]));
    PutU16(&wb16[2 * i],
           static_cast<uint16_t>(std::bit_cast<uint32_t>(wf[i]) >> 16));
  }
  QuantizeActivations(GgmlType::kF32, xf.data(), n, a.data());
  EXPECT_EQ(VecDot(GgmlType::kF32, wf.data(), a.data(), n), want);
  QuantizeActivations(GgmlType::kF16, xf.data(), n, a.data());
  EXPECT_EQ(VecDot(GgmlType::kF16, w16.data(), a.data(), n), want);
  QuantizeActivations(GgmlType::kBF16, xf.data(), n, a.data());
  EXPECT_EQ(VecDot(GgmlType::kBF16, wb16.data(), a.data(), n), want);
}

TEST(VecDotTest, EveryHalfDecodesLikeFp16ToFp32) {
  // One-element F16 dot products with x = 1 expose the kernel's own f16
  // decoding for all 65536 bit patterns.
  const uint8_t one[2] = {0x00, 0x3C};
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint8_t w[2];
    PutU16(w, static_cast<uint16_t>(h));
    const float got = VecDot(GgmlType::kF16, w, one, 1);
    const float want = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(got, want) << std::hex << h;
    }
  }
}

TEST(VecDotTest, UnsupportedTypeGivesNaN) {
  uint8_t buf[512] = {};
  EXPECT_TRUE(std::isnan(VecDot(GgmlType::kQ2_K, buf, buf, 256)));
}

// ---------------------------------------------------------------------------
// Random rows against a double-precision reference.

struct RandomWeights {
  std::vector<uint8_t> bytes;
  // Largest |offset| in any element (Q4_1/Q5_1 m, K-quant dmin * min): the
  // kernel sums d*q*x and offset*x separately, so the float rounding bound
  // scales with |w| + 2 * max_offset rather than |w|.
  double max_offset = 0.0;
  std::vector<double> block_m;  // Q4_1 / Q5_1: m per block
};

float RandomScale(std::mt19937& rng, float lo, float hi, bool allow_negative) {
  std::uniform_real_distribution<float> u(lo, hi);
  float v = u(rng);
  if (allow_negative && (rng() & 1)) v = -v;
  return Fp16ToFp32(Fp32ToFp16(v));
}

// `rows` rows of n elements of `type` with random quants and scales of
// realistic magnitude.
RandomWeights MakeRandomWeights(GgmlType type, int64_t rows, int64_t n,
                                std::mt19937& rng) {
  RandomWeights out;
  const int64_t total = rows * n;
  std::uniform_int_distribution<int> q4(0, 15), q5(0, 31), q6(0, 63),
      q8(-128, 127), s6(0, 63);
  std::uniform_real_distribution<float> uw(-2.0f, 2.0f);
  switch (type) {
    case GgmlType::kF32:
      out.bytes.resize(4 * total);
      for (int64_t i = 0; i < total; ++i) PutF32(&out.bytes[4 * i], uw(rng));
      break;
    case GgmlType::kF16:
      out.bytes.resize(2 * total);
      for (int64_t i = 0; i < total; ++i) PutF16(&out.bytes[2 * i], uw(rng));
      break;
    case GgmlType::kBF16:
      out.bytes.resize(2 * total);
      for (int64_t i = 0; i < total; ++i) {
        PutU16(&out.bytes[2 * i],
               static_cast<uint16_t>(std::bit_cast<uint32_t>(uw(rng)) >> 16));
      }
      break;
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0: {
      const int bytes = type == GgmlType::kQ4_0   ? 18
                        : type == GgmlType::kQ4_1 ? 20
                        : type == GgmlType::kQ5_0 ? 22
                        : type == GgmlType::kQ5_1 ? 24
                                                  : 34;
      out.bytes.resize(total / 32 * bytes);
      std::vector<int> q(32);
      for (int64_t b = 0; b < total / 32; ++b) {
        const float d = RandomScale(rng, 0.002f, 0.05f, true);
        const float m = RandomScale(rng, 0.0f, 0.5f, true);
        uint8_t* p = &out.bytes[bytes * b];
        for (int& v : q) {
          v = type == GgmlType::kQ8_0                                ? q8(rng)
              : (type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1) ? q4(rng)
                                                                     : q5(rng);
        }
        switch (type) {
          case GgmlType::kQ4_0:
            EncodeQ4_0(d, q.data(), p);
            break;
          case GgmlType::kQ4_1:
            EncodeQ4_1(d, m, q.data(), p);
            break;
          case GgmlType::kQ5_0:
            EncodeQ5_0(d, q.data(), p);
            break;
          case GgmlType::kQ5_1:
            EncodeQ5_1(d, m, q.data(), p);
            break;
          default:
            EncodeQ8_0(d, q.data(), p);
            break;
        }
        if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1) {
          out.block_m.push_back(m);
          out.max_offset = std::max(out.max_offset, std::fabs(double{m}));
        }
      }
      break;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: {
      const int bytes = type == GgmlType::kQ4_K   ? 144
                        : type == GgmlType::kQ5_K ? 176
                                                  : 210;
      out.bytes.resize(total / 256 * bytes);
      std::vector<int> q(256), sc(16), mn(8);
      for (int64_t b = 0; b < total / 256; ++b) {
        uint8_t* p = &out.bytes[bytes * b];
        if (type == GgmlType::kQ6_K) {
          const float d = RandomScale(rng, 1e-4f, 1e-3f, true);
          for (int& v : q) v = q6(rng);
          for (int& v : sc) v = q8(rng);
          EncodeQ6_K(d, sc.data(), q.data(), p);
          continue;
        }
        const float d = RandomScale(rng, 1e-4f, 2e-3f, false);
        const float dmin = RandomScale(rng, 1e-4f, 2e-3f, false);
        for (int& v : q) v = type == GgmlType::kQ4_K ? q4(rng) : q5(rng);
        for (int j = 0; j < 8; ++j) {
          sc[j] = s6(rng);
          mn[j] = s6(rng);
        }
        if (type == GgmlType::kQ4_K) {
          EncodeQ4_K(d, dmin, sc.data(), mn.data(), q.data(), p);
        } else {
          EncodeQ5_K(d, dmin, sc.data(), mn.data(), q.data(), p);
        }
        out.max_offset = std::max(out.max_offset, 63.0 * dmin);
      }
      break;
    }
    default:
      ADD_FAILURE() << "no generator for " << Name(type);
  }
  return out;
}

// Activation rows with magnitudes that vary from block to block, and a few
// outliers, like real hidden states.
std::vector<float> MakeRandomActivations(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) {
    x[i] = g(rng) * std::ldexp(1.0f, static_cast<int>((i / 32) % 7) - 3);
    if (i % 97 == 0) x[i] *= 20.0f;
  }
  return x;
}

// The kernel rounds each product or block term once or twice and performs at
// most n/16 + 16 float additions along any accumulation path, each partial
// sum bounded by `magnitude` (the sum of |terms|); so
// |got - exact| <= (n/16 + 18) * 2^-24 * magnitude. Twice that is allowed.
double RoundingTolerance(int64_t n, double magnitude) {
  return 2.0 * (static_cast<double>(n) / 16.0 + 18.0) * std::ldexp(1.0, -24) *
         magnitude;
}

TEST(VecDotTest, RandomRowsMatchDoubleReference) {
  std::mt19937 rng(1234);
  const int64_t n = 1536;  // 6 K-quant super-blocks, 48 blocks of 32
  const int64_t rows = 3;
  for (const TypePair& p : kPairs) {
    SCOPED_TRACE(Name(p.weight));
    const RandomWeights w = MakeRandomWeights(p.weight, rows, n, rng);
    const std::vector<float> x = MakeRandomActivations(n, rng);
    std::vector<uint8_t> a(ActivationRowBytes(p.act, n));
    QuantizeActivations(p.act, x.data(), n, a.data());
    const DecodedActivations xa = DecodeActivations(p.act, a.data(), n);
    const int64_t row_bytes = static_cast<int64_t>(*GgmlTypeBytes(p.weight, n));
    std::vector<float> wf(n);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* wr = w.bytes.data() + r * row_bytes;
      ASSERT_TRUE(DequantizeRow(p.weight, wr, n, wf.data()).ok());
      double want = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        want += double{wf[i]} * xa.x[i];
        magnitude +=
            (std::fabs(wf[i]) + 2.0 * w.max_offset) * std::fabs(xa.x[i]);
      }
      // Q8_1: the kernel uses m_w * s_x, where s_x is d_x * sum(q_x) rounded
      // to f16; the dequantized product has m_w * d_x * sum(q_x) instead.
      for (size_t b = 0; b < xa.s.size(); ++b) {
        const double m = w.block_m[r * (n / 32) + b];
        want += m * (xa.s[b] - xa.dsum[b]);
        magnitude += std::fabs(m * xa.s[b]);
      }
      const float got = VecDot(p.weight, wr, a.data(), n);
      EXPECT_NEAR(got, want, RoundingTolerance(n, magnitude)) << "row " << r;
    }
  }
}

// The kernels picked for this CPU (AVX2 for Q4_0, Q4_1, Q8_0 where the CPU
// has it) equal the portable ones bit for bit, odd lengths and the extreme
// quant values (-128) included.
TEST(VecDotTest, DispatchedKernelsEqualTheScalarReferenceBitwise) {
  std::mt19937 rng(77);
  for (const int64_t n : {32, 256, 576, 1536}) {
    for (const TypePair& p : kPairs) {
      if (n % 256 != 0 &&
          (p.weight == GgmlType::kQ4_K || p.weight == GgmlType::kQ5_K ||
           p.weight == GgmlType::kQ6_K)) {
        continue;
      }
      SCOPED_TRACE(Name(p.weight));
      const int64_t rows = 8;
      RandomWeights w = MakeRandomWeights(p.weight, rows, n, rng);
      const std::vector<float> x = MakeRandomActivations(n, rng);
      std::vector<uint8_t> a(ActivationRowBytes(p.act, n));
      QuantizeActivations(p.act, x.data(), n, a.data());
      const int64_t row_bytes =
          static_cast<int64_t>(*GgmlTypeBytes(p.weight, n));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* wr = w.bytes.data() + r * row_bytes;
        const float got = VecDot(p.weight, wr, a.data(), n);
        const float want = VecDotReference(p.weight, wr, a.data(), n);
        EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
            << "n=" << n << " row " << r << ": " << got << " vs " << want;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// MatMulRows.

TEST(MatMulRowsTest, EqualsVecDotBitwise) {
  std::mt19937 rng(99);
  const int64_t n = 512;
  const int64_t rows = 37;
  const int max_tokens = 17;
  const float kSentinel = -12345.5f;
  for (const TypePair& p : kPairs) {
    SCOPED_TRACE(Name(p.weight));
    const RandomWeights w = MakeRandomWeights(p.weight, rows, n, rng);
    const std::vector<float> x = MakeRandomActivations(n * max_tokens, rng);
    const int64_t act_bytes = ActivationRowBytes(p.act, n);
    std::vector<uint8_t> a(act_bytes * max_tokens);
    for (int t = 0; t < max_tokens; ++t) {
      QuantizeActivations(p.act, x.data() + n * t, n, a.data() + act_bytes * t);
    }
    const int64_t row_bytes = static_cast<int64_t>(*GgmlTypeBytes(p.weight, n));
    const int64_t stride = rows + 3;
    for (int n_tokens : {1, 2, 5, 17}) {
      for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
               {0, rows}, {3, 20}, {36, 37}, {5, 5}, {1, 34}}) {
        std::vector<float> out(stride * n_tokens, kSentinel);
        MatMulRows(p.weight, w.bytes.data(), n, begin, end, a.data(), n_tokens,
                   out.data(), stride);
        for (int t = 0; t < n_tokens; ++t) {
          for (int64_t r = 0; r < stride; ++r) {
            const float got = out[t * stride + r];
            if (r < begin || r >= end) {
              ASSERT_EQ(got, kSentinel)
                  << "wrote outside rows, t=" << t << " r=" << r;
              continue;
            }
            const float want = VecDot(p.weight, w.bytes.data() + r * row_bytes,
                                      a.data() + act_bytes * t, n);
            ASSERT_EQ(std::bit_cast<uint32_t>(got),
                      std::bit_cast<uint32_t>(want))
                << "tokens=" << n_tokens << " rows [" << begin << ", " << end
                << ") t=" << t << " r=" << r;
          }
        }
      }
    }
  }
}

// MatMulRows as dispatched on this CPU (AVX-512 VNNI register tiles of 4
// rows x 4 tokens for Q4_0 / Q4_1 / Q8_0 where the CPU has them) equals the
// portable scalar kernel bit for bit on shapes that leave every kind of
// tail: rows and tokens not multiples of 4, block counts not multiples of 16
// (the scale gathers), the largest row the tiles take (512 blocks) and one
// past it (the fallback), and buffers at odd addresses.
TEST(MatMulRowsTest, EqualsTheScalarReferenceOnOddShapesBitwise) {
  std::mt19937 rng(2024);
  for (const GgmlType type :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    const GgmlType act_type = *VecDotType(type);
    for (const int64_t n : {32, 96, 544, 16384, 16416}) {
      const int64_t rows = n > 1000 ? 6 : 11;
      const int max_tokens = n > 1000 ? 5 : 9;
      SCOPED_TRACE(absl::StrCat(Name(type), " n=", n));
      const RandomWeights w = MakeRandomWeights(type, rows, n, rng);
      const int64_t row_bytes = static_cast<int64_t>(*GgmlTypeBytes(type, n));
      const int64_t act_bytes = ActivationRowBytes(act_type, n);
      // One byte in: nothing may assume alignment.
      std::vector<uint8_t> wbuf(w.bytes.size() + 1);
      std::memcpy(wbuf.data() + 1, w.bytes.data(), w.bytes.size());
      std::vector<uint8_t> abuf(act_bytes * max_tokens + 1);
      const std::vector<float> x = MakeRandomActivations(n * max_tokens, rng);
      for (int t = 0; t < max_tokens; ++t) {
        QuantizeActivations(act_type, x.data() + n * t, n,
                            abuf.data() + 1 + act_bytes * t);
      }
      const uint8_t* wp = wbuf.data() + 1;
      const uint8_t* ap = abuf.data() + 1;
      for (int n_tokens = 1; n_tokens <= max_tokens; ++n_tokens) {
        // The path this CPU takes, and the one CPUs without AVX-512 take.
        std::vector<float> out(rows * n_tokens + 1);
        std::vector<float> by_dot(rows * n_tokens + 1);
        MatMulRows(type, wp, n, 1, rows, ap, n_tokens, out.data() + 1, rows);
        MatMulRowsByVecDot(type, wp, n, 1, rows, ap, n_tokens,
                           by_dot.data() + 1, rows);
        for (int t = 0; t < n_tokens; ++t) {
          for (int64_t r = 1; r < rows; ++r) {
            const float want = VecDotReference(type, wp + r * row_bytes,
                                               ap + act_bytes * t, n);
            ASSERT_EQ(std::bit_cast<uint32_t>(out[1 + t * rows + r]),
                      std::bit_cast<uint32_t>(want))
                << "tokens=" << n_tokens << " t=" << t << " r=" << r;
            ASSERT_EQ(std::bit_cast<uint32_t>(by_dot[1 + t * rows + r]),
                      std::bit_cast<uint32_t>(want))
                << "by VecDot: tokens=" << n_tokens << " t=" << t << " r=" << r;
          }
        }
      }
    }
  }
}

// Weights repacked for decode give MatMulRows' (the reference's) bits, on
// row counts that leave a partial group of 16 and ranges that start at any
// group.
TEST(PackedMatrixTest, MatVecEqualsTheScalarReferenceBitwise) {
  std::mt19937 rng(31);
  for (const GgmlType type :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    for (const int64_t n : {32, 544, 1536}) {
      const int64_t rows = 45;
      SCOPED_TRACE(absl::StrCat(Name(type), " n=", n));
      const RandomWeights w = MakeRandomWeights(type, rows, n, rng);
      const std::unique_ptr<PackedMatrix> packed =
          PackedMatrix::Pack(type, w.bytes.data(), rows, n);
      if (packed == nullptr) GTEST_SKIP() << "no packed kernel on this CPU";
      const GgmlType act_type = *VecDotType(type);
      std::vector<uint8_t> a(ActivationRowBytes(act_type, n));
      const std::vector<float> x = MakeRandomActivations(n, rng);
      QuantizeActivations(act_type, x.data(), n, a.data());
      const int64_t row_bytes = static_cast<int64_t>(*GgmlTypeBytes(type, n));
      for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
               {0, rows}, {16, 45}, {32, 33}, {0, 16}}) {
        std::vector<float> out(rows + 1, -7.0f);
        packed->MatMul(begin, end, a.data(), 1, out.data(), rows + 1);
        for (int64_t r = 0; r <= rows; ++r) {
          if (r < begin || r >= end) {
            ASSERT_EQ(out[r], -7.0f) << "wrote outside the range: " << r;
            continue;
          }
          const float want = VecDotReference(
              type, w.bytes.data() + r * row_bytes, a.data(), n);
          ASSERT_EQ(std::bit_cast<uint32_t>(out[r]),
                    std::bit_cast<uint32_t>(want))
              << "[" << begin << ", " << end << ") r=" << r;
        }
      }
    }
  }
  EXPECT_EQ(PackedMatrix::Pack(GgmlType::kQ4_K, nullptr, 4, 256), nullptr);
  // Longer rows than the kernel's scratch takes: left unpacked.
  EXPECT_EQ(PackedMatrix::Pack(GgmlType::kQ4_1, nullptr, 4, 16416), nullptr);
}

// PackInto: the packed copy lies in the caller's storage, within
// StorageBytes of it (the engine lays all matrices out back to back), and
// multiplies as Pack's own copy does, bit for bit.
TEST(PackedMatrixTest, PackIntoUsesExactlyTheCallersStorage) {
  std::mt19937 rng(41);
  for (const GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    const int64_t rows = 45, n = 544;
    SCOPED_TRACE(Name(type));
    const RandomWeights w = MakeRandomWeights(type, rows, n, rng);
    const int64_t bytes = PackedMatrix::StorageBytes(type, rows, n);
    if (bytes == 0) GTEST_SKIP() << "no packed kernel on this CPU";
    constexpr int64_t kAlign = PackedMatrix::kStorageAlignment;
    EXPECT_EQ(bytes % kAlign, 0);
    constexpr uint8_t kGuard = 0xA5;
    std::vector<uint8_t> buffer(bytes + 3 * kAlign, kGuard);
    uint8_t* storage = buffer.data() + kAlign -
                       reinterpret_cast<uintptr_t>(buffer.data()) % kAlign;
    const std::unique_ptr<PackedMatrix> into = PackedMatrix::PackInto(
        type, w.bytes.data(), rows, n, PackedArithmetic::kBlockSums, storage);
    const std::unique_ptr<PackedMatrix> own = PackedMatrix::Pack(
        type, w.bytes.data(), rows, n, PackedArithmetic::kBlockSums);
    ASSERT_NE(into, nullptr);
    ASSERT_NE(own, nullptr);
    for (uint8_t* p = buffer.data(); p < storage; ++p) ASSERT_EQ(*p, kGuard);
    for (uint8_t* p = storage + bytes; p < buffer.data() + buffer.size(); ++p) {
      ASSERT_EQ(*p, kGuard) << "wrote past StorageBytes";
    }
    const GgmlType act_type = *VecDotType(type);
    const int64_t act_bytes = ActivationRowBytes(act_type, n);
    for (const int tokens : {1, 8}) {
      std::vector<uint8_t> a(act_bytes * tokens);
      for (int t = 0; t < tokens; ++t) {
        const std::vector<float> x = MakeRandomActivations(n, rng);
        QuantizeActivations(act_type, x.data(), n, a.data() + t * act_bytes);
      }
      std::vector<float> want(rows * tokens), got(rows * tokens);
      own->MatMul(0, rows, a.data(), tokens, want.data(), rows);
      into->MatMul(0, rows, a.data(), tokens, got.data(), rows);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]),
                  std::bit_cast<uint32_t>(want[i]))
            << "tokens=" << tokens << " i=" << i;
      }
    }
    // It reads the caller's storage, not a copy.
    std::fill(storage, storage + bytes, 0);
    std::vector<float> zeroed(rows);
    std::vector<uint8_t> a(act_bytes);
    QuantizeActivations(act_type, MakeRandomActivations(n, rng).data(), n,
                        a.data());
    into->MatMul(0, rows, a.data(), 1, zeroed.data(), rows);
    for (const float v : zeroed) ASSERT_EQ(v, 0.0f);
  }
  EXPECT_EQ(PackedMatrix::StorageBytes(GgmlType::kQ4_K, 4, 256), 0);
  EXPECT_EQ(PackedMatrix::StorageBytes(GgmlType::kQ4_1, 4, 16416), 0);
}

// Several tokens against packed weights (prefill, batched decode) give the
// reference's bits for every (row, token), in either arithmetic (block sums
// from one token up: decode has a kernel of its own there too), with token
// counts that leave a partial pass (ggml's order takes two tokens per pass,
// block sums eight), partial groups, ranges starting at any group, and, for
// the 300-row matrices of long rows, more than one L2 chunk.
class PackedArithmeticTest : public testing::TestWithParam<PackedArithmetic> {};

TEST_P(PackedArithmeticTest, MatMulEqualsTheScalarReferenceBitwise) {
  const PackedArithmetic arithmetic = GetParam();
  const bool block_sums = arithmetic == PackedArithmetic::kBlockSums;
  std::mt19937 rng(37);
  for (const GgmlType type :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    for (const auto& [rows, n] : std::vector<std::pair<int64_t, int64_t>>{
             {45, 32}, {45, 544}, {300, 1536}}) {
      SCOPED_TRACE(absl::StrCat(Name(type), " rows=", rows, " n=", n));
      const RandomWeights w = MakeRandomWeights(type, rows, n, rng);
      const std::unique_ptr<PackedMatrix> packed =
          PackedMatrix::Pack(type, w.bytes.data(), rows, n, arithmetic);
      if (packed == nullptr) GTEST_SKIP() << "no packed kernel on this CPU";
      EXPECT_EQ(packed->arithmetic(), arithmetic);
      const GgmlType act_type = *VecDotType(type);
      const int64_t act_bytes = ActivationRowBytes(act_type, n);
      const int64_t row_bytes = static_cast<int64_t>(*GgmlTypeBytes(type, n));
      // 2..64 tokens take the small-batch kernels (batched decode,
      // verification passes), more the chunked prefill order.
      for (const int tokens :
           {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 18, 40, 64, 65, 66}) {
        if (tokens == 1 && !block_sums) continue;  // MatVecEquals... above
        std::vector<uint8_t> a(act_bytes * tokens);
        for (int t = 0; t < tokens; ++t) {
          const std::vector<float> x = MakeRandomActivations(n, rng);
          QuantizeActivations(act_type, x.data(), n, a.data() + t * act_bytes);
        }
        const int64_t stride = rows + 3;
        for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, rows}, {16, rows}, {32, 33}, {0, 16}}) {
          std::vector<float> out(stride * tokens, -7.0f);
          packed->MatMul(begin, end, a.data(), tokens, out.data(), stride);
          for (int t = 0; t < tokens; ++t) {
            for (int64_t r = 0; r < stride; ++r) {
              const float got = out[t * stride + r];
              if (r < begin || r >= end) {
                ASSERT_EQ(got, -7.0f)
                    << "wrote outside the range: t=" << t << " r=" << r;
                continue;
              }
              const uint8_t* row = w.bytes.data() + r * row_bytes;
              const uint8_t* token = a.data() + t * act_bytes;
              const float want =
                  block_sums ? VecDotBlockSumsReference(type, row, token, n)
                             : VecDotReference(type, row, token, n);
              ASSERT_EQ(std::bit_cast<uint32_t>(got),
                        std::bit_cast<uint32_t>(want))
                  << tokens << " tokens, [" << begin << ", " << end
                  << ") t=" << t << " r=" << r;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Arithmetics, PackedArithmeticTest,
    testing::Values(PackedArithmetic::kGgml, PackedArithmetic::kBlockSums),
    [](const testing::TestParamInfo<PackedArithmetic>& info) {
      return info.param == PackedArithmetic::kGgml ? "Ggml" : "BlockSums";
    });

// Block sums are another rounding of the same integers: as close to ggml's
// order as two float summations of the blocks can be, and not equal to it
// (else the bitwise test above could not tell the two kernels apart).
TEST(PackedMatrixTest, BlockSumsAreCloseToGgmlsOrderButNotItsBits) {
  std::mt19937 rng(41);
  for (const GgmlType type :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    SCOPED_TRACE(Name(type));
    const int64_t rows = 200, n = 1536;
    const RandomWeights w = MakeRandomWeights(type, rows, n, rng);
    const GgmlType act_type = *VecDotType(type);
    std::vector<uint8_t> a(ActivationRowBytes(act_type, n));
    const std::vector<float> x = MakeRandomActivations(n, rng);
    QuantizeActivations(act_type, x.data(), n, a.data());
    const int64_t row_bytes = static_cast<int64_t>(*GgmlTypeBytes(type, n));
    int differing = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = w.bytes.data() + r * row_bytes;
      const float ggml = VecDotReference(type, row, a.data(), n);
      const float sums = VecDotBlockSumsReference(type, row, a.data(), n);
      // Each block's product, summed by magnitude: what the roundings
      // scale with.
      double magnitude = 0.0;
      for (int64_t b = 0; b < n / 32; ++b) {
        magnitude += std::abs(VecDotBlockSumsReference(
            type, row + b * row_bytes / (n / 32),
            a.data() + b * ActivationRowBytes(act_type, 32), 32));
      }
      // Each order rounds once per block and a few times at the end.
      const double bound =
          (n / 32 + 8) * std::numeric_limits<float>::epsilon() * magnitude;
      EXPECT_LE(std::abs(ggml - sums), bound) << "r=" << r;
      differing += ggml != sums;
    }
    EXPECT_GT(differing, rows / 10);
  }
  EXPECT_TRUE(std::isnan(
      VecDotBlockSumsReference(GgmlType::kQ4_K, nullptr, nullptr, 256)));
}

TEST(MatMulRowsTest, ThreadsOnDisjointRowRangesMatchOneCall) {
  std::mt19937 rng(5);
  const int64_t n = 256, rows = 101;
  const int n_tokens = 3;
  const RandomWeights w = MakeRandomWeights(GgmlType::kQ4_K, rows, n, rng);
  const std::vector<float> x = MakeRandomActivations(n * n_tokens, rng);
  const int64_t act_bytes = ActivationRowBytes(GgmlType::kQ8_K, n);
  std::vector<uint8_t> a(act_bytes * n_tokens);
  for (int t = 0; t < n_tokens; ++t) {
    QuantizeActivations(GgmlType::kQ8_K, x.data() + n * t, n,
                        a.data() + act_bytes * t);
  }
  std::vector<float> one(rows * n_tokens), many(rows * n_tokens);
  MatMulRows(GgmlType::kQ4_K, w.bytes.data(), n, 0, rows, a.data(), n_tokens,
             one.data(), rows);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      MatMulRows(GgmlType::kQ4_K, w.bytes.data(), n, rows * k / 4,
                 rows * (k + 1) / 4, a.data(), n_tokens, many.data(), rows);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(std::memcmp(one.data(), many.data(), sizeof(float) * one.size()),
            0);
}

TEST(MatMulRowsTest, UnsupportedTypeWritesNaN) {
  uint8_t buf[1024] = {};
  float out[4] = {1, 2, 3, 4};
  MatMulRows(GgmlType::kQ3_K, buf, 256, 1, 3, buf, 1, out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 4.0f);
}

// ---------------------------------------------------------------------------
// Real model (PDSERVE_DEFAULT_MODEL): its Q4_1 attention projection and its
// Q8_0 token embedding (the tied output head) through MatMulRows.

// Rows [row_begin, row_end) of the tensor (row_end = -1: all rows).
void CheckRealTensor(const model::GgufFile& file, const std::string& name,
                     GgmlType want_type, int64_t row_begin, int64_t row_end) {
  SCOPED_TRACE(name);
  absl::StatusOr<const model::GgufTensorInfo*> t = file.FindTensor(name);
  ASSERT_TRUE(t.ok()) << t.status();
  const model::GgufTensorInfo& info = **t;
  ASSERT_EQ(info.type, want_type);
  ASSERT_EQ(info.dims.size(), 2u);
  const int64_t n = static_cast<int64_t>(info.dims[0]);
  const int64_t rows = static_cast<int64_t>(info.dims[1]);
  if (row_end < 0) row_end = rows;
  ASSERT_LE(row_end, rows);
  ASSERT_TRUE(ValidateVecDot(info.type, n).ok());
  const GgmlType act = *VecDotType(info.type);
  const int n_tokens = 3;
  std::mt19937 rng(42);
  const std::vector<float> x = MakeRandomActivations(n * n_tokens, rng);
  const int64_t act_bytes = ActivationRowBytes(act, n);
  std::vector<uint8_t> a(act_bytes * n_tokens);
  std::vector<DecodedActivations> xa;
  for (int k = 0; k < n_tokens; ++k) {
    QuantizeActivations(act, x.data() + n * k, n, a.data() + act_bytes * k);
    xa.push_back(DecodeActivations(act, a.data() + act_bytes * k, n));
  }
  std::vector<float> out(rows * n_tokens);
  MatMulRows(info.type, info.data, n, row_begin, row_end, a.data(), n_tokens,
             out.data(), rows);

  const int64_t row_bytes = static_cast<int64_t>(info.n_bytes) / rows;
  const int block_bytes = want_type == GgmlType::kQ4_1 ? 20 : 34;
  std::vector<float> wf(n);
  double worst_rel = 0.0;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* wr = info.data + r * row_bytes;
    ASSERT_TRUE(DequantizeRow(info.type, wr, n, wf.data()).ok());
    for (int k = 0; k < n_tokens; ++k) {
      const float* xk = x.data() + n * k;
      // (a) Against the dequantized activations: float rounding only.
      // (b) Against the original float activations: the activation
      //     quantization error too. Per block, with d = amax/127,
      //     |x^ - x| <= d/2 + 127 * |f16(d) - d| <= d * (1/2 + 127 * 2^-11),
      //     plus 1e-4 * d for the float rounding of x * (1/d); Q8_1's s
      //     adds |m| * |s| * 2^-11.
      double exact_q = 0.0, exact_f = 0.0, magnitude = 0.0, quant_bound = 0.0;
      for (int64_t b = 0; b < n / 32; ++b) {
        const double m = want_type == GgmlType::kQ4_1
                             ? GetF16(wr + block_bytes * b + 2)
                             : 0.0;
        double amax = 0.0, sum_abs_w = 0.0;
        for (int j = 0; j < 32; ++j) {
          const int64_t i = 32 * b + j;
          exact_q += double{wf[i]} * xa[k].x[i];
          exact_f += double{wf[i]} * xk[i];
          magnitude +=
              (std::fabs(wf[i]) + 2.0 * std::fabs(m)) * std::fabs(xa[k].x[i]);
          amax = std::max(amax, std::fabs(double{xk[i]}));
          sum_abs_w += std::fabs(wf[i]);
        }
        quant_bound +=
            sum_abs_w * (amax / 127.0) * (0.5 + 127.0 / 2048.0 + 1e-4);
        if (!xa[k].s.empty()) {
          exact_q += m * (xa[k].s[b] - xa[k].dsum[b]);
          magnitude += std::fabs(m * xa[k].s[b]);
          quant_bound += std::fabs(m * xa[k].s[b]) / 2048.0;
        }
      }
      const float got = out[k * rows + r];
      const double tol = RoundingTolerance(n, magnitude);
      ASSERT_NEAR(got, exact_q, tol) << "row " << r << " token " << k;
      ASSERT_NEAR(got, exact_f, quant_bound + tol)
          << "row " << r << " token " << k;
      worst_rel =
          std::max(worst_rel, std::fabs(got - exact_f) / (quant_bound + tol));
    }
  }
  ::testing::Test::RecordProperty(name + "_worst_error_over_bound",
                                  std::to_string(worst_rel));
}

TEST(MatMulRowsTest, RealModel) {
  const std::string path = model::FindDefaultModel();
  if (path.empty()) GTEST_SKIP() << model::kNoDefaultModel;
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file =
      model::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  CheckRealTensor(**file, "blk.0.attn_q.weight", GgmlType::kQ4_1, 0, -1);
  // The tied output head; an odd range of its 49152 rows keeps this fast.
  CheckRealTensor(**file, "token_embd.weight", GgmlType::kQ8_0, 1001, 5096);
}

}  // namespace
}  // namespace pdserve::kernels
