// CUDA side of RmsNormCuda: the kernel and a host-to-host launcher that
// reports CUDA errors as a plain struct. Compiled by nvcc, so it includes no
// absl headers; kernels/cuda/rms_norm_cuda.cc turns the struct into an
// absl::Status.
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/rms_norm_cuda_launch.h"

namespace pdserve::kernels::cuda_internal {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
constexpr unsigned kFullWarpMask = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_down_sync(kFullWarpMask, v, offset);
  }
  return v;  // The full sum is in lane 0.
}

// One block per row. Each thread accumulates a strided float partial sum of
// squares; warps reduce with shuffles, warp totals meet in shared memory and
// the first warp reduces those; the scale is broadcast through shared memory
// and every thread writes its strided share of the row.
__global__ void __launch_bounds__(kThreadsPerBlock)
    RmsNormKernel(const float* __restrict__ x, const float* __restrict__ weight,
                  float eps, int dim, float* __restrict__ out) {
  __shared__ float warp_sums[kWarpsPerBlock];
  __shared__ float inv_rms;

  const size_t row_offset = static_cast<size_t>(blockIdx.x) * dim;
  const float* xr = x + row_offset;
  float* outr = out + row_offset;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;

  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreadsPerBlock) {
    const float v = xr[i];
    sum_sq = fmaf(v, v, sum_sq);
  }
  sum_sq = WarpSum(sum_sq);
  if (lane == 0) warp_sums[warp] = sum_sq;
  __syncthreads();

  if (warp == 0) {
    float total = lane < kWarpsPerBlock ? warp_sums[lane] : 0.0f;
    total = WarpSum(total);
    if (lane == 0) {
      inv_rms = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
    }
  }
  __syncthreads();

  const float scale = inv_rms;
  for (int i = threadIdx.x; i < dim; i += kThreadsPerBlock) {
    outr[i] = xr[i] * scale * weight[i];
  }
}

CudaErrorClass Classify(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return CudaErrorClass::kOk;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return CudaErrorClass::kNoDevice;
    case cudaErrorMemoryAllocation:
      return CudaErrorClass::kOutOfMemory;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
      return CudaErrorClass::kInvalidArgument;
    default:
      return CudaErrorClass::kOther;
  }
}

CudaCallResult MakeResult(cudaError_t err, const char* call) {
  CudaCallResult result;
  if (err == cudaSuccess) return result;
  result.error_class = Classify(err);
  result.code = static_cast<int>(err);
  result.call = call;
  result.error_name = cudaGetErrorName(err);
  result.error_string = cudaGetErrorString(err);
  return result;
}

// Owns one device allocation; frees it when destroyed. Errors from cudaFree
// are ignored: it runs on error paths, where the first error is the one to
// report, and after a successful synchronizing copy it cannot fail for a
// valid pointer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  cudaError_t Allocate(size_t n_floats) {
    return cudaMalloc(reinterpret_cast<void**>(&ptr_),
                      n_floats * sizeof(float));
  }
  float* get() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
};

}  // namespace

CudaCallResult GetDeviceCount(int* count) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // Clear the (non-sticky) error so later runtime calls do not see it.
    cudaGetLastError();
    return MakeResult(err, "cudaGetDeviceCount");
  }
  *count = n;
  return CudaCallResult();
}

CudaCallResult RmsNormHostToHost(const float* x_host, const float* weight_host,
                                 float eps, int rows, int dim,
                                 float* out_host) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(dim);
  const size_t d = static_cast<size_t>(dim);

  DeviceBuffer x;
  DeviceBuffer weight;
  DeviceBuffer out;
  cudaError_t err;
  if ((err = x.Allocate(n)) != cudaSuccess) {
    return MakeResult(err, "cudaMalloc");
  }
  if ((err = weight.Allocate(d)) != cudaSuccess) {
    return MakeResult(err, "cudaMalloc");
  }
  if ((err = out.Allocate(n)) != cudaSuccess) {
    return MakeResult(err, "cudaMalloc");
  }
  if ((err = cudaMemcpy(x.get(), x_host, n * sizeof(float),
                        cudaMemcpyHostToDevice)) != cudaSuccess) {
    return MakeResult(err, "cudaMemcpy(HostToDevice)");
  }
  if ((err = cudaMemcpy(weight.get(), weight_host, d * sizeof(float),
                        cudaMemcpyHostToDevice)) != cudaSuccess) {
    return MakeResult(err, "cudaMemcpy(HostToDevice)");
  }

  RmsNormKernel<<<rows, kThreadsPerBlock>>>(x.get(), weight.get(), eps, dim,
                                            out.get());
  if ((err = cudaGetLastError()) != cudaSuccess) {
    return MakeResult(err, "RmsNormKernel launch");
  }
  // Synchronous copy on the legacy default stream: waits for the kernel and
  // reports any error it hit while running.
  if ((err = cudaMemcpy(out_host, out.get(), n * sizeof(float),
                        cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return MakeResult(err, "cudaMemcpy(DeviceToHost)");
  }
  return CudaCallResult();
}

}  // namespace pdserve::kernels::cuda_internal
