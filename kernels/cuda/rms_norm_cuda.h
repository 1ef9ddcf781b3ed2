// CUDA RMSNorm behind a plain-C++ interface (no CUDA headers here, so CPU-only
// code can include it). Same math as pdserve::kernels::RmsNormCpu in
// kernels/rms_norm.h:
//
//   out[r][i] = x[r][i] / sqrt(mean_j(x[r][j]^2) + eps) * weight[i]
//
// The GPU kernel runs one thread block per row and accumulates the sum of
// squares in float (per-thread partial sums, then a warp-shuffle and
// shared-memory tree reduction), so it agrees with the double-accumulating
// CPU reference to a few float ulps, not bit for bit.
//
// Errors: every CUDA failure comes back as an absl::Status whose message
// names the failing call and carries CUDA's error name and string, e.g.
// "cudaMalloc failed: cudaErrorInsufficientDriver (CUDA driver version is
// insufficient for CUDA runtime version)". Status codes:
//   INVALID_ARGUMENT    bad arguments (checked before touching CUDA)
//   FAILED_PRECONDITION no usable GPU (cudaErrorNoDevice,
//                       cudaErrorInsufficientDriver)
//   RESOURCE_EXHAUSTED  device out of memory
//   INTERNAL            any other CUDA error
//
// Ownership: borrows the host buffers for the duration of the call; device
// buffers are allocated and freed inside the call. Thread-safety: stateless;
// concurrent calls are safe (each uses the calling thread's current device).
#ifndef PDSERVE_KERNELS_CUDA_RMS_NORM_CUDA_H_
#define PDSERVE_KERNELS_CUDA_RMS_NORM_CUDA_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pdserve::kernels {

// Host-to-host RMSNorm on the current CUDA device: allocates device buffers,
// copies `x_host` (rows * dim floats, row-major) and `weight_host` (dim
// floats) to the device, runs the kernel, copies the result to `out_host`
// (rows * dim floats) and frees the buffers, on error paths too.
// Requires rows >= 0, dim > 0, eps >= 0 and finite, and non-null pointers
// (rows == 0 is OK and touches nothing). `out_host` may equal `x_host`.
// This is a correctness-first entry point (two allocations and copies per
// call); device-resident variants come with the model runner.
absl::Status RmsNormCuda(const float* x_host, const float* weight_host,
                         float eps, int rows, int dim, float* out_host);

// Number of visible CUDA devices. A machine without a GPU or with a driver
// too old for the CUDA runtime (cudaErrorNoDevice,
// cudaErrorInsufficientDriver) reports OK(0); any other CUDA error is
// returned as a Status (codes as above).
absl::StatusOr<int> CudaDeviceCount();

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CUDA_RMS_NORM_CUDA_H_
