// NcclTransport::ExportReceiver: the receiver side of one export, run on the
// export's own thread. It joins the export's communicator as rank 0, then
// takes the writer's messages in order (nccl_wire.h), checking each header
// and body before anything is received into the region, and delivers
// notices once every earlier byte is in place. Kept apart from the writer
// because the two ends share only the wire format and the communicator
// helpers (nccl_comm.h).
//
// Thread-safety: one receiver per export, used only on the export's thread;
// it reads the export's `stop` flag, which other threads set.
#ifndef PDSERVE_KV_TRANSFER_NCCL_EXPORT_RECEIVER_H_
#define PDSERVE_KV_TRANSFER_NCCL_EXPORT_RECEIVER_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kv_transfer/nccl_transport.h"
#include "kv_transfer/nccl_transport_state.h"
#include "kv_transfer/nccl_wire.h"

namespace pdserve::kv_transfer {

class NcclTransport::ExportReceiver {
 public:
  // `transport` and `exported` outlive the receiver (the export's thread is
  // joined before either goes away).
  ExportReceiver(NcclTransport* transport, Export* exported);
  ExportReceiver(const ExportReceiver&) = delete;
  ExportReceiver& operator=(const ExportReceiver&) = delete;

  // The export's thread: serves the export until its writer closes it, it
  // fails or it is stopped, then ends the communicator and marks the export
  // finished.
  void Run();

 private:
  // Joins the communicator, waiting at most connect_timeout for the writer.
  absl::Status Join();
  // Takes messages until CLOSE (OK) or a failure.
  absl::Status ReceiveMessages();
  // Receives `bytes` into the staging slot at `offset` and copies them to
  // its host side.
  absl::Status Receive(size_t offset, size_t bytes);
  // Posts the receives of a WRITE whose body (its extents) has arrived.
  absl::Status ReceiveWrite(const nccl_internal::WireHeader& header,
                            uint64_t sequence);
  // Hands a NOTICE whose body has arrived to the mailbox.
  void DeliverNotice(const nccl_internal::WireHeader& header);
  // Logs how the export ended, aborts the communicator and returns the slot.
  void End(const absl::Status& status);

  NcclTransport& transport_;
  Export& export_;
  const std::string label_;
  uint8_t* const host_;      // The export's staging slot, host side.
  uint8_t* const device_;    // The same slot, device side.
  const cudaEvent_t event_;  // The slot's event.
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_NCCL_EXPORT_RECEIVER_H_
