// RMSNorm, the normalization used by Llama-family models:
//
//   out[r][i] = x[r][i] / sqrt(mean_j(x[r][j]^2) + eps) * weight[i]
//
// This is the CPU reference implementation; kernels/cuda/rms_norm_cuda.h has
// the CUDA one behind the same plain-C++ shape, and the two are tested
// against each other.
//
// Ownership: the function borrows every buffer for the duration of the call
// and keeps nothing. Thread-safety: stateless; concurrent calls are safe as
// long as they do not write to buffers another call reads or writes.
#ifndef PDSERVE_KERNELS_RMS_NORM_H_
#define PDSERVE_KERNELS_RMS_NORM_H_

namespace pdserve::kernels {

// Applies RMSNorm to `rows` rows of `dim` contiguous floats each.
//
// `x` and `out` hold rows * dim floats (row-major), `weight` holds dim floats.
// Preconditions: rows >= 0, dim > 0, eps >= 0, pointers non-null when
// rows > 0. `out` may equal `x` (in place) but must not otherwise overlap it
// or `weight`.
//
// Precision: the sum of squares, the mean and the scale factor are computed
// in double; each output is rounded to float once, at the end. It is meant as
// a reference, not as a fast path (SIMD is later work).
void RmsNormCpu(const float* x, const float* weight, float eps, int rows,
                int dim, float* out);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_RMS_NORM_H_
