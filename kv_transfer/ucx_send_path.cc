// UcxTransport's send path (see ucx_transport_state.h): a write is one
// ucp_put_nbx per coalesced extent and a flush of the endpoint; a notice is a
// flush, then an active message, so it arrives after every byte of the writes
// posted before it. Both are completed from UCX callbacks, or failed at their
// deadline. Runs on the progress thread.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kv_transfer/extents.h"
#include "kv_transfer/ucx_transport_state.h"

namespace pdserve::kv_transfer {

using ucx_internal::kNoticeAmId;
using ucx_internal::UcxError;

void UcxTransport::State::OnFlushed(void* request, ucs_status_t status,
                                    void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->state->FlushDone(op, status);
  ucp_request_free(request);
}

void UcxTransport::State::OnNoticeSent(void* request, ucs_status_t status,
                                       void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->state->Finish(op, status == UCS_OK
                            ? absl::OkStatus()
                            : UcxError("sending the notice", status));
  ucp_request_free(request);
}

void UcxTransport::State::Finish(Op* op, absl::Status status) {
  owner->operations_.Complete(op->id, std::move(status));
  if (op->local != nullptr) --op->local->inflight;
  if (op->peer != nullptr && --op->peer->inflight == 0 && op->peer->released) {
    DestroyPeer(op->peer);
  }
  ops.erase(op->id);
}

void UcxTransport::State::DestroyPeer(PeerRegion* peer) {
  for (auto it = peers.begin(); it != peers.end(); ++it) {
    if (it->second.get() != peer) continue;
    DropRkey(peer, /*after_close=*/false);
    peers.erase(it);
    return;
  }
}

void UcxTransport::State::FlushDone(Op* op, ucs_status_t status) {
  if (status != UCS_OK) {
    Finish(op, UcxError("writing to the peer", status));
    return;
  }
  if (!op->put_error.ok()) {  // Some extents were never posted.
    Finish(op, op->put_error);
    return;
  }
  if (op->key.empty() || op->notice_sent) {
    Finish(op, absl::OkStatus());
    return;
  }
  // A notice cancelled (or past its deadline) while its flush ran must not
  // be sent: the receiver would take an abandoned transfer as complete.
  if (owner->operations_.IsFinished(op->id)) {
    Finish(op, absl::CancelledError("notice cancelled before sending"));
    return;
  }
  SendNotice(op);
}

void UcxTransport::State::SendNotice(Op* op) {
  op->notice_sent = true;
  if (!EndpointAlive(op)) {
    Finish(op, absl::UnavailableError("connection lost before the notice"));
    return;
  }
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &State::OnNoticeSent;
  param.user_data = op;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  void* request = ucp_am_send_nbx(
      op->connection->ep, kNoticeAmId, op->key.data(), op->key.size(),
      op->payload.data(), op->payload.size(), &param);
  if (request == nullptr) {
    Finish(op, absl::OkStatus());
  } else if (UCS_PTR_IS_ERR(request)) {
    Finish(op, UcxError("sending the notice", UCS_PTR_STATUS(request)));
  }
}

bool UcxTransport::State::EndpointAlive(const Op* op) {
  return op->connection->ep != nullptr &&
         op->generation == op->connection->generation;
}

void UcxTransport::State::Flush(Op* op) {
  if (!EndpointAlive(op)) {
    Finish(op, absl::UnavailableError("connection to the peer was lost"));
    return;
  }
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &State::OnFlushed;
  param.user_data = op;
  void* request = ucp_ep_flush_nbx(op->connection->ep, &param);
  if (request == nullptr) {
    FlushDone(op, UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    FlushDone(op, UCS_PTR_STATUS(request));
  }
}

UcxTransport::State::Op* UcxTransport::State::NewOp(OperationId id,
                                                    Connection* connection,
                                                    absl::Time deadline) {
  auto op = std::make_unique<Op>();
  op->state = this;
  op->id = id;
  op->connection = connection;
  op->generation = connection->generation;
  op->deadline = deadline;
  Op* raw = op.get();
  ops[id] = std::move(op);
  return raw;
}

void UcxTransport::State::StartWrite(OperationId id,
                                     const WriteRequest& request) {
  auto fail = [&](absl::Status status) {
    owner->operations_.Complete(id, std::move(status));
  };
  auto local_it = regions.find(request.local_region);
  auto peer_it = peers.find(request.remote_region);
  if (local_it == regions.end() || peer_it == peers.end()) {
    return fail(absl::NotFoundError("region released before the write"));
  }
  LocalRegion* local = local_it->second.get();
  PeerRegion* peer = peer_it->second.get();
  absl::StatusOr<Connection*> connection = GetConnection(peer->address);
  if (!connection.ok()) return fail(connection.status());
  absl::StatusOr<ucp_rkey_h> rkey = RkeyFor(peer, *connection);
  if (!rkey.ok()) return fail(rkey.status());
  Op* op = NewOp(id, *connection, request.deadline);
  op->local = local;
  ++local->inflight;
  op->peer = peer;
  ++peer->inflight;
  const std::vector<Extent> extents = CoalesceExtents(request.extents);
  if (peer->direct != nullptr && local->memory_kind == v1::MEMORY_KIND_HOST) {
    // Mapped only now (the first write after a reconnection): store here;
    // PostWrite stores on its caller's thread from now on.
    Finish(op, CopyExtents(peer->direct, local->base, extents, op->deadline));
    return;
  }
  for (const Extent& e : extents) {
    if (!EndpointAlive(op)) break;  // Failed during an earlier put.
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    param.memh = local->memh;
    void* put =
        ucp_put_nbx((*connection)->ep, local->base + e.local_offset, e.length,
                    peer->base + e.remote_offset, *rkey, &param);
    if (UCS_PTR_IS_ERR(put)) {
      // Stop posting; the write fails once the flush of what was posted
      // is over (never reported as success with extents missing).
      op->put_error = UcxError("ucp_put_nbx", UCS_PTR_STATUS(put));
      break;
    }
    // Released by UCX on completion; the flush tracks completion.
    if (put != nullptr) ucp_request_free(put);
  }
  Flush(op);
}

void UcxTransport::State::StartNotice(OperationId id, PeerRegionId remote,
                                      std::string key, std::string payload,
                                      absl::Time deadline) {
  auto peer_it = peers.find(remote);
  if (peer_it == peers.end() || peer_it->second->released) {
    owner->operations_.Complete(
        id, absl::NotFoundError("peer region released before the notice"));
    return;
  }
  absl::StatusOr<Connection*> connection =
      GetConnection(peer_it->second->address);
  if (!connection.ok()) {
    owner->operations_.Complete(id, connection.status());
    return;
  }
  Op* op = NewOp(id, *connection, deadline);
  op->key = std::move(key);
  op->payload = std::move(payload);
  Flush(op);  // Then SendNotice.
}

void UcxTransport::State::ExpireOperations(absl::Time now) {
  std::vector<Connection*> stalled;
  for (auto& [id, op] : ops) {
    if (op->deadline <= now && op->connection->ep != nullptr &&
        op->generation == op->connection->generation) {
      owner->operations_.Complete(
          id, absl::DeadlineExceededError(absl::StrCat(
                  "operation ", id, " did not complete by its deadline")));
      stalled.push_back(op->connection);
    }
  }
  for (Connection* connection : stalled) {
    FailConnection(
        connection,
        absl::UnavailableError("connection closed after a transfer stalled"));
  }
}

}  // namespace pdserve::kv_transfer
