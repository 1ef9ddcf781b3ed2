#include "kv_transfer/nccl_peer_writer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
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

// How long a released peer waits for its CLOSE message to be taken.
constexpr absl::Duration kCloseLinger = absl::Seconds(1);
// Longest pause between polls of a writer's in-flight messages.
constexpr absl::Duration kBusyPollCap = absl::Microseconds(100);

}  // namespace

NcclTransport::PeerWriter::PeerWriter(NcclTransport* transport, Peer* peer)
    : transport_(*transport),
      peer_(*peer),
      label_(absl::StrCat(transport->options_.name, " peer ", peer->id, " (",
                          peer->label, ")")) {}

void NcclTransport::PeerWriter::Run() {
  const absl::Time connect_by =
      absl::Now() + transport_.options_.connect_timeout;
  absl::Status status = ReportConnection(Connect(connect_by));
  if (status.ok()) status = Serve();
  stopping_ = stopping_ || peer_.stop.load();

  // A stopped, healthy and idle peer says goodbye first, so the receiver's
  // export ends at once.
  if (stopping_ && status.ok() && ops_.empty() && in_flight_.empty() &&
      comm_ != nullptr) {
    SayGoodbye();
  }
  const absl::Status why = WhyUnfinishedFail(status);
  if (!stopping_ && peer_.connected.HasBeenNotified() &&
      peer_.connect_status.ok()) {
    PD_LOG(WARNING) << label_ << ": " << status
                    << "; aborting the communicator";
  }
  // Report first (the failure is known now; draining may take a while).
  FailUnfinished(why);
  EndCommunicator();
}

// --- Connecting.

absl::Status NcclTransport::PeerWriter::Connect(absl::Time connect_by) {
  const NcclTransportOptions& options = transport_.options_;
  Staging& staging = *transport_.staging_;
  PD_RETURN_IF_ERROR(JoinCommunicator(options.device, peer_.unique_id,
                                      kWriterRank, connect_by, peer_.stop,
                                      PollBackoff(options), &stream_, &comm_));
  // HELLO sets up NCCL's point-to-point connection now (NCCL connects
  // lazily, on the first send), so that a data path that cannot work fails
  // the import rather than the first write.
  const int slot = staging.Take(/*for_export=*/false);
  if (slot < 0) {
    return absl::ResourceExhaustedError("no staging slot for the handshake");
  }
  WriterOp hello;
  hello.kind = MessageKind::kHello;
  PD_RETURN_IF_ERROR(Issue(&hello, slot, connect_by, peer_.stop));
  Backoff wait = PollBackoff(options);
  while (true) {
    const cudaError_t e = cudaEventQuery(staging.events[slot]);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) return CudaError("cudaEventQuery", e);
    PD_RETURN_IF_ERROR(CommHealth(comm_));
    if (absl::Now() >= connect_by) {
      return absl::DeadlineExceededError("handshake still in flight");
    }
    wait.Sleep();
  }
  in_flight_.clear();
  staging.Give(slot);
  return absl::OkStatus();
}

absl::Status NcclTransport::PeerWriter::ReportConnection(absl::Status status) {
  if (absl::IsDeadlineExceeded(status)) {
    status = absl::DeadlineExceededError(absl::StrCat(
        "cannot connect to the receiver of ", peer_.label, " within ",
        absl::FormatDuration(transport_.options_.connect_timeout), ": ",
        status.message()));
  }
  if (!status.ok()) {
    PD_LOG(WARNING) << label_ << ": " << status;
  }
  peer_.connect_status = status;
  peer_.connected.Notify();
  return status;
}

// --- Serving posted operations.

absl::Status NcclTransport::PeerWriter::Serve() {
  const NcclTransportOptions& options = transport_.options_;
  Backoff busy(options.poll_interval,
               std::min(kBusyPollCap, options.idle_poll_interval));
  while (true) {
    if (TakePosted()) {
      stopping_ = true;
      return absl::OkStatus();
    }
    bool progressed = false;
    PD_RETURN_IF_ERROR(Reap(progressed));
    if (!in_flight_.empty()) PD_RETURN_IF_ERROR(CommHealth(comm_));
    if (EarliestDeadline() <= absl::Now()) {
      return absl::DeadlineExceededError("an operation passed its deadline");
    }
    PD_RETURN_IF_ERROR(IssueReady(progressed));
    if (progressed) {
      busy.Reset();
    } else if (!in_flight_.empty() || next_issue_ < ops_.size()) {
      busy.Sleep();
    }
  }
}

bool NcclTransport::PeerWriter::TakePosted() {
  Peer* const peer = &peer_;
  absl::MutexLock lock(&peer->mutex);
  if (ops_.empty() && in_flight_.empty()) {
    auto has_work = [peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer->mutex) {
      return !peer->queue.empty() || peer->stop.load();
    };
    peer->mutex.AwaitWithTimeout(absl::Condition(&has_work),
                                 absl::Milliseconds(100));
  }
  while (!peer->queue.empty()) {
    ops_.push_back(std::move(peer->queue.front()));
    peer->queue.pop_front();
  }
  return peer->stop.load();
}

absl::Status NcclTransport::PeerWriter::IssueReady(bool& progressed) {
  while (next_issue_ < ops_.size() && in_flight_.size() < kMaxSlotsPerPeer) {
    const int slot = transport_.staging_->Take(/*for_export=*/false);
    if (slot < 0) break;  // Retried once other peers return slots.
    WriterOp* op = ops_[next_issue_].get();
    PD_RETURN_IF_ERROR(Issue(op, slot, EarliestDeadline(), peer_.stop));
    progressed = true;
    if (op->fully_issued) ++next_issue_;
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::PeerWriter::Reap(bool& progressed) {
  Staging& staging = *transport_.staging_;
  while (!in_flight_.empty()) {
    const Message& front = in_flight_.front();
    const cudaError_t e = cudaEventQuery(staging.events[front.slot]);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) return CudaError("cudaEventQuery", e);
    const Message done = front;
    in_flight_.pop_front();
    staging.Give(done.slot);
    progressed = true;
    if (!done.last) continue;
    // Operations finish in stream order: this is the oldest one.
    std::unique_ptr<WriterOp> op = std::move(ops_.front());
    ops_.pop_front();
    --next_issue_;
    transport_.operations_.Complete(op->id, absl::OkStatus());
    if (op->kind == MessageKind::kWrite) {
      transport_.ReleaseRegionUse(op->local_region);
    }
  }
  return absl::OkStatus();
}

absl::Time NcclTransport::PeerWriter::EarliestDeadline() const {
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& op : ops_) earliest = std::min(earliest, op->deadline);
  return earliest;
}

// --- Messages.

absl::Status NcclTransport::PeerWriter::Issue(WriterOp* op, int slot,
                                              absl::Time limit,
                                              const std::atomic<bool>& stop) {
  Staging& staging = *transport_.staging_;
  uint8_t* const host = staging.host_slot(slot);
  uint8_t* const device = staging.device_slot(slot);
  const size_t first = op->next_extent;
  const WireHeader header = StageMessage(op, host);
  // Recorded before the calls below, so that a failure part-way still
  // leaves the slot accounted for (released after the stream drains).
  in_flight_.push_back({slot, op->fully_issued});

  cudaError_t e =
      cudaMemcpyAsync(device, host, kHeaderBytes + header.body_bytes,
                      cudaMemcpyHostToDevice, stream_);
  if (e != cudaSuccess) return CudaError("cudaMemcpyAsync", e);
  const NcclTransportOptions& options = transport_.options_;
  PD_RETURN_IF_ERROR(AwaitComm(
      comm_,
      ncclSend(device, kHeaderBytes, ncclUint8, kReceiverRank, comm_, stream_),
      "ncclSend (header)", limit, stop, PollBackoff(options)));
  if (header.body_bytes > 0) {
    PD_RETURN_IF_ERROR(
        AwaitComm(comm_,
                  ncclSend(device + kHeaderBytes, header.body_bytes, ncclUint8,
                           kReceiverRank, comm_, stream_),
                  "ncclSend (body)", limit, stop, PollBackoff(options)));
  }
  if (op->kind == MessageKind::kWrite) {
    PD_RETURN_IF_ERROR(
        SendExtents(*op, first, header.extent_count, limit, stop));
  }
  e = cudaEventRecord(staging.events[slot], stream_);
  if (e != cudaSuccess) return CudaError("cudaEventRecord", e);
  return absl::OkStatus();
}

WireHeader NcclTransport::PeerWriter::StageMessage(WriterOp* op,
                                                   uint8_t* host) {
  uint8_t* const body = host + kHeaderBytes;
  WireHeader header = {};
  header.magic = kMagic;
  header.version = kWireVersion;
  header.kind = static_cast<uint16_t>(op->kind);
  header.sequence = sequence_++;
  header.operation = op->id;
  bool last = true;
  switch (op->kind) {
    case MessageKind::kWrite: {
      const size_t first = op->next_extent;
      const size_t count =
          std::min<size_t>(kMaxExtentsPerMessage, op->extents.size() - first);
      for (size_t i = 0; i < count; ++i) {
        const Extent& e = op->extents[first + i];
        const WireExtent wire = {e.remote_offset, e.length};
        std::memcpy(body + i * sizeof(WireExtent), &wire, sizeof(wire));
      }
      header.extent_count = static_cast<uint32_t>(count);
      header.body_bytes = count * sizeof(WireExtent);
      op->next_extent += count;
      last = op->next_extent == op->extents.size();
      break;
    }
    case MessageKind::kNotice:
      std::memcpy(body, op->key.data(), op->key.size());
      std::memcpy(body + op->key.size(), op->payload.data(),
                  op->payload.size());
      header.key_bytes = static_cast<uint32_t>(op->key.size());
      header.payload_bytes = static_cast<uint32_t>(op->payload.size());
      header.body_bytes = op->key.size() + op->payload.size();
      break;
    case MessageKind::kClose:
    case MessageKind::kHello:
      break;
  }
  std::memcpy(host, &header, sizeof(header));
  op->started = true;
  op->fully_issued = last;
  return header;
}

absl::Status NcclTransport::PeerWriter::SendExtents(
    const WriterOp& op, size_t first, size_t count, absl::Time limit,
    const std::atomic<bool>& stop) {
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    return NcclError("ncclGroupStart", r, comm_);
  }
  ncclResult_t posted = ncclSuccess;
  for (size_t i = first; i < first + count; ++i) {
    const Extent& x = op.extents[i];
    for (uint64_t done = 0;
         done < x.length && (posted == ncclSuccess || posted == ncclInProgress);
         done += kMaxPieceBytes) {
      posted = ncclSend(op.local_base + x.local_offset + done,
                        std::min(kMaxPieceBytes, x.length - done), ncclUint8,
                        kReceiverRank, comm_, stream_);
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (posted != ncclSuccess && posted != ncclInProgress) {
    return NcclError("ncclSend", posted, comm_);
  }
  return AwaitComm(comm_, ended, "ncclGroupEnd (send)", limit, stop,
                   PollBackoff(transport_.options_));
}

// --- Tearing down.

void NcclTransport::PeerWriter::SayGoodbye() {
  Staging& staging = *transport_.staging_;
  const int slot = staging.Take(/*for_export=*/false);
  if (slot < 0) return;
  WriterOp close;
  close.kind = MessageKind::kClose;
  const absl::Time give_up = absl::Now() + kCloseLinger;
  const std::atomic<bool> never{false};
  if (!Issue(&close, slot, give_up, never).ok()) return;
  Backoff wait = PollBackoff(transport_.options_);
  while (absl::Now() < give_up &&
         cudaEventQuery(staging.events[slot]) == cudaErrorNotReady) {
    wait.Sleep();
  }
}

// Each operation past its deadline fails with DEADLINE_EXCEEDED instead.
absl::Status NcclTransport::PeerWriter::WhyUnfinishedFail(
    const absl::Status& ended_with) const {
  if (stopping_) {
    return absl::CancelledError(
        absl::StrCat(label_, ": peer region released or transport shut down"));
  }
  if (absl::IsDeadlineExceeded(ended_with)) {
    return absl::UnavailableError(absl::StrCat(
        label_,
        ": communicator aborted after an operation passed its deadline"));
  }
  return absl::UnavailableError(
      absl::StrCat(label_, ": ", ended_with.message()));
}

void NcclTransport::PeerWriter::FailUnfinished(const absl::Status& why) {
  const absl::Time now = absl::Now();
  {
    // From now on, Enqueue fails new operations at once with `why`.
    absl::MutexLock lock(&peer_.mutex);
    peer_.failure = why;
    while (!peer_.queue.empty()) {
      ops_.push_back(std::move(peer_.queue.front()));
      peer_.queue.pop_front();
    }
  }
  for (const auto& op : ops_) {
    if (op->deadline <= now && !stopping_) {
      transport_.operations_.Complete(
          op->id,
          absl::DeadlineExceededError(absl::StrCat(
              "operation ", op->id, " did not complete by its deadline")));
    } else {
      transport_.operations_.Complete(op->id, why);
    }
  }
}

void NcclTransport::PeerWriter::EndCommunicator() {
  Staging& staging = *transport_.staging_;
  const bool drained =
      AbortAndDrain(comm_, stream_, label_,
                    "leaking its staging slots and keeping its source "
                    "regions in use");
  if (drained) {
    for (const Message& message : in_flight_) staging.Give(message.slot);
  } else {
    staging.leaked.store(true);
  }
  in_flight_.clear();
  // A started write's sends may read its source region until the stream has
  // drained: keep the region in use otherwise.
  for (const auto& op : ops_) {
    if (op->kind == MessageKind::kWrite && (drained || !op->started)) {
      transport_.ReleaseRegionUse(op->local_region);
    }
  }
}

}  // namespace pdserve::kv_transfer
