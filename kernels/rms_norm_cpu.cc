#include <cmath>
#include <cstddef>

#include "kernels/rms_norm.h"

namespace pdserve::kernels {

void RmsNormCpu(const float* x, const float* weight, float eps, int rows,
                int dim, float* out) {
  const size_t d = static_cast<size_t>(dim);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * d;
    float* outr = out + static_cast<size_t>(r) * d;
    double sum_sq = 0.0;
    for (size_t i = 0; i < d; ++i) {
      const double v = xr[i];
      sum_sq += v * v;
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(d) +
                                           static_cast<double>(eps));
    // Reads xr[i] before writing outr[i], so out == x is safe.
    for (size_t i = 0; i < d; ++i) {
      outr[i] = static_cast<float>(static_cast<double>(xr[i]) * inv_rms *
                                   static_cast<double>(weight[i]));
    }
  }
}

}  // namespace pdserve::kernels
