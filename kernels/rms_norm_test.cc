#include "kernels/rms_norm.h"

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::kernels {
namespace {

// Straightforward double-precision reference, written independently of
// RmsNormCpu: divides by the RMS instead of multiplying by its inverse.
std::vector<float> Reference(const std::vector<float>& x,
                             const std::vector<float>& weight, float eps,
                             int rows, int dim) {
  std::vector<float> out(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean_sq = 0.0;
    for (int i = 0; i < dim; ++i) {
      const double v = x[r * dim + i];
      mean_sq += v * v / dim;
    }
    const double rms = std::sqrt(mean_sq + eps);
    for (int i = 0; i < dim; ++i) {
      out[r * dim + i] = static_cast<float>(x[r * dim + i] / rms * weight[i]);
    }
  }
  return out;
}

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo,
                                float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

TEST(RmsNormCpuTest, HandComputedThreeFour) {
  // mean(x^2) = (9 + 16) / 2 = 12.5, rms = sqrt(12.5) = 5 / sqrt(2), so
  // out = {3 sqrt(2) / 5, 4 sqrt(2) / 5} = {0.848528137..., 1.131370849...}.
  const float x[] = {3.0f, 4.0f};
  const float w[] = {1.0f, 1.0f};
  float out[2];
  RmsNormCpu(x, w, /*eps=*/0.0f, /*rows=*/1, /*dim=*/2, out);
  EXPECT_FLOAT_EQ(out[0], 0.84852813742f);
  EXPECT_FLOAT_EQ(out[1], 1.13137084990f);
}

TEST(RmsNormCpuTest, WeightScalesEachColumn) {
  const float x[] = {3.0f, 4.0f};
  const float w[] = {2.0f, 0.5f};
  float out[2];
  RmsNormCpu(x, w, 0.0f, 1, 2, out);
  EXPECT_FLOAT_EQ(out[0], 2.0f * 0.84852813742f);
  EXPECT_FLOAT_EQ(out[1], 0.5f * 1.13137084990f);
}

TEST(RmsNormCpuTest, EpsIsAddedToTheMeanSquare) {
  // mean(x^2) + eps = 12.5 + 3.5 = 16, rms = 4.
  const float x[] = {3.0f, 4.0f};
  const float w[] = {1.0f, 1.0f};
  float out[2];
  RmsNormCpu(x, w, /*eps=*/3.5f, 1, 2, out);
  EXPECT_FLOAT_EQ(out[0], 0.75f);
  EXPECT_FLOAT_EQ(out[1], 1.0f);
}

TEST(RmsNormCpuTest, EpsKeepsZeroRowFinite) {
  const float x[] = {0.0f, 0.0f, 0.0f, 0.0f};
  const float w[] = {1.0f, 2.0f, 3.0f, 4.0f};
  float out[4] = {-1.0f, -1.0f, -1.0f, -1.0f};
  RmsNormCpu(x, w, 1e-6f, 1, 4, out);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(RmsNormCpuTest, SmallEpsBarelyMatters) {
  // For a row with mean square 1, eps = 1e-6 changes the scale by ~5e-7.
  const float x[] = {1.0f, -1.0f, 1.0f, -1.0f};
  const float w[] = {1.0f, 1.0f, 1.0f, 1.0f};
  float out[4];
  RmsNormCpu(x, w, 1e-6f, 1, 4, out);
  const float expected = static_cast<float>(1.0 / std::sqrt(1.0 + 1e-6));
  EXPECT_FLOAT_EQ(out[0], expected);
  EXPECT_FLOAT_EQ(out[1], -expected);
  EXPECT_NE(out[0], 1.0f);
}

TEST(RmsNormCpuTest, RandomMatchesDoubleReference) {
  std::mt19937 rng(1234);
  for (const auto& [rows, dim] : std::vector<std::pair<int, int>>{
           {1, 1}, {3, 576}, {7, 2048}, {2, 4097}}) {
    const std::vector<float> x =
        RandomVector(static_cast<size_t>(rows) * dim, rng, -3.0f, 3.0f);
    const std::vector<float> w = RandomVector(dim, rng, -2.0f, 2.0f);
    const float eps = 1e-5f;
    std::vector<float> out(x.size());
    RmsNormCpu(x.data(), w.data(), eps, rows, dim, out.data());
    const std::vector<float> ref = Reference(x, w, eps, rows, dim);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], ref[i], 1e-6f * std::fabs(ref[i]) + 1e-30f)
          << "rows=" << rows << " dim=" << dim << " i=" << i;
    }
  }
}

TEST(RmsNormCpuTest, RowsAreIndependent) {
  std::mt19937 rng(42);
  const int rows = 5;
  const int dim = 33;
  std::vector<float> x = RandomVector(rows * dim, rng, -10.0f, 10.0f);
  const std::vector<float> w = RandomVector(dim, rng, 0.5f, 1.5f);
  std::vector<float> all(x.size());
  RmsNormCpu(x.data(), w.data(), 1e-6f, rows, dim, all.data());

  // Each row on its own gives bit-identical results.
  for (int r = 0; r < rows; ++r) {
    std::vector<float> one(dim);
    RmsNormCpu(x.data() + r * dim, w.data(), 1e-6f, 1, dim, one.data());
    for (int i = 0; i < dim; ++i) {
      ASSERT_EQ(one[i], all[r * dim + i]) << "r=" << r << " i=" << i;
    }
  }

  // Scaling one row changes only that row's output (and RMSNorm is scale
  // invariant up to eps, so that row stays close to what it was).
  for (int i = 0; i < dim; ++i) x[2 * dim + i] *= 100.0f;
  std::vector<float> changed(x.size());
  RmsNormCpu(x.data(), w.data(), 1e-6f, rows, dim, changed.data());
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) {
      if (r == 2) {
        EXPECT_NEAR(changed[r * dim + i], all[r * dim + i],
                    1e-5f * std::fabs(all[r * dim + i]) + 1e-6f);
      } else {
        ASSERT_EQ(changed[r * dim + i], all[r * dim + i]);
      }
    }
  }
}

TEST(RmsNormCpuTest, InPlaceMatchesOutOfPlace) {
  std::mt19937 rng(7);
  const int rows = 4;
  const int dim = 100;
  std::vector<float> x = RandomVector(rows * dim, rng, -1.0f, 1.0f);
  const std::vector<float> w = RandomVector(dim, rng, -1.0f, 1.0f);
  std::vector<float> out(x.size());
  RmsNormCpu(x.data(), w.data(), 1e-6f, rows, dim, out.data());
  RmsNormCpu(x.data(), w.data(), 1e-6f, rows, dim, x.data());
  EXPECT_EQ(x, out);
}

TEST(RmsNormCpuTest, ZeroRowsWritesNothing) {
  const float w[] = {1.0f};
  float out[1] = {123.0f};
  RmsNormCpu(nullptr, w, 1e-6f, /*rows=*/0, /*dim=*/1, out);
  EXPECT_EQ(out[0], 123.0f);
}

}  // namespace
}  // namespace pdserve::kernels
