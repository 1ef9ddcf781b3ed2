#include "kv_transfer/nccl_export_receiver.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"
#include "kv_transfer/nccl_comm.h"

namespace pdserve::kv_transfer {

using nccl_internal::AbortAndDrain;
using nccl_internal::AwaitComm;
using nccl_internal::Backoff;
using nccl_internal::CommHealth;
using nccl_internal::CudaError;
using nccl_internal::JoinCommunicator;
using nccl_internal::kHeaderBytes;
using nccl_internal::kMagic;
using nccl_internal::kMaxPieceBytes;
using nccl_internal::kReceiverRank;
using nccl_internal::kWireVersion;
using nccl_internal::kWriterRank;
using nccl_internal::MessageKind;
using nccl_internal::NcclError;
using nccl_internal::PollBackoff;
using nccl_internal::WireExtent;
using nccl_internal::WireHeader;

namespace {

absl::Status ProtocolError(uint64_t sequence, const WireHeader& header,
                           absl::string_view why) {
  return absl::DataLossError(absl::StrCat("protocol error in message ",
                                          sequence, " (operation ",
                                          header.operation, "): ", why));
}

// Everything the receiver checks in a header before it receives the body:
// DATA_LOSS for a message this end did not expect.
absl::Status CheckHeader(const WireHeader& header, uint64_t sequence) {
  const auto kind = static_cast<MessageKind>(header.kind);
  auto protocol_error = [&](absl::string_view why) {
    return ProtocolError(sequence, header, why);
  };
  if (header.magic != kMagic || header.version != kWireVersion) {
    return protocol_error(absl::StrCat("bad magic ", header.magic,
                                       " or version ", header.version));
  }
  if (header.sequence != sequence) {
    return protocol_error(absl::StrCat("sequence number ", header.sequence));
  }
  switch (kind) {
    case MessageKind::kHello:
      if (header.body_bytes != 0) return protocol_error("HELLO with a body");
      return absl::OkStatus();
    case MessageKind::kClose:
      if (header.body_bytes != 0) return protocol_error("CLOSE with a body");
      return absl::OkStatus();
    case MessageKind::kWrite:
      if (header.extent_count == 0 ||
          header.extent_count > NcclTransport::kMaxExtentsPerMessage ||
          header.body_bytes != header.extent_count * sizeof(WireExtent)) {
        return protocol_error(absl::StrCat("WRITE of ", header.extent_count,
                                           " extents in ", header.body_bytes,
                                           " bytes"));
      }
      return absl::OkStatus();
    case MessageKind::kNotice:
      if (header.key_bytes == 0 ||
          header.key_bytes > NcclTransport::kMaxNoticeKeyBytes ||
          header.payload_bytes > kMaxNoticeBytes ||
          header.body_bytes !=
              uint64_t{header.key_bytes} + header.payload_bytes) {
        return protocol_error(absl::StrCat(
            "NOTICE of ", header.key_bytes, " key and ", header.payload_bytes,
            " payload bytes in ", header.body_bytes));
      }
      return absl::OkStatus();
  }
  return protocol_error(absl::StrCat("unknown kind ", header.kind));
}

}  // namespace

NcclTransport::ExportReceiver::ExportReceiver(NcclTransport* transport,
                                              Export* exported)
    : transport_(*transport),
      export_(*exported),
      label_(absl::StrCat(transport->options_.name, " export ", exported->id,
                          " (region ", exported->region, ")")),
      host_(transport->staging_->host_slot(exported->slot)),
      device_(transport->staging_->device_slot(exported->slot)),
      event_(transport->staging_->events[exported->slot]) {}

void NcclTransport::ExportReceiver::Run() {
  absl::Status status = Join();
  if (status.ok()) status = ReceiveMessages();
  End(status);
}

absl::Status NcclTransport::ExportReceiver::Join() {
  const NcclTransportOptions& options = transport_.options_;
  absl::Status joined =
      JoinCommunicator(options.device, export_.unique_id, kReceiverRank,
                       absl::Now() + options.connect_timeout, export_.stop,
                       PollBackoff(options), &stream_, &comm_);
  if (absl::IsDeadlineExceeded(joined)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no writer joined within ",
                     absl::FormatDuration(options.connect_timeout)));
  }
  PD_RETURN_IF_ERROR(joined);
  PD_LOG(INFO) << label_ << ": writer joined";
  return absl::OkStatus();
}

absl::Status NcclTransport::ExportReceiver::ReceiveMessages() {
  for (uint64_t sequence = 0;; ++sequence) {
    PD_RETURN_IF_ERROR(Receive(0, kHeaderBytes));
    WireHeader header;
    std::memcpy(&header, host_, sizeof(header));
    PD_RETURN_IF_ERROR(CheckHeader(header, sequence));
    const auto kind = static_cast<MessageKind>(header.kind);
    if (kind == MessageKind::kHello) continue;
    if (kind == MessageKind::kClose) {
      PD_LOG(INFO) << label_ << ": writer closed the connection";
      return absl::OkStatus();
    }
    PD_RETURN_IF_ERROR(Receive(kHeaderBytes, header.body_bytes));
    if (kind == MessageKind::kNotice) {
      DeliverNotice(header);
      continue;
    }
    PD_RETURN_IF_ERROR(ReceiveWrite(header, sequence));
  }
}

// Waits without a deadline: the writer decides when to send.
absl::Status NcclTransport::ExportReceiver::Receive(size_t offset,
                                                    size_t bytes) {
  PD_RETURN_IF_ERROR(AwaitComm(
      comm_,
      ncclRecv(device_ + offset, bytes, ncclUint8, kWriterRank, comm_, stream_),
      "ncclRecv", absl::InfiniteFuture(), export_.stop,
      PollBackoff(transport_.options_)));
  cudaError_t status = cudaMemcpyAsync(host_ + offset, device_ + offset, bytes,
                                       cudaMemcpyDeviceToHost, stream_);
  if (status != cudaSuccess) return CudaError("cudaMemcpyAsync", status);
  status = cudaEventRecord(event_, stream_);
  if (status != cudaSuccess) return CudaError("cudaEventRecord", status);
  Backoff wait = PollBackoff(transport_.options_);
  while (true) {
    status = cudaEventQuery(event_);
    if (status == cudaSuccess) return absl::OkStatus();
    if (status != cudaErrorNotReady) return CudaError("cudaEventQuery", status);
    PD_RETURN_IF_ERROR(CommHealth(comm_));
    if (export_.stop.load()) return absl::CancelledError("export stopped");
    wait.Sleep();
  }
}

void NcclTransport::ExportReceiver::DeliverNotice(const WireHeader& header) {
  // Everything received before on this stream is complete, so every byte of
  // the earlier writes is in the region.
  const char* body = reinterpret_cast<const char*>(host_ + kHeaderBytes);
  transport_.mailbox_.Deliver(
      std::string(body, header.key_bytes),
      std::string(body + header.key_bytes, header.payload_bytes));
}

absl::Status NcclTransport::ExportReceiver::ReceiveWrite(
    const WireHeader& header, uint64_t sequence) {
  const uint8_t* body = host_ + kHeaderBytes;
  std::vector<Extent> extents(header.extent_count);
  for (uint32_t i = 0; i < header.extent_count; ++i) {
    WireExtent wire;
    std::memcpy(&wire, body + i * sizeof(WireExtent), sizeof(wire));
    extents[i] = {0, wire.remote_offset, wire.length};
  }
  if (absl::Status bounds = ValidateExtents(
          extents, std::numeric_limits<uint64_t>::max(), export_.length);
      !bounds.ok()) {
    return ProtocolError(sequence, header, bounds.message());
  }
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    return NcclError("ncclGroupStart", r, comm_);
  }
  ncclResult_t posted = ncclSuccess;
  for (const Extent& e : extents) {
    for (uint64_t done = 0;
         done < e.length && (posted == ncclSuccess || posted == ncclInProgress);
         done += kMaxPieceBytes) {
      posted = ncclRecv(export_.base + e.remote_offset + done,
                        std::min(kMaxPieceBytes, e.length - done), ncclUint8,
                        kWriterRank, comm_, stream_);
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (posted != ncclSuccess && posted != ncclInProgress) {
    return NcclError("ncclRecv", posted, comm_);
  }
  // Completion is not awaited: the next header's receive follows these on
  // the stream.
  return AwaitComm(comm_, ended, "ncclGroupEnd (receive)",
                   absl::InfiniteFuture(), export_.stop,
                   PollBackoff(transport_.options_));
}

void NcclTransport::ExportReceiver::End(const absl::Status& status) {
  if (status.ok() || absl::IsCancelled(status)) {
    PD_LOG(DEBUG) << label_ << ": ended (" << status << ")";
  } else if (absl::IsDataLoss(status)) {
    PD_LOG(ERROR) << label_ << ": " << status << "; aborting the communicator";
  } else {
    PD_LOG(WARNING) << label_ << ": " << status
                    << "; aborting the communicator";
  }
  if (AbortAndDrain(comm_, stream_, label_, "leaking its staging slot")) {
    transport_.staging_->Give(export_.slot);
  } else {
    transport_.staging_->leaked.store(true);
  }
  export_.finished.store(true);
}

}  // namespace pdserve::kv_transfer
