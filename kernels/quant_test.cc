#include "kernels/quant.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/ggml_type.h"
#include "model/default_model.h"
#include "model/gguf.h"

namespace pdserve::kernels {
namespace {

// Half-precision bit patterns used for block scales.
constexpr uint16_t kHalfQuarter = 0x3400;   // 0.25
constexpr uint16_t kHalfHalf = 0x3800;      // 0.5
constexpr uint16_t kHalfOne = 0x3C00;       // 1.0
constexpr uint16_t kHalfMinusOne = 0xBC00;  // -1.0
constexpr uint16_t kHalfMinusTwo = 0xC000;  // -2.0

void PutU16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v & 0xFF);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

// x[i] for the dot-product tests: varied signs and magnitudes.
std::vector<float> TestVector(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.375f +
           static_cast<float>(i % 5) * 0.0625f;
  }
  return x;
}

double ReferenceDot(const std::vector<float>& a, const std::vector<float>& x) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += double{a[i]} * double{x[i]};
  return s;
}

// Dequantizes `blocks` (n elements) and expects exactly `expected`; then
// expects DotRow with TestVector to match the test's own dot product.
void CheckRow(GgmlType type, const std::vector<uint8_t>& blocks,
              const std::vector<float>& expected) {
  const int64_t n = static_cast<int64_t>(expected.size());
  std::vector<float> out(n, -12345.0f);
  ASSERT_TRUE(DequantizeRow(type, blocks.data(), n, out.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], expected[i]) << GgmlTypeName(type) << " i=" << i;
  }
  const std::vector<float> x = TestVector(n);
  const double want = ReferenceDot(expected, x);
  absl::StatusOr<float> got = DotRow(type, blocks.data(), x.data(), n);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NEAR(*got, want, 1e-4 * std::max(1.0, std::fabs(want)))
      << GgmlTypeName(type);
}

// ---------------------------------------------------------------------------
// Conversions.

// The row conversions (vector instructions where the CPU has them) equal
// the scalar ones bit for bit: every half, and floats around every rounding
// edge (ties, subnormals, overflow, infinities, NaNs), on lengths that leave
// tails.
// E4M3 against its definition: every code decodes to sign * 2^(e-7) *
// (1 + m/8) (subnormals m/8 * 2^-6), encodes back to itself, and floats in
// between round to the nearer code, ties to the even one; past 448 they
// saturate.
TEST(Fp8E4M3Test, EveryCodeRoundTripsAndHalfwayValuesTieToEven) {
  EXPECT_EQ(Fp8E4M3ToFp32(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFp32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(Fp8E4M3ToFp32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToFp32(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToFp32(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFp32(0x7F)));
  std::vector<float> finite;  // ascending positive values of codes 0..0x7E
  for (int code = 0; code < 256; ++code) {
    const float v = Fp8E4M3ToFp32(static_cast<uint8_t>(code));
    if (std::isnan(v)) continue;
    if (v == 0.0f) {
      EXPECT_EQ(Fp32ToFp8E4M3(v), code) << code;  // +0 and -0 keep signs
      continue;
    }
    EXPECT_EQ(Fp32ToFp8E4M3(v), code) << code;
    if (code < 0x80) finite.push_back(v);
  }
  ASSERT_EQ(finite.size(), 126u);
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    const float lo = finite[i], hi = finite[i + 1];
    const int lo_code = static_cast<int>(i) + 1, hi_code = lo_code + 1;
    const float mid = 0.5f * (lo + hi);  // exact: a few bits
    EXPECT_EQ(Fp32ToFp8E4M3(std::nextafter(mid, 0.0f)), lo_code) << lo;
    EXPECT_EQ(Fp32ToFp8E4M3(std::nextafter(mid, 1e9f)), hi_code) << lo;
    EXPECT_EQ(Fp32ToFp8E4M3(mid), lo_code % 2 == 0 ? lo_code : hi_code) << lo;
    EXPECT_EQ(Fp32ToFp8E4M3(-mid), 0x80 | Fp32ToFp8E4M3(mid));
  }
  EXPECT_EQ(Fp32ToFp8E4M3(1000.0f), 0x7E);
  EXPECT_EQ(Fp32ToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(Fp32ToFp8E4M3(std::ldexp(1.0f, -11)), 0x00);  // below half 2^-9
  // The row forms: fp16 of the same values.
  std::vector<uint8_t> codes(256);
  std::vector<uint16_t> halves(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  Fp8E4M3ToFp16Row(codes.data(), 256, halves.data());
  for (int i = 0; i < 256; ++i) {
    const float v = Fp8E4M3ToFp32(static_cast<uint8_t>(i));
    if (std::isnan(v)) continue;
    EXPECT_EQ(Fp16ToFp32(halves[i]), v) << i;
  }
}

TEST(Fp16RowTest, RowConversionsEqualTheScalarOnes) {
  std::vector<uint16_t> halves(65536 + 7);
  for (size_t i = 0; i < halves.size(); ++i) {
    halves[i] = static_cast<uint16_t>(i);
  }
  std::vector<float> widened(halves.size());
  Fp16ToFp32Row(halves.data(), static_cast<int64_t>(halves.size()),
                widened.data());
  for (size_t i = 0; i < halves.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(widened[i]),
              std::bit_cast<uint32_t>(Fp16ToFp32(halves[i])))
        << i;
  }
  std::vector<float> floats;
  for (uint32_t h = 0; h < 65536; h += 3) {
    // Each half, its neighbours half an ulp away (ties) and just beside.
    const uint32_t f =
        std::bit_cast<uint32_t>(Fp16ToFp32(static_cast<uint16_t>(h)));
    for (int32_t delta : {0, 0x1000, 0x0FFF, 0x1001, -1, 1, 0x7FF}) {
      floats.push_back(std::bit_cast<float>(f + delta));
    }
  }
  for (uint32_t bits :
       {0x7F800000u, 0xFF800000u, 0x7FC00001u, 0x7F800001u, 0x477FF000u,
        0x477FF001u, 0x33000000u, 0x33000001u, 0x00000001u, 0x80000000u}) {
    floats.push_back(std::bit_cast<float>(bits));
  }
  std::vector<uint16_t> narrowed(floats.size());
  Fp32ToFp16Row(floats.data(), static_cast<int64_t>(floats.size()),
                narrowed.data());
  for (size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(narrowed[i], Fp32ToFp16(floats[i]))
        << std::hex << std::bit_cast<uint32_t>(floats[i]);
  }
}

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x3800), 0.5f);
  EXPECT_EQ(Fp16ToFp32(0x3555), 0.333251953125f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0400), 6.103515625e-05f);  // 2^-14, smallest normal
  EXPECT_EQ(Fp16ToFp32(0x0001), 5.9604644775390625e-08f);  // 2^-24
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x03FF), 6.0975551605224609375e-05f);  // 1023 * 2^-24
  EXPECT_EQ(Fp16ToFp32(0x8001), -5.9604644775390625e-08f);
  EXPECT_EQ(Fp16ToFp32(0x0000), 0.0f);
  EXPECT_FALSE(std::signbit(Fp16ToFp32(0x0000)));
  EXPECT_EQ(Fp16ToFp32(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(Fp16ToFp32(0x8000)));
  EXPECT_EQ(Fp16ToFp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp16ToFp32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7E00)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7C01)));  // signalling-NaN pattern
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0xFFFF)));
}

TEST(Fp16Test, FromFloat) {
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xC000);
  EXPECT_EQ(Fp32ToFp16(0.5f), 0x3800);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);  // below the halfway point
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // halfway, ties to even -> inf
  EXPECT_EQ(Fp32ToFp16(1e10f), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(-1e10f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp tie -> 2
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie, even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(Fp32ToFp16(1e-30f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::infinity()), 0x7C00);
  const uint16_t nan = Fp32ToFp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(Fp16Test, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(Fp32ToFp16(f), h) << std::hex << h;
  }
}

TEST(Bf16Test, KnownValues) {
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Bf16ToFp32(0x3F00), 0.5f);
  EXPECT_EQ(Bf16ToFp32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Bf16ToFp32(0x7FC0)));
}

// ---------------------------------------------------------------------------
// Plain types.

TEST(QuantTest, F32) {
  const std::vector<float> values = {1.5f, -2.25f, 0.0f, 1e-3f, 3e5f};
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  CheckRow(GgmlType::kF32, bytes, values);
}

TEST(QuantTest, F16) {
  // 1, -2, 0.5, 65504, 2^-24, -0.25, 0.333251953125
  const std::vector<uint16_t> halves = {0x3C00, 0xC000, 0x3800, 0x7BFF,
                                        0x0001, 0xB400, 0x3555};
  const std::vector<float> expected = {
      1.0f,   -2.0f,          0.5f, 65504.0f, 5.9604644775390625e-08f,
      -0.25f, 0.333251953125f};
  std::vector<uint8_t> bytes(halves.size() * 2);
  for (size_t i = 0; i < halves.size(); ++i) PutU16(bytes, 2 * i, halves[i]);
  CheckRow(GgmlType::kF16, bytes, expected);
}

TEST(QuantTest, Bf16) {
  const std::vector<uint16_t> raw = {0x3F80, 0xC000, 0x3F00, 0x4049, 0xBE80};
  const std::vector<float> expected = {1.0f, -2.0f, 0.5f, 3.140625f, -0.25f};
  std::vector<uint8_t> bytes(raw.size() * 2);
  for (size_t i = 0; i < raw.size(); ++i) PutU16(bytes, 2 * i, raw[i]);
  CheckRow(GgmlType::kBF16, bytes, expected);
}

TEST(QuantTest, LongF16RowCrossesChunks) {
  // 1000 elements: several 256-element chunks plus a ragged tail.
  const int n = 1000;
  std::vector<uint8_t> bytes(2 * n);
  std::vector<float> expected(n);
  for (int i = 0; i < n; ++i) {
    const int k = i % 9 - 4;  // -4..4
    // k * 0.5 as fp16: 0, +-0.5 (0x3800), +-1 (0x3C00), +-1.5 (0x3E00),
    // +-2 (0x4000).
    static constexpr uint16_t kMag[5] = {0x0000, 0x3800, 0x3C00, 0x3E00,
                                         0x4000};
    const uint16_t h =
        static_cast<uint16_t>(kMag[k < 0 ? -k : k] | (k < 0 ? 0x8000 : 0));
    PutU16(bytes, 2 * i, h);
    expected[i] = 0.5f * static_cast<float>(k);
  }
  CheckRow(GgmlType::kF16, bytes, expected);
}

// ---------------------------------------------------------------------------
// 32-element block types.

TEST(QuantTest, Q8_0TwoBlocks) {
  std::vector<uint8_t> b(2 * 34);
  std::vector<float> expected(64);
  PutU16(b, 0, kHalfHalf);  // block 0: d = 0.5, q = j - 16
  for (int j = 0; j < 32; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
    expected[j] = 0.5f * static_cast<float>(j - 16);
  }
  PutU16(b, 34, kHalfMinusTwo);  // block 1: d = -2, q alternates -128, 127
  for (int j = 0; j < 32; ++j) {
    b[36 + j] = (j % 2 == 0) ? 0x80 : 0x7F;
    expected[32 + j] = (j % 2 == 0) ? 256.0f : -254.0f;
  }
  EXPECT_EQ(expected[0], -8.0f);
  EXPECT_EQ(expected[31], 7.5f);
  CheckRow(GgmlType::kQ8_0, b, expected);
}

// qs[j] = j | (15 - j) << 4: low nibbles count up, high nibbles count down,
// so swapping the halves or the nibble order changes every element.
std::vector<uint8_t> NibblePattern() {
  std::vector<uint8_t> qs(16);
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  return qs;
}

TEST(QuantTest, Q4_0NibbleOrder) {
  std::vector<uint8_t> b(18);
  PutU16(b, 0, kHalfHalf);
  const std::vector<uint8_t> qs = NibblePattern();
  std::memcpy(&b[2], qs.data(), 16);
  // x = 0.5 * (q - 8); elements 0..15 from low nibbles 0..15, elements
  // 16..31 from high nibbles 15..0.
  const std::vector<float> expected = {
      -4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,  //
      0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,   //
      3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,   //
      -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f};
  CheckRow(GgmlType::kQ4_0, b, expected);
}

TEST(QuantTest, Q4_1NibbleOrder) {
  std::vector<uint8_t> b(20);
  PutU16(b, 0, kHalfQuarter);   // d = 0.25
  PutU16(b, 2, kHalfMinusOne);  // m = -1
  const std::vector<uint8_t> qs = NibblePattern();
  std::memcpy(&b[4], qs.data(), 16);
  // x = 0.25 * q - 1.
  const std::vector<float> expected = {
      -1.0f, -0.75f, -0.5f, -0.25f, 0.0f,   0.25f, 0.5f,   0.75f,  //
      1.0f,  1.25f,  1.5f,  1.75f,  2.0f,   2.25f, 2.5f,   2.75f,  //
      2.75f, 2.5f,   2.25f, 2.0f,   1.75f,  1.5f,  1.25f,  1.0f,   //
      0.75f, 0.5f,   0.25f, 0.0f,   -0.25f, -0.5f, -0.75f, -1.0f};
  CheckRow(GgmlType::kQ4_1, b, expected);
}

// qh bytes {0x0F, 0x00, 0xF0, 0x81}: fifth bit set for elements 0-3, 20-23,
// 24 and 31 (little-endian bit j = element j).
constexpr uint8_t kQh[4] = {0x0F, 0x00, 0xF0, 0x81};
bool FifthBit(int e) { return e <= 3 || (e >= 20 && e <= 24) || e == 31; }

// The 5-bit quant of element e under NibblePattern() and kQh.
int Q5Value(int e) {
  const int nibble = e < 16 ? e : 15 - (e - 16);
  return nibble + (FifthBit(e) ? 16 : 0);
}

TEST(QuantTest, Q5_0FifthBit) {
  std::vector<uint8_t> b(22);
  PutU16(b, 0, kHalfHalf);
  std::memcpy(&b[2], kQh, 4);
  const std::vector<uint8_t> qs = NibblePattern();
  std::memcpy(&b[6], qs.data(), 16);
  std::vector<float> expected(32);
  for (int e = 0; e < 32; ++e) {
    expected[e] = 0.5f * static_cast<float>(Q5Value(e) - 16);
  }
  // Spot checks written out: x = 0.5 * (q - 16).
  EXPECT_EQ(expected[0], 0.0f);    // q = 0 + 16
  EXPECT_EQ(expected[3], 1.5f);    // q = 3 + 16
  EXPECT_EQ(expected[4], -6.0f);   // q = 4
  EXPECT_EQ(expected[15], -0.5f);  // q = 15
  EXPECT_EQ(expected[16], -0.5f);  // q = 15
  EXPECT_EQ(expected[20], 5.5f);   // q = 11 + 16
  EXPECT_EQ(expected[24], 3.5f);   // q = 7 + 16
  EXPECT_EQ(expected[25], -5.0f);  // q = 6
  EXPECT_EQ(expected[31], 0.0f);   // q = 0 + 16
  CheckRow(GgmlType::kQ5_0, b, expected);
}

TEST(QuantTest, Q5_1FifthBit) {
  std::vector<uint8_t> b(24);
  PutU16(b, 0, kHalfHalf);  // d = 0.5
  PutU16(b, 2, kHalfOne);   // m = 1
  std::memcpy(&b[4], kQh, 4);
  const std::vector<uint8_t> qs = NibblePattern();
  std::memcpy(&b[8], qs.data(), 16);
  std::vector<float> expected(32);
  for (int e = 0; e < 32; ++e) {
    expected[e] = 0.5f * static_cast<float>(Q5Value(e)) + 1.0f;
  }
  EXPECT_EQ(expected[0], 9.0f);    // q = 16
  EXPECT_EQ(expected[4], 3.0f);    // q = 4
  EXPECT_EQ(expected[20], 14.5f);  // q = 27
  EXPECT_EQ(expected[31], 9.0f);   // q = 16
  EXPECT_EQ(expected[30], 1.5f);   // q = 1
  CheckRow(GgmlType::kQ5_1, b, expected);
}

// ---------------------------------------------------------------------------
// K-quants. The test packs super-blocks itself from the ggml layout.

// Sub-block scales and mins (6 bits each) used for Q4_K / Q5_K.
constexpr int kSc[8] = {1, 2, 3, 4, 17, 33, 63, 5};
constexpr int kMin[8] = {0, 1, 2, 3, 20, 40, 63, 7};

// ggml's 12-byte packing of eight 6-bit scales and mins.
void PackScalesK4(uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(kSc[j]);
    s[j + 4] = static_cast<uint8_t>(kMin[j]);
  }
  for (int j = 4; j < 8; ++j) {
    s[j + 4] = static_cast<uint8_t>((kSc[j] & 0x0F) | ((kMin[j] & 0x0F) << 4));
    s[j - 4] |= static_cast<uint8_t>((kSc[j] >> 4) << 6);
    s[j] |= static_cast<uint8_t>((kMin[j] >> 4) << 6);
  }
}

TEST(QuantTest, ScalesK4PackingBytes) {
  uint8_t s[12];
  PackScalesK4(s);
  // Written out: sc 4..7 = 17, 33, 63, 5 -> high bits 1, 2, 3, 0 in s[0..3];
  // min 4..7 = 20, 40, 63, 7 -> high bits 1, 2, 3, 0 in s[4..7].
  const uint8_t want[12] = {0x41, 0x82, 0xC3, 0x04, 0x40, 0x81,
                            0xC2, 0x03, 0x41, 0x81, 0xFF, 0x75};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(s[i], want[i]) << i;
}

TEST(QuantTest, Q4_K) {
  std::vector<uint8_t> b(144, 0);
  PutU16(b, 0, kHalfHalf);     // d = 0.5
  PutU16(b, 2, kHalfQuarter);  // dmin = 0.25
  PackScalesK4(&b[4]);
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 7) % 16;
    const int chunk = e / 64, within = e % 64;
    uint8_t& byte = b[16 + 32 * chunk + within % 32];
    byte |= static_cast<uint8_t>(within < 32 ? q : q << 4);
    const int s = e / 32;
    expected[e] = 0.5f * kSc[s] * q - 0.25f * kMin[s];
  }
  EXPECT_EQ(expected[1], 3.5f);       // q = 7, sc 1, min 0
  EXPECT_EQ(expected[33], 6.75f);     // q = 7, sc 2, min 1
  EXPECT_EQ(expected[200], 236.25f);  // q = 8, sc 63, min 63
  CheckRow(GgmlType::kQ4_K, b, expected);
}

TEST(QuantTest, Q5_K) {
  std::vector<uint8_t> b(176, 0);
  PutU16(b, 0, kHalfHalf);
  PutU16(b, 2, kHalfQuarter);
  PackScalesK4(&b[4]);
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 11) % 32;
    const int chunk = e / 64, within = e % 64, l = within % 32;
    b[48 + 32 * chunk + l] |=
        static_cast<uint8_t>(within < 32 ? (q & 0x0F) : (q & 0x0F) << 4);
    const int s = e / 32;  // sub-block s keeps its fifth bits in bit s of qh
    if (q & 0x10) b[16 + l] |= static_cast<uint8_t>(1 << s);
    expected[e] = 0.5f * kSc[s] * q - 0.25f * kMin[s];
  }
  EXPECT_EQ(expected[2], 11.0f);    // q = 22 (fifth bit set), sc 1, min 0
  EXPECT_EQ(expected[40], 23.75f);  // q = 24, sc 2, min 1
  EXPECT_EQ(expected[43], 24.75f);  // q = 25 (fifth bit), sc 2, min 1
  CheckRow(GgmlType::kQ5_K, b, expected);
}

TEST(QuantTest, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  int8_t scales[16];
  for (int k = 0; k < 16; ++k) {
    scales[k] = static_cast<int8_t>(k % 2 ? -(k + 1) : k + 1);
    b[192 + k] = static_cast<uint8_t>(scales[k]);
  }
  PutU16(b, 208, kHalfQuarter);  // d = 0.25
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (e * 13) % 64;
    const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    // quarter 0: ql[l] low, qh bits 0-1; 1: ql[l+32] low, bits 2-3;
    // 2: ql[l] high, bits 4-5; 3: ql[l+32] high, bits 6-7.
    uint8_t& ql = b[64 * half + l + (quarter % 2) * 32];
    ql |= static_cast<uint8_t>(quarter < 2 ? (q & 0x0F) : (q & 0x0F) << 4);
    b[128 + 32 * half + l] |= static_cast<uint8_t>((q >> 4) << (2 * quarter));
    expected[e] = 0.25f * scales[e / 16] * static_cast<float>(q - 32);
  }
  EXPECT_EQ(expected[0], -8.0f);    // 0.25 * 1 * (0 - 32)
  EXPECT_EQ(expected[16], 8.0f);    // 0.25 * -2 * (16 - 32)
  EXPECT_EQ(expected[200], 26.0f);  // 0.25 * 13 * (40 - 32)
  CheckRow(GgmlType::kQ6_K, b, expected);
}

// ---------------------------------------------------------------------------
// Errors.

TEST(QuantTest, WrongLengthIsInvalidArgument) {
  std::vector<uint8_t> b(64 * 34, 0);
  std::vector<float> out(2048);
  std::vector<float> x(2048, 1.0f);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_0, b.data(), 33, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ8_0, b.data(), -32, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ6_K, b.data(), 32, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DotRow(GgmlType::kQ5_1, b.data(), x.data(), 48).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DotRow(GgmlType::kF32, b.data(), x.data(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // n == 0 is a valid empty row.
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ4_0, nullptr, 0, nullptr).ok());
  absl::StatusOr<float> empty = DotRow(GgmlType::kQ4_K, nullptr, nullptr, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, 0.0f);
}

TEST(QuantTest, UnsupportedTypeIsUnimplemented) {
  std::vector<uint8_t> b(1024, 0);
  std::vector<float> out(256);
  std::vector<float> x(256, 1.0f);
  for (GgmlType t : {GgmlType::kQ8_1, GgmlType::kQ2_K, GgmlType::kQ3_K,
                     GgmlType::kQ8_K, GgmlType::kI8, GgmlType::kF64}) {
    const absl::Status s = DequantizeRow(t, b.data(), 256, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find(GgmlTypeName(t)), std::string::npos) << s;
    EXPECT_EQ(DotRow(t, b.data(), x.data(), 256).status().code(),
              absl::StatusCode::kUnimplemented);
    EXPECT_FALSE(IsQuantTypeSupported(t));
  }
  const absl::Status s =
      DequantizeRow(GgmlType::kQ8_1, b.data(), 32, out.data());
  EXPECT_NE(s.message().find("q8_1"), std::string::npos) << s;
  EXPECT_TRUE(IsQuantTypeSupported(GgmlType::kQ4_1));
}

// ---------------------------------------------------------------------------
// Real model (sanity only, not a reference): set PDSERVE_DEFAULT_MODEL.

void CheckFirstRow(const model::GgufFile& file, const std::string& name,
                   GgmlType want_type) {
  absl::StatusOr<const model::GgufTensorInfo*> t = file.FindTensor(name);
  ASSERT_TRUE(t.ok()) << t.status();
  const model::GgufTensorInfo& info = **t;
  EXPECT_EQ(info.type, want_type) << name;
  ASSERT_GE(info.dims.size(), 1u);
  const int64_t n = static_cast<int64_t>(info.dims[0]);
  std::vector<float> row(n);
  ASSERT_TRUE(DequantizeRow(info.type, info.data, n, row.data()).ok());
  double sum_abs = 0.0;
  for (float v : row) {
    ASSERT_TRUE(std::isfinite(v)) << name;
    sum_abs += std::fabs(v);
  }
  const double mean_abs = sum_abs / n;
  EXPECT_GT(mean_abs, 1e-4) << name;
  EXPECT_LT(mean_abs, 10.0) << name;
  // DotRow on the same row agrees with the dequantized row.
  const std::vector<float> x = TestVector(n);
  absl::StatusOr<float> dot = DotRow(info.type, info.data, x.data(), n);
  ASSERT_TRUE(dot.ok()) << dot.status();
  const double want = ReferenceDot(row, x);
  EXPECT_NEAR(*dot, want, 1e-4 * std::max(1.0, std::fabs(want))) << name;
}

TEST(QuantTest, RealModelFirstRows) {
  const std::string path = model::FindDefaultModel();
  if (path.empty()) GTEST_SKIP() << model::kNoDefaultModel;
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file =
      model::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  CheckFirstRow(**file, "blk.0.attn_q.weight", GgmlType::kQ4_1);
  CheckFirstRow(**file, "token_embd.weight", GgmlType::kQ8_0);
}

}  // namespace
}  // namespace pdserve::kernels
