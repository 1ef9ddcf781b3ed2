#include "kernels/ggml_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/quant.h"

namespace pdserve::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<uint16_t> Halves(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float f : v) h.push_back(Fp32ToFp16(f));
  return h;
}

// The inputs of the golden values below: random fp16 bit patterns with
// magnitudes in [1/8, 1/2) from this LCG, reproduced in Python and fed to
// libggml-cpu.so through ctypes (as tools/check_ggml_ops.py does).
std::vector<uint16_t> LcgHalves(uint32_t* state, int n) {
  auto next = [state] {
    *state = (*state * 1103515245u + 12345u) & 0x7fffffffu;
    return *state >> 8;
  };
  std::vector<uint16_t> h(n);
  for (int i = 0; i < n; ++i) {
    const uint32_t sign = next() & 1;
    h[i] = static_cast<uint16_t>((sign << 15) | (0x3000 + (next() & 0xfff)));
  }
  return h;
}

TEST(DotF16Test, SumsSmallIntegersExactly) {
  const auto x = Halves({1, 2, 3, 4, 5});
  const auto y = Halves({-1, 1, -1, 1, 2});
  EXPECT_EQ(DotF16Ggml(5, x.data(), y.data()), 12.0f);
  EXPECT_EQ(DotF16TinyBlas(5, x.data(), y.data()), 12.0f);
}

TEST(DotF16Test, TheTwoOrdersRoundDifferently) {
  // Elements 0, 16 and 32 share lane 0. ggml_vec_dot_f16 keeps them in
  // separate accumulators, (2^24 + -2^24) + 1 = 1; tinyBLAS chains them in
  // one, 2^24 + 1 rounds back to 2^24 (ties to even), then - 2^24 = 0.
  std::vector<float> xv(64, 0.0f), yv(64, 0.0f);
  xv[0] = 4096;
  yv[0] = 4096;
  xv[16] = 1;
  yv[16] = 1;
  xv[32] = -4096;
  yv[32] = 4096;
  const auto x = Halves(xv);
  const auto y = Halves(yv);
  EXPECT_EQ(DotF16Ggml(64, x.data(), y.data()), 1.0f);
  EXPECT_EQ(DotF16TinyBlas(64, x.data(), y.data()), 0.0f);
}

TEST(DotF16Test, MatchesValuesCapturedFromGgml) {
  // Captured from libggml-cpu.so of llama-cpp-python 0.3.36 (AVX-512
  // build): ggml_vec_dot_f16 on the first 100 / 128 elements, and
  // ggml_mul_mat (f16 row times two f32 columns, i.e. tinyBLAS) on 128.
  uint32_t state = 12345;
  const auto x = LcgHalves(&state, 128);
  const auto y = LcgHalves(&state, 128);
  EXPECT_EQ(DotF16Ggml(100, x.data(), y.data()), -0x1.6f8f1ap+5f);
  EXPECT_EQ(DotF16Ggml(128, x.data(), y.data()), -0x1.f4cd1ap+5f);
  EXPECT_EQ(DotF16TinyBlas(128, x.data(), y.data()), -0x1.f4cd1ap+5f);
}

TEST(WeightedRowSumF16Test, AgreesWithTheDotOfTheSameOrder) {
  uint32_t state = 99;
  const int n = 40, d = 32;
  const auto v = LcgHalves(&state, n * d);
  const auto p16 = LcgHalves(&state, n);
  std::vector<float> p(n);
  std::vector<const uint16_t*> rows(n);
  for (int j = 0; j < n; ++j) {
    p[j] = Fp16ToFp32(p16[j]);
    rows[j] = v.data() + j * d;
  }
  for (F16DotOrder order : {F16DotOrder::kVecDot, F16DotOrder::kTinyBlas}) {
    std::vector<float> out(d);
    WeightedRowSumF16(order, n, p.data(), rows.data(), d, out.data());
    for (int i = 0; i < d; ++i) {
      // Column i of V, zero-padded to 64 so that the vec_dot order has no
      // leftovers, as in llama.cpp's padded KV window.
      std::vector<uint16_t> col(64, 0), pp(64, 0);
      for (int j = 0; j < n; ++j) {
        col[j] = v[j * d + i];
        pp[j] = p16[j];
      }
      EXPECT_EQ(out[i], DotF16(order, 64, pp.data(), col.data())) << i;
    }
  }
}

TEST(ExpGgmlTest, HandlesSpecialValuesLikeGgml) {
  EXPECT_EQ(ExpGgml(0.0f), 1.0f);
  EXPECT_EQ(ExpGgml(-kInf), 0.0f);
  EXPECT_EQ(ExpGgml(kInf), kInf);
  EXPECT_EQ(ExpGgml(-1000.0f), 0.0f);
  EXPECT_EQ(ExpGgml(1000.0f), kInf);
  EXPECT_TRUE(std::isnan(ExpGgml(std::nanf(""))));
  // Within a couple of ulps of the true exponential in the normal range.
  for (float x = -80.0f; x < 80.0f; x += 0.37f) {
    const double e = std::exp(static_cast<double>(x));
    EXPECT_NEAR(ExpGgml(x), e, 3e-7 * e) << x;
  }
}

TEST(SoftMaxGgmlTest, MatchesValuesCapturedFromGgml) {
  // Captured from ggml_vec_soft_max_f32 (max = 0) in libggml-cpu.so of
  // llama-cpp-python 0.3.36: 16 lanes of ggml_v_expf and one expf.
  const std::vector<float> x = {0.5,   -1.25, 3.0,    -7.75, 10.5, -20.0,
                                0.001, -0.3,  42.0,   -87.0, 88.0, 1.0,
                                -2.0,  0.0,   -100.0, 60.0,  2.5};
  const std::vector<float> want = {
      0x1.a61298p+0f,  0x1.256180p-2f,   0x1.415e5cp+4f,   0x1.c3aa90p-12f,
      0x1.1bb700p+15f, 0x1.1b4864p-29f,  0x1.004192p+0f,   0x1.7b4c88p-1f,
      0x1.823258p+60f, 0x1.666d0cp-126f, 0x1.f1056ep+126f, 0x1.5bf0aap+1f,
      0x1.152aaap-3f,  0x1.0p+0f,        0x1.bp-145f,      0x1.79dbccp+86f,
      0x1.85d6fep+3f};
  std::vector<float> y(x.size());
  const double sum = SoftMaxGgml(x.size(), x.data(), 0.0f, y.data());
  EXPECT_EQ(sum, 0x1.f1056ep+126);
  EXPECT_EQ(y, want);
}

TEST(SoftMaxGgmlTest, MaskedEntriesGetZero) {
  const std::vector<float> x = {1.0f, -kInf, 1.0f, -kInf};
  std::vector<float> y(4);
  EXPECT_EQ(SoftMaxGgml(4, x.data(), 1.0f, y.data()), 2.0);
  EXPECT_EQ(y, (std::vector<float>{1.0f, 0.0f, 1.0f, 0.0f}));
  std::vector<float> x16(16, -kInf), y16(16);
  x16[3] = 2.0f;
  EXPECT_EQ(SoftMaxGgml(16, x16.data(), 2.0f, y16.data()), 1.0);
  EXPECT_EQ(y16[3], 1.0f);
  EXPECT_EQ(y16[4], 0.0f);
}

TEST(SwiGluGgmlTest, MatchesValuesCapturedFromGgml) {
  // Captured from ggml_vec_swiglu_f32 in libggml-cpu.so of llama-cpp-python
  // 0.3.36 (16 vector lanes, then one scalar element).
  const std::vector<float> g = {0.5,   -1.25, 3.0,    -7.75, 10.5, -20.0,
                                0.001, -0.3,  42.0,   -87.0, 88.0, 1.0,
                                -2.0,  0.0,   -100.0, 60.0,  2.5};
  const std::vector<float> u = {1.5,    -0.5, 2.0, 0.25, -1.0, 3.0,
                                -2.5,   0.75, 1.0, -1.0, 0.5,  2.0,
                                -0.125, 4.0,  1.0, -3.0, 0.5};
  const std::vector<float> want = {0x1.de0c7cp-2f,
                                   0x1.1d0e64p-3f,
                                   0x1.6dc9dap+2f,
                                   -0x1.b55d08p-11f,
                                   -0x1.4ffda2p+3f,
                                   -0x1.0993e0p-23f,
                                   -0x1.47d808p-10f,
                                   -0x1.883198p-4f,
                                   0x1.5p+5f,
                                   0x1.e73c40p-120f,
                                   0x1.6p+5f,
                                   0x1.764d4ep+0f,
                                   0x1.e84152p-6f,
                                   0.0f,
                                   -0.0f,
                                   -0x1.68p+7f,
                                   0x1.27b9b2p+0f};
  std::vector<float> out(g.size());
  SwiGluGgml(g.size(), g.data(), u.data(), out.data());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(out[i], want[i]) << i;
    EXPECT_EQ(std::signbit(out[i]), std::signbit(want[i])) << i;
  }
  EXPECT_EQ(SiluGgml(0.0f), 0.0f);
}

// The forms picked for this CPU (AVX-512 where it has it) equal the portable
// ones bit for bit, on every length (tails included) and on inputs that
// reach exp's limits (-inf, overflow, underflow).
TEST(DispatchTest, PickedFormsEqualThePortableOnesBitwise) {
  uint32_t state = 12345;
  auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  std::vector<int> lengths;
  for (int n = 1; n <= 200; n += (n < 70 ? 1 : 13)) lengths.push_back(n);
  // Long enough for the weighted sums' several chunks per pass (vec_dot
  // from 256 positions, tinyBLAS from 1024).
  lengths.push_back(261);
  lengths.push_back(1031);
  for (const int n : lengths) {
    SCOPED_TRACE(n);
    const std::vector<uint16_t> x = LcgHalves(&state, n);
    const std::vector<uint16_t> y = LcgHalves(&state, n);
    EXPECT_EQ(bits(DotF16Ggml(n, x.data(), y.data())),
              bits(DotF16GgmlPortable(n, x.data(), y.data())));
    EXPECT_EQ(bits(DotF16TinyBlas(n, x.data(), y.data())),
              bits(DotF16TinyBlasPortable(n, x.data(), y.data())));

    // Many keys against one query, and the probability-weighted sum of
    // value rows, for head sizes the engine uses (and a 16-only one).
    for (const int d : {16, 64, 80, 96, 128, 192}) {
      const std::vector<uint16_t> q = LcgHalves(&state, d);
      std::vector<std::vector<uint16_t>> keys;
      std::vector<const uint16_t*> ptrs;
      std::vector<float> p;
      for (int j = 0; j < n; ++j) keys.push_back(LcgHalves(&state, d));
      for (int j = 0; j < n; ++j) {
        ptrs.push_back(keys[j].data());
        p.push_back(Fp16ToFp32(keys[j][0]));
      }
      for (F16DotOrder order : {F16DotOrder::kVecDot, F16DotOrder::kTinyBlas}) {
        std::vector<float> many(n);
        DotF16Many(order, d, ptrs.data(), n, q.data(), 0.125f, many.data());
        for (int j = 0; j < n; ++j) {
          ASSERT_EQ(bits(many[j]),
                    bits(DotF16(order, d, keys[j].data(), q.data()) * 0.125f))
              << "d=" << d << " key " << j;
        }
        std::vector<float> w1(d), w2(d);
        WeightedRowSumF16(order, n, p.data(), ptrs.data(), d, w1.data());
        WeightedRowSumF16Portable(order, n, p.data(), ptrs.data(), d,
                                  w2.data());
        for (int i = 0; i < d; ++i) {
          ASSERT_EQ(bits(w1[i]), bits(w2[i])) << "d=" << d << " i=" << i;
        }

        // The query heads of a KV head at once (decode): five, so that both
        // a group of four and a single head run, each head its own
        // queries, probabilities and strides.
        {
          const int nq = 5;
          const int64_t p_stride = n + 3, out_stride = n + 2;
          std::vector<uint16_t> qs;
          std::vector<float> ps(nq * p_stride);
          for (int h = 0; h < nq; ++h) {
            const std::vector<uint16_t> qh = LcgHalves(&state, d + 1);
            qs.insert(qs.end(), qh.begin(), qh.end());
            for (int j = 0; j < n; ++j) {
              ps[h * p_stride + j] = Fp16ToFp32(keys[j][(h + 1) % d]);
            }
          }
          std::vector<float> scores(nq * out_stride, -5.0f);
          std::vector<float> sums(nq * (d + 1), -5.0f);
          DotF16ManyHeads(order, d, ptrs.data(), n, nq, qs.data(), d + 1,
                          0.125f, scores.data(), out_stride);
          WeightedRowSumF16Heads(order, n, nq, ps.data(), p_stride, ptrs.data(),
                                 d, sums.data(), d + 1);
          std::vector<float> want(d);
          for (int h = 0; h < nq; ++h) {
            for (int j = 0; j < n; ++j) {
              ASSERT_EQ(bits(scores[h * out_stride + j]),
                        bits(DotF16(order, d, keys[j].data(),
                                    qs.data() + h * (d + 1)) *
                             0.125f))
                  << "d=" << d << " head " << h << " key " << j;
            }
            EXPECT_EQ(scores[h * out_stride + n], -5.0f) << "past the keys";
            WeightedRowSumF16Portable(order, n, ps.data() + h * p_stride,
                                      ptrs.data(), d, want.data());
            for (int i = 0; i < d; ++i) {
              ASSERT_EQ(bits(sums[h * (d + 1) + i]), bits(want[i]))
                  << "d=" << d << " head " << h << " i=" << i;
            }
            EXPECT_EQ(sums[h * (d + 1) + d], -5.0f) << "past the head";
          }
        }

        // The same on K and V widened to fp32 once (prompts), for three
        // queries at once (a KV head's query heads): keys in blocks of 16
        // (the last padded with junk), values slot-major with spare rows.
        const int nq = 3;
        const int64_t blocks = (n + 15) / 16;
        const int64_t rows_per_slot = blocks + 1;
        std::vector<float> key_blocks(blocks * 16 * d, 1e30f);
        std::vector<float> values(16 * rows_per_slot * d, 1e30f);
        for (int j = 0; j < n; ++j) {
          for (int e = 0; e < d; ++e) {
            key_blocks[j / 16 * 16 * d + e * 16 + j % 16] =
                Fp16ToFp32(keys[j][e]);
            values[((j % 16) * rows_per_slot + j / 16) * d + e] =
                Fp16ToFp32(keys[j][e]);
          }
        }
        std::vector<std::vector<uint16_t>> queries = {q};
        std::vector<float> qf(nq * d), probs(nq * (n + 1));
        for (int h = 0; h < nq; ++h) {
          if (h > 0) queries.push_back(LcgHalves(&state, d));
          for (int e = 0; e < d; ++e) qf[h * d + e] = Fp16ToFp32(queries[h][e]);
          for (int j = 0; j < n; ++j) {
            probs[h * (n + 1) + j] = h == 0 ? p[j] : Fp16ToFp32(keys[j][h]);
          }
        }
        const int64_t out_stride = n + 1;
        std::vector<float> t1(nq * out_stride, -5.0f), t2 = t1;
        DotF16ManyTransposed(order, d, key_blocks.data(), n, nq, qf.data(), d,
                             0.125f, t1.data(), out_stride);
        DotF16ManyTransposedPortable(order, d, key_blocks.data(), n, nq,
                                     qf.data(), d, 0.125f, t2.data(),
                                     out_stride);
        std::vector<float> v1(nq * d), v2(nq * d);
        WeightedRowSumWidened(order, n, nq, probs.data(), n + 1, values.data(),
                              rows_per_slot, d, v1.data(), d);
        WeightedRowSumWidenedPortable(order, n, nq, probs.data(), n + 1,
                                      values.data(), rows_per_slot, d,
                                      v2.data(), d);
        for (int h = 0; h < nq; ++h) {
          for (int j = 0; j < n; ++j) {
            const float want =
                DotF16(order, d, keys[j].data(), queries[h].data()) * 0.125f;
            ASSERT_EQ(bits(t1[h * out_stride + j]), bits(want))
                << "d=" << d << " query " << h << " key " << j;
            ASSERT_EQ(bits(t2[h * out_stride + j]), bits(want))
                << "d=" << d << " query " << h << " key " << j;
          }
          EXPECT_EQ(t1[h * out_stride + n], -5.0f) << "wrote past the keys";
          std::vector<float> want(d);
          WeightedRowSumF16(order, n, probs.data() + h * (n + 1), ptrs.data(),
                            d, want.data());
          for (int i = 0; i < d; ++i) {
            ASSERT_EQ(bits(v1[h * d + i]), bits(want[i]))
                << "d=" << d << " query " << h << " i=" << i;
            ASSERT_EQ(bits(v2[h * d + i]), bits(want[i]))
                << "d=" << d << " query " << h << " i=" << i;
          }
        }
      }
    }

    std::vector<float> scores(n), g(n), u(n);
    for (int i = 0; i < n; ++i) {
      scores[i] = Fp16ToFp32(x[i]) * 400.0f;  // about +-200: exp's limits
      if (i % 7 == 3) scores[i] = -kInf;      // masked
      g[i] = Fp16ToFp32(y[i]) * 500.0f;
      u[i] = Fp16ToFp32(x[i]);
    }
    float max = -kInf;
    for (float v : scores) max = std::max(max, v);
    EXPECT_EQ(bits(MaxScore(n, scores.data())), bits(max));
    EXPECT_EQ(bits(MaxScorePortable(n, scores.data())), bits(max));
    // Probabilities down to fp16's subnormals, scaled and rounded.
    std::vector<float> r1(n), r2(n);
    for (int i = 0; i < n; ++i) {
      r1[i] = r2[i] = std::ldexp(Fp16ToFp32(y[i]), -(i % 20));
    }
    ScaleToF16Precision(n, 0.7f, r1.data());
    ScaleToF16PrecisionPortable(n, 0.7f, r2.data());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(bits(r1[i]), bits(r2[i])) << "scaled probability " << i;
    }
    std::vector<float> p1(n), p2(n), o1(n), o2(n);
    const double s1 = SoftMaxGgml(n, scores.data(), max, p1.data());
    const double s2 = SoftMaxGgmlPortable(n, scores.data(), max, p2.data());
    EXPECT_EQ(std::bit_cast<uint64_t>(s1), std::bit_cast<uint64_t>(s2));
    // With max 0 many entries are far below, some overflow-free above.
    SoftMaxGgml(n, scores.data(), 0.0f, p1.data());
    SoftMaxGgmlPortable(n, scores.data(), 0.0f, p2.data());
    SwiGluGgml(n, g.data(), u.data(), o1.data());
    SwiGluGgmlPortable(n, g.data(), u.data(), o2.data());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(bits(p1[i]), bits(p2[i])) << "softmax " << i;
      ASSERT_EQ(bits(o1[i]), bits(o2[i])) << "swiglu " << i << " of " << g[i];
    }
  }
}

TEST(RopeRotateGgmlTest, RotatesWithOneRoundingForTheFirstProduct) {
  float y0, y1;
  RopeRotateGgml(3.0f, 4.0f, 1.0f, 0.0f, &y0, &y1);
  EXPECT_EQ(y0, 3.0f);
  EXPECT_EQ(y1, 4.0f);
  RopeRotateGgml(3.0f, 4.0f, 0.0f, 1.0f, &y0, &y1);
  EXPECT_EQ(y0, -4.0f);
  EXPECT_EQ(y1, 3.0f);
  // x0 * c is not rounded before the subtraction: (1 + 2^-12)^2 - 1 keeps
  // its 2^-24 term, which a rounded product would lose.
  const float a = 1.0f + 0x1p-12f;
  RopeRotateGgml(a, 1.0f, a, 1.0f, &y0, &y1);
  EXPECT_EQ(y0, 0x1p-11f + 0x1p-24f);
}

}  // namespace
}  // namespace pdserve::kernels
