// Compares the CUDA RMSNorm with the CPU reference. Tagged "gpu" in BUILD;
// on a machine without a usable GPU the comparison tests skip.
#include "kernels/cuda/rms_norm_cuda.h"

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/rms_norm.h"

namespace pdserve::kernels {
namespace {

// Skips the current test when there is no GPU; fails it when CUDA itself
// reports something other than "no device", or when PDSERVE_REQUIRE_GPU is
// set (the "gpu"-tagged copy of this test), so that a GPU run cannot pass by
// skipping.
#define PD_SKIP_WITHOUT_GPU()                                          \
  do {                                                                 \
    const absl::StatusOr<int> pd_devices_ = CudaDeviceCount();         \
    ASSERT_TRUE(pd_devices_.ok()) << pd_devices_.status();             \
    if (*pd_devices_ == 0) {                                           \
      ASSERT_EQ(std::getenv("PDSERVE_REQUIRE_GPU"), nullptr)           \
          << "PDSERVE_REQUIRE_GPU is set but no CUDA device is found"; \
      GTEST_SKIP() << "no CUDA device";                                \
    }                                                                  \
  } while (false)

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo,
                                float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu,
                 int rows, int dim) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    ASSERT_NEAR(gpu[i], cpu[i], 1e-5f * std::fabs(cpu[i]) + 1e-30f)
        << "rows=" << rows << " dim=" << dim << " row=" << i / dim
        << " col=" << i % dim;
  }
}

TEST(RmsNormCudaTest, MatchesCpuOnRandomInputs) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(2024);
  const std::vector<std::pair<int, int>> shapes = {
      {1, 1},    {1, 31},   {3, 33},    {16, 576},  {5, 2048},
      {4, 4096}, {3, 4097}, {2, 12289}, {300, 576}, {1, 257},
  };
  for (const auto& [rows, dim] : shapes) {
    const std::vector<float> x =
        RandomVector(static_cast<size_t>(rows) * dim, rng, -4.0f, 4.0f);
    const std::vector<float> w = RandomVector(dim, rng, -2.0f, 2.0f);
    const float eps = 1e-6f;
    std::vector<float> cpu(x.size());
    std::vector<float> gpu(x.size(), -12345.0f);
    RmsNormCpu(x.data(), w.data(), eps, rows, dim, cpu.data());
    ASSERT_TRUE(
        RmsNormCuda(x.data(), w.data(), eps, rows, dim, gpu.data()).ok());
    ExpectClose(gpu, cpu, rows, dim);
  }
}

TEST(RmsNormCudaTest, LargeEpsAndZeroRow) {
  PD_SKIP_WITHOUT_GPU();
  const int rows = 2;
  const int dim = 2;
  // Row 0: {3, 4} with eps 3.5 -> rms 4. Row 1: zeros stay zeros.
  const std::vector<float> x = {3.0f, 4.0f, 0.0f, 0.0f};
  const std::vector<float> w = {1.0f, 1.0f};
  std::vector<float> gpu(x.size());
  ASSERT_TRUE(
      RmsNormCuda(x.data(), w.data(), 3.5f, rows, dim, gpu.data()).ok());
  EXPECT_FLOAT_EQ(gpu[0], 0.75f);
  EXPECT_FLOAT_EQ(gpu[1], 1.0f);
  EXPECT_EQ(gpu[2], 0.0f);
  EXPECT_EQ(gpu[3], 0.0f);
}

TEST(RmsNormCudaTest, InPlace) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int rows = 7;
  const int dim = 1000;
  std::vector<float> x = RandomVector(rows * dim, rng, -1.0f, 1.0f);
  const std::vector<float> w = RandomVector(dim, rng, -1.0f, 1.0f);
  std::vector<float> cpu(x.size());
  RmsNormCpu(x.data(), w.data(), 1e-6f, rows, dim, cpu.data());
  ASSERT_TRUE(RmsNormCuda(x.data(), w.data(), 1e-6f, rows, dim, x.data()).ok());
  ExpectClose(x, cpu, rows, dim);
}

// Argument checks run before any CUDA call, so these need no GPU.
TEST(RmsNormCudaTest, RejectsBadArgumentsWithoutTouchingCuda) {
  const float x[2] = {1.0f, 2.0f};
  const float w[2] = {1.0f, 1.0f};
  float out[2];
  EXPECT_EQ(RmsNormCuda(x, w, 1e-6f, -1, 2, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormCuda(x, w, 1e-6f, 1, 0, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormCuda(x, w, -1.0f, 1, 2, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormCuda(x, w, std::nanf(""), 1, 2, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormCuda(nullptr, w, 1e-6f, 1, 2, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormCuda(x, w, 1e-6f, 1, 2, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RmsNormCuda(nullptr, nullptr, 1e-6f, 0, 2, nullptr).ok());
}

// Without a GPU, a real call must fail cleanly with the CUDA error text
// rather than crash; with one, it must succeed.
TEST(RmsNormCudaTest, NoDeviceIsAStatusNotACrash) {
  const absl::StatusOr<int> devices = CudaDeviceCount();
  ASSERT_TRUE(devices.ok()) << devices.status();
  const float x[2] = {3.0f, 4.0f};
  const float w[2] = {1.0f, 1.0f};
  float out[2];
  const absl::Status s = RmsNormCuda(x, w, 0.0f, 1, 2, out);
  if (*devices > 0) {
    EXPECT_TRUE(s.ok()) << s;
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("cuda"), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace pdserve::kernels
