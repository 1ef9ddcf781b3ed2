// How the NCCL transport drives CUDA and NCCL without ever blocking in them:
// error conversion, polling with back-off, and the life of a non-blocking
// two-rank communicator (join, health, abort, drain). Shared by the writer
// (nccl_peer_writer.cc) and the receiver (nccl_export_receiver.cc), which
// use a communicator the same way from opposite ends.
//
// Private to the NCCL transport. Thread-safety: the functions keep no state;
// a communicator and its stream are used by one thread at a time.
#ifndef PDSERVE_KV_TRANSFER_NCCL_COMM_H_
#define PDSERVE_KV_TRANSFER_NCCL_COMM_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kv_transfer/nccl_transport.h"

namespace pdserve::kv_transfer::nccl_internal {

// How long a stream may take to empty after its communicator was aborted
// before its buffers are considered lost (leaked rather than reused).
constexpr absl::Duration kDrainTimeout = absl::Seconds(10);

// CUDA's error as a status: RESOURCE_EXHAUSTED for allocations,
// FAILED_PRECONDITION for a missing GPU or driver, INTERNAL otherwise.
absl::Status CudaError(absl::string_view what, cudaError_t error);
// NCCL's error (with its last error text for `comm`) as UNAVAILABLE.
absl::Status NcclError(absl::string_view what, ncclResult_t result,
                       ncclComm_t comm);

// Makes `device` current on this thread for the guard's lifetime.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Polling that starts at `min` and backs off to `max` while nothing happens.
class Backoff {
 public:
  Backoff(absl::Duration min, absl::Duration max)
      : min_(min), max_(std::max(min, max)), next_(min) {}
  void Sleep() {
    absl::SleepFor(next_);
    next_ = std::min(max_, next_ * 2);
  }
  void Reset() { next_ = min_; }

 private:
  const absl::Duration min_;
  const absl::Duration max_;
  absl::Duration next_;
};

// The transport's polling of CUDA events and NCCL state, from its options.
inline Backoff PollBackoff(const NcclTransportOptions& options) {
  return Backoff(options.poll_interval, options.idle_poll_interval);
}

// After an NCCL call on a non-blocking communicator: waits until the call has
// been carried out (the communicator leaves ncclInProgress), so that the next
// NCCL or CUDA call on its stream may follow. Fails at `deadline`, when
// `stop` is set, or on an NCCL error.
absl::Status AwaitComm(ncclComm_t comm, ncclResult_t result,
                       absl::string_view what, absl::Time deadline,
                       const std::atomic<bool>& stop, Backoff backoff);

// OK while the communicator is healthy.
absl::Status CommHealth(ncclComm_t comm);

// Both ends of a communicator: creates the non-blocking stream on `device`
// and joins the two-rank communicator `unique_id` as `rank`, waiting until
// the join is complete. On failure, *stream and *comm hold whatever was
// created, for the caller's usual cleanup (AbortAndDrain).
absl::Status JoinCommunicator(int device, const std::string& unique_id,
                              int rank, absl::Time deadline,
                              const std::atomic<bool>& stop, Backoff backoff,
                              cudaStream_t* stream, ncclComm_t* comm);

// Ends a communicator for good: aborts `comm` (its kernels exit), then waits
// up to kDrainTimeout for `stream` (may be null) to empty and destroys it.
// False if the stream is still busy: its kernels may still touch what they
// were given, which the caller must then leak rather than reuse; `leaking`
// says what in the error log.
bool AbortAndDrain(ncclComm_t& comm, cudaStream_t stream,
                   absl::string_view label, absl::string_view leaking);

}  // namespace pdserve::kv_transfer::nccl_internal

#endif  // PDSERVE_KV_TRANSFER_NCCL_COMM_H_
