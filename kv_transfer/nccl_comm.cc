#include "kv_transfer/nccl_comm.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdserve::kv_transfer::nccl_internal {
namespace {

ncclUniqueId UniqueIdFromBytes(const std::string& bytes) {
  ncclUniqueId id;
  static_assert(sizeof(id.internal) == NCCL_UNIQUE_ID_BYTES);
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

// Waits for the stream to empty (after an abort its NCCL kernels exit).
// False if it has not within `timeout`.
bool DrainStream(cudaStream_t stream, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  Backoff backoff(absl::Microseconds(50), absl::Milliseconds(5));
  while (true) {
    const cudaError_t status = cudaStreamQuery(stream);
    // Any answer but "not ready" means nothing will run on it any more.
    if (status != cudaErrorNotReady) return true;
    if (absl::Now() >= give_up) return false;
    backoff.Sleep();
  }
}

// Aborts `comm`: its kernels see the abort flag at once and exit. On a
// non-blocking communicator NCCL frees the rest in the background and answers
// ncclInProgress; the handle must not be used again either way.
void AbortComm(ncclComm_t& comm) {
  if (comm == nullptr) return;
  const ncclResult_t result = ncclCommAbort(comm);
  if (result != ncclSuccess && result != ncclInProgress) {
    PD_LOG(WARNING) << "ncclCommAbort: " << ncclGetErrorString(result);
  }
  comm = nullptr;
}

}  // namespace

absl::Status CudaError(absl::string_view what, cudaError_t error) {
  const std::string message =
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(error), ": ",
                   cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status NcclError(absl::string_view what, ncclResult_t result,
                       ncclComm_t comm) {
  std::string message =
      absl::StrCat(what, ": NCCL error: ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0')
    absl::StrAppend(&message, " (", last, ")");
  return absl::UnavailableError(message);
}

absl::Status AwaitComm(ncclComm_t comm, ncclResult_t result,
                       absl::string_view what, absl::Time deadline,
                       const std::atomic<bool>& stop, Backoff backoff) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return NcclError(what, result, comm);
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) return NcclError(what, query, comm);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(what, state, comm);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": still in progress at the deadline"));
    }
    if (stop.load())
      return absl::CancelledError(absl::StrCat(what, ": stopped"));
    backoff.Sleep();
  }
}

absl::Status CommHealth(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
  if (query != ncclSuccess) {
    return NcclError("ncclCommGetAsyncError", query, comm);
  }
  if (state != ncclSuccess && state != ncclInProgress) {
    return NcclError("communicator failed", state, comm);
  }
  return absl::OkStatus();
}

absl::Status JoinCommunicator(int device, const std::string& unique_id,
                              int rank, absl::Time deadline,
                              const std::atomic<bool>& stop, Backoff backoff,
                              cudaStream_t* stream, ncclComm_t* comm) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError("cudaSetDevice", e);
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    *stream = nullptr;
    return CudaError("cudaStreamCreate", e);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t init = ncclCommInitRankConfig(
      comm, 2, UniqueIdFromBytes(unique_id), rank, &config);
  return AwaitComm(*comm, init,
                   absl::StrCat("ncclCommInitRankConfig (rank ", rank, ")"),
                   deadline, stop, backoff);
}

bool AbortAndDrain(ncclComm_t& comm, cudaStream_t stream,
                   absl::string_view label, absl::string_view leaking) {
  AbortComm(comm);
  if (stream == nullptr) return true;
  if (!DrainStream(stream, kDrainTimeout)) {
    PD_LOG(ERROR) << label << ": stream still busy "
                  << absl::FormatDuration(kDrainTimeout)
                  << " after ncclCommAbort; " << leaking;
    return false;
  }
  cudaStreamDestroy(stream);
  return true;
}

}  // namespace pdserve::kv_transfer::nccl_internal
