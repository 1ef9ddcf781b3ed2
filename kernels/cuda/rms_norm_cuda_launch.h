// Internal seam between the nvcc-compiled CUDA code (rms_norm_cuda.cu) and
// its g++-compiled absl::Status wrapper (rms_norm_cuda.cc). Not part of the
// public API: include kernels/cuda/rms_norm_cuda.h instead.
//
// Plain C++ with no CUDA or absl headers, so both compilers can read it. CUDA
// errors cross it as a small C-style struct: the cudaError_t value, a coarse
// class (so the .cc needs no <cuda_runtime.h>), the CUDA call that failed and
// CUDA's own name and description of the error.
//
// Ownership: every pointer in CudaCallResult points at a string literal or at
// CUDA's static error strings; nothing is to be freed. Thread-safety: the
// functions hold no state of their own and may be called from any thread
// (the CUDA runtime is thread-safe; each call uses the current device).
#ifndef PDSERVE_KERNELS_CUDA_RMS_NORM_CUDA_LAUNCH_H_
#define PDSERVE_KERNELS_CUDA_RMS_NORM_CUDA_LAUNCH_H_

namespace pdserve::kernels::cuda_internal {

enum class CudaErrorClass {
  kOk = 0,
  // cudaErrorNoDevice or cudaErrorInsufficientDriver: no usable GPU here.
  kNoDevice,
  // cudaErrorMemoryAllocation.
  kOutOfMemory,
  // cudaErrorInvalidValue and friends: the arguments were rejected.
  kInvalidArgument,
  // Anything else (launch failure, illegal address, ...).
  kOther,
};

struct CudaCallResult {
  CudaErrorClass error_class = CudaErrorClass::kOk;
  int code = 0;                        // cudaError_t; 0 is cudaSuccess.
  const char* call = nullptr;          // e.g. "cudaMalloc"; null on success.
  const char* error_name = nullptr;    // cudaGetErrorName(code).
  const char* error_string = nullptr;  // cudaGetErrorString(code).

  bool ok() const { return error_class == CudaErrorClass::kOk; }
};

// cudaGetDeviceCount. `*count` is set only on success.
CudaCallResult GetDeviceCount(int* count);

// Host-to-host RMSNorm on the current device: allocates device buffers,
// copies `x_host` (rows * dim floats) and `weight_host` (dim floats) to them,
// runs the kernel, copies the result into `out_host` (rows * dim floats),
// synchronizes and frees the buffers on every path. Arguments must already be
// validated by the caller: rows > 0, dim > 0, non-null pointers,
// rows * dim * sizeof(float) fits in size_t. `out_host` may equal `x_host`.
CudaCallResult RmsNormHostToHost(const float* x_host, const float* weight_host,
                                 float eps, int rows, int dim, float* out_host);

}  // namespace pdserve::kernels::cuda_internal

#endif  // PDSERVE_KERNELS_CUDA_RMS_NORM_CUDA_LAUNCH_H_
