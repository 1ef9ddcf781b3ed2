// NcclTransport::Staging's allocation and release (see
// nccl_transport_state.h): the only CUDA allocations the transport makes, in
// Create() and the destructor, never while communicators are live.
#include "common/log.h"
#include "kv_transfer/nccl_comm.h"
#include "kv_transfer/nccl_transport_state.h"

namespace pdserve::kv_transfer {

using nccl_internal::CudaError;
using nccl_internal::kSlotBytes;
using nccl_internal::ScopedDevice;

absl::Status NcclTransport::Staging::Allocate(int device_ordinal,
                                              int slot_count) {
  device = device_ordinal;
  slots = slot_count;
  const size_t bytes = static_cast<size_t>(slots) * kSlotBytes;
  void* pointer = nullptr;
  cudaError_t status = cudaHostAlloc(&pointer, bytes, cudaHostAllocDefault);
  if (status != cudaSuccess) {
    return CudaError("allocating pinned staging memory", status);
  }
  host = static_cast<uint8_t*>(pointer);
  status = cudaMalloc(&pointer, bytes);
  if (status != cudaSuccess) {
    return CudaError("allocating device staging memory", status);
  }
  device_memory = static_cast<uint8_t*>(pointer);
  events.reserve(slots);
  for (int i = 0; i < slots; ++i) {
    cudaEvent_t event = nullptr;
    status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (status != cudaSuccess) return CudaError("cudaEventCreate", status);
    events.push_back(event);
  }
  absl::MutexLock lock(&mutex);
  for (int i = slots - 1; i >= 0; --i) free.push_back(i);
  return absl::OkStatus();
}

NcclTransport::Staging::~Staging() {
  if (host == nullptr && device_memory == nullptr && events.empty()) return;
  if (leaked.load()) {
    PD_LOG(ERROR) << "NCCL transport: not freeing staging buffers that a "
                     "stuck stream may still use";
    return;
  }
  ScopedDevice scoped(device);
  for (cudaEvent_t event : events) cudaEventDestroy(event);
  if (device_memory != nullptr) cudaFree(device_memory);
  if (host != nullptr) cudaFreeHost(host);
}

}  // namespace pdserve::kv_transfer
