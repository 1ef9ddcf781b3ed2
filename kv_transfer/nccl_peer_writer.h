// NcclTransport::PeerWriter: the writer side of one imported peer region, run
// on the peer's own thread. It joins the receiver's communicator as rank 1
// and says HELLO (so ImportPeerRegion learns whether the data path works),
// then turns the operations posted to the peer into wire messages
// (nccl_wire.h) on one stream, completes them in stream order, and on the way
// out fails whatever is unfinished and ends the communicator. Kept apart from
// the receiver because the two ends share only the wire format and the
// communicator helpers (nccl_comm.h).
//
// Thread-safety: one writer per peer, used only on the peer's thread; it
// takes posted operations from the peer's queue under the peer's mutex.
#ifndef PDSERVE_KV_TRANSFER_NCCL_PEER_WRITER_H_
#define PDSERVE_KV_TRANSFER_NCCL_PEER_WRITER_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kv_transfer/nccl_transport.h"
#include "kv_transfer/nccl_transport_state.h"
#include "kv_transfer/nccl_wire.h"

namespace pdserve::kv_transfer {

class NcclTransport::PeerWriter {
 public:
  // `transport` and `peer` outlive the writer (the peer's thread is joined
  // before either goes away).
  PeerWriter(NcclTransport* transport, Peer* peer);
  PeerWriter(const PeerWriter&) = delete;
  PeerWriter& operator=(const PeerWriter&) = delete;

  // The peer's thread: connects (and reports it to ImportPeerRegion), serves
  // posted operations until the peer is stopped or fails, then completes
  // every operation still unfinished and ends the communicator.
  void Run();

 private:
  // A message handed to the stream, in its staging slot.
  struct Message {
    int slot;
    bool last;  // The last message of the oldest unfinished operation.
  };

  // Joins the communicator and completes the HELLO by `connect_by`.
  absl::Status Connect(absl::Time connect_by);
  // Publishes the outcome of Connect to the importing thread.
  absl::Status ReportConnection(absl::Status status);
  // Serves posted operations. Returns OK once the peer is stopped, or why
  // the communicator must be aborted.
  absl::Status Serve();
  // Waits briefly for work while idle and moves posted operations into
  // `ops_`. True once the peer is stopped.
  bool TakePosted();
  // Hands ready messages to the stream while slots allow.
  absl::Status IssueReady(bool& progressed);
  // Completes the operations whose last message has left the stream.
  absl::Status Reap(bool& progressed);
  absl::Time EarliestDeadline() const;

  // Hands the next message of `op` to the stream, in staging slot `slot`;
  // waits for NCCL to take each call until `limit` at most.
  absl::Status Issue(WriterOp* op, int slot, absl::Time limit,
                     const std::atomic<bool>& stop);
  // Writes the next message of `op` (header and body) into `host`, the
  // slot's host side, and advances `op` past it; returns its header.
  nccl_internal::WireHeader StageMessage(WriterOp* op, uint8_t* host);
  // The data of a WRITE message's extents [first, first + count).
  absl::Status SendExtents(const WriterOp& op, size_t first, size_t count,
                           absl::Time limit, const std::atomic<bool>& stop);

  // Sends CLOSE and lingers briefly for it to be taken.
  void SayGoodbye();
  // Why the unfinished operations fail, given how serving ended.
  absl::Status WhyUnfinishedFail(const absl::Status& ended_with) const;
  // Fails every unfinished or later-posted operation with `why` (or
  // DEADLINE_EXCEEDED for one past its deadline).
  void FailUnfinished(const absl::Status& why);
  // Aborts the communicator, then returns slots and source regions that the
  // drained stream no longer uses.
  void EndCommunicator();

  NcclTransport& transport_;
  Peer& peer_;
  const std::string label_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  // Unfinished operations in posting order; ops_[next_issue_] is the first
  // one not fully handed to the stream.
  std::deque<std::unique_ptr<WriterOp>> ops_;
  size_t next_issue_ = 0;
  std::deque<Message> in_flight_;  // Handed to the stream, in stream order.
  uint64_t sequence_ = 0;
  // The peer was stopped (released, or the transport is shutting down).
  bool stopping_ = false;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_NCCL_PEER_WRITER_H_
