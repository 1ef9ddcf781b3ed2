// UcxTransport's endpoints to peers (see ucx_transport_state.h): connecting,
// failing a connection and force-closing its endpoint, and the remote keys
// unpacked on each endpoint. Runs on the progress thread.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "kv_transfer/ucx_transport_state.h"

namespace pdserve::kv_transfer {
namespace ucx_internal {

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  const std::string message =
      absl::StrCat(what, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_INVALID_PARAM:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnavailableError(message);
  }
}

}  // namespace ucx_internal

using ucx_internal::UcxError;

namespace {

// After an endpoint fails, how long new operations to that peer fail at once
// before a reconnection is tried.
constexpr absl::Duration kReconnectBackoff = absl::Seconds(1);

// The lanes of `ep` as UCX prints them, reduced to "lane: tl/device" pairs.
std::string DescribeLanes(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "?";
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::vector<std::string> lanes;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // e.g. "#                 lane[0]:  3:posix/memory.0 md[2] ... rma_bw#0"
    const size_t lane = line.find("lane[");
    if (lane == absl::string_view::npos) continue;
    lanes.emplace_back(absl::StripAsciiWhitespace(line.substr(lane)));
  }
  std::free(text);
  return lanes.empty() ? "(no lanes yet)" : absl::StrJoin(lanes, "; ");
}

}  // namespace

void UcxTransport::State::OnEndpointError(void* arg, ucp_ep_h ep,
                                          ucs_status_t status) {
  auto* connection = static_cast<Connection*>(arg);
  if (connection->ep != ep) return;  // An older incarnation.
  connection->state->FailConnection(
      connection, UcxError(absl::StrCat("connection to peer failed"), status));
}

absl::StatusOr<UcxTransport::State::Connection*>
UcxTransport::State::GetConnection(const std::string& address) {
  std::unique_ptr<Connection>& slot = connections[address];
  if (slot == nullptr) {
    slot = std::make_unique<Connection>();
    slot->state = this;
    slot->address = address;
  }
  Connection* connection = slot.get();
  if (connection->ep != nullptr) return connection;
  if (absl::Now() - connection->failed_at < kReconnectBackoff) {
    return connection->failure;
  }
  ucp_ep_params_t params = {};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &State::OnEndpointError;
  params.err_handler.arg = connection;
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(worker, &params, &ep);
  if (status != UCS_OK) {
    return UcxError("cannot create a UCX endpoint to the peer", status);
  }
  connection->ep = ep;
  connection->generation = next_generation++;
  connection->lanes = DescribeLanes(ep);
  PD_LOG(INFO) << owner->options_.name << ": UCX endpoint "
               << connection->generation << " uses " << connection->lanes;
  return connection;
}

void UcxTransport::State::FailConnection(Connection* connection,
                                         const absl::Status& why) {
  if (connection->ep == nullptr) return;
  PD_LOG(WARNING) << owner->options_.name << ": UCX endpoint "
                  << connection->generation << " failed: " << why;
  for (auto& [id, op] : ops) {
    if (op->connection == connection &&
        op->generation == connection->generation) {
      owner->operations_.Complete(id, why);
    }
  }
  // UCX allows destroying an rkey only once the operations using it are
  // over: the forced close below ends them; destroy after it completes.
  for (auto& [id, peer] : peers) {
    if (peer->address == connection->address) {
      DropRkey(peer.get(), /*after_close=*/true);
    }
  }
  eps_to_close.push_back(connection->ep);
  connection->ep = nullptr;
  connection->failure = why;
  connection->failed_at = absl::Now();
}

void UcxTransport::State::CloseScheduledEndpoints() {
  for (ucp_ep_h ep : eps_to_close) {
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
      closing.push_back(request);
    }
  }
  eps_to_close.clear();
  // Release close requests that have completed.
  std::vector<void*> still_closing;
  for (void* request : closing) {
    if (ucp_request_check_status(request) == UCS_INPROGRESS) {
      still_closing.push_back(request);
    } else {
      ucp_request_free(request);
    }
  }
  closing.swap(still_closing);
  if (closing.empty()) {
    for (ucp_rkey_h rkey : rkeys_to_destroy) ucp_rkey_destroy(rkey);
    rkeys_to_destroy.clear();
  }
}

absl::StatusOr<ucp_rkey_h> UcxTransport::State::RkeyFor(
    PeerRegion* peer, Connection* connection) {
  if (peer->rkey != nullptr &&
      peer->rkey_generation == connection->generation) {
    return peer->rkey;
  }
  DropRkey(peer, /*after_close=*/false);
  const ucs_status_t status =
      ucp_ep_rkey_unpack(connection->ep, peer->packed_rkey.data(), &peer->rkey);
  if (status != UCS_OK) {
    return UcxError("cannot unpack the peer's remote key", status);
  }
  peer->rkey_generation = connection->generation;
  // Shared memory (a region the peer allocated through UCX, on this host)
  // maps into our address space: writes then store straight into it. The
  // endpoint keeps peer error handling, which in UCX 1.13 only its TCP lanes
  // offer, for the notices; see ucx_transport.h. Our own domain check comes
  // first, so a mapping is never trusted across machines or namespaces on
  // UCX's word alone.
  void* mapped = nullptr;
  if (peer->memory_kind == v1::MEMORY_KIND_HOST &&
      !shared_memory_domain.empty() &&
      peer->shared_memory_domain == shared_memory_domain &&
      ucp_rkey_ptr(peer->rkey, peer->base, &mapped) == UCS_OK) {
    // One mapping covers the region when both ends map contiguously.
    void* last = nullptr;
    if (ucp_rkey_ptr(peer->rkey, peer->base + peer->length - 1, &last) ==
            UCS_OK &&
        static_cast<uint8_t*>(last) ==
            static_cast<uint8_t*>(mapped) + peer->length - 1) {
      SetDirect(peer, static_cast<uint8_t*>(mapped));
    }
  }
  return peer->rkey;
}

void UcxTransport::State::SetDirect(PeerRegion* peer, uint8_t* direct) {
  absl::MutexLock lock(&owner->bounds_mutex_);
  peer->direct = direct;
  auto it = owner->peer_bounds_.find(peer->id);
  if (it != owner->peer_bounds_.end()) it->second.direct = direct;
}

void UcxTransport::State::DropRkey(PeerRegion* peer, bool after_close) {
  if (peer->direct != nullptr) SetDirect(peer, nullptr);
  if (peer->rkey == nullptr) return;
  if (after_close) {
    rkeys_to_destroy.push_back(peer->rkey);
  } else {
    ucp_rkey_destroy(peer->rkey);
  }
  peer->rkey = nullptr;
}

}  // namespace pdserve::kv_transfer
