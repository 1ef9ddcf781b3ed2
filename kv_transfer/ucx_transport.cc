#include "kv_transfer/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"

namespace pdserve::kv_transfer {
namespace {

// Active-message id of notices.
constexpr unsigned kNoticeAmId = 17;

// How long the progress thread spins after the last activity, while work is
// in flight, before it sleeps on UCX's events.
constexpr absl::Duration kBusySpin = absl::Microseconds(200);

// How long a transport keeps progressing after destruction starts.
constexpr absl::Duration kShutdownLinger = absl::Milliseconds(50);

// After an endpoint fails, how long new operations to that peer fail at once
// before a reconnection is tried.
constexpr absl::Duration kReconnectBackoff = absl::Seconds(1);

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

// ---------------------------------------------------------------------------
// Progress-thread state.

struct UcxTransport::State {
  struct Connection;

  struct LocalRegion {
    uint8_t* base = nullptr;
    uint64_t length = 0;
    ucp_mem_h memh = nullptr;
    v1::MemoryKind memory_kind = v1::MEMORY_KIND_HOST;
    int device_id = 0;
    std::string packed_rkey;
    int inflight = 0;  // Writes from this region not yet finished.
  };

  struct PeerRegion {
    std::string address;  // The peer worker's address (opaque bytes).
    std::string packed_rkey;
    uint64_t base = 0;
    uint64_t length = 0;
    ucp_rkey_h rkey = nullptr;  // Unpacked on `rkey_generation`'s ep.
    uint64_t rkey_generation = 0;
    int inflight = 0;       // Writes using the rkey, not yet finished.
    bool released = false;  // ReleasePeerRegion called; freed at inflight 0.
  };

  struct Connection {
    State* state = nullptr;
    std::string address;
    ucp_ep_h ep = nullptr;
    uint64_t generation = 0;  // Changes whenever the ep is recreated.
    std::string lanes;
    // Why and when the last endpoint failed. Operations posted within
    // kReconnectBackoff of a failure fail at once with it, instead of
    // hammering a dead peer with connection attempts.
    absl::Status failure;
    absl::Time failed_at = absl::InfinitePast();
  };

  // One posted write or notice whose UCX requests are outstanding.
  struct Op {
    State* state = nullptr;
    OperationId id = 0;
    Connection* connection = nullptr;
    uint64_t generation = 0;
    LocalRegion* local = nullptr;  // Writes only.
    PeerRegion* peer = nullptr;    // Writes only; its rkey is in use.
    absl::Status put_error;        // A put that could not be posted.
    absl::Time deadline;
    // Notices: sent after the flush completes.
    std::string key;
    std::string payload;
    bool notice_sent = false;
  };

  UcxTransport* owner = nullptr;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string worker_address;
  int epoll_fd = -1;

  uint64_t next_id = 1;
  uint64_t next_generation = 1;
  absl::flat_hash_map<RegionId, std::unique_ptr<LocalRegion>> regions;
  absl::flat_hash_map<PeerRegionId, std::unique_ptr<PeerRegion>> peers;
  absl::flat_hash_map<std::string, std::unique_ptr<Connection>> connections;
  absl::flat_hash_map<OperationId, std::unique_ptr<Op>> ops;
  // Endpoints to close outside UCX callbacks, and their close requests.
  std::vector<ucp_ep_h> eps_to_close;
  std::vector<void*> closing;
  // Remote keys of failed endpoints, destroyed once their closes complete.
  std::vector<ucp_rkey_h> rkeys_to_destroy;

  // --- connections ---------------------------------------------------------

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* connection = static_cast<Connection*>(arg);
    if (connection->ep != ep) return;  // An older incarnation.
    connection->state->FailConnection(
        connection,
        UcxError(absl::StrCat("connection to peer failed"), status));
  }

  absl::StatusOr<Connection*> GetConnection(const std::string& address) {
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

  // Fails every operation on `connection`, forgets its rkeys and schedules
  // its endpoint for a forced close; the next operation reconnects.
  void FailConnection(Connection* connection, const absl::Status& why) {
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
      if (peer->address == connection->address && peer->rkey != nullptr) {
        rkeys_to_destroy.push_back(peer->rkey);
        peer->rkey = nullptr;
      }
    }
    eps_to_close.push_back(connection->ep);
    connection->ep = nullptr;
    connection->failure = why;
    connection->failed_at = absl::Now();
  }

  void CloseScheduledEndpoints() {
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

  absl::StatusOr<ucp_rkey_h> RkeyFor(PeerRegion* peer, Connection* connection) {
    if (peer->rkey != nullptr &&
        peer->rkey_generation == connection->generation) {
      return peer->rkey;
    }
    if (peer->rkey != nullptr) ucp_rkey_destroy(peer->rkey);
    peer->rkey = nullptr;
    const ucs_status_t status = ucp_ep_rkey_unpack(
        connection->ep, peer->packed_rkey.data(), &peer->rkey);
    if (status != UCS_OK) {
      return UcxError("cannot unpack the peer's remote key", status);
    }
    peer->rkey_generation = connection->generation;
    return peer->rkey;
  }

  // --- operations ----------------------------------------------------------

  static void OnFlushed(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->state->FlushDone(op, status);
    ucp_request_free(request);
  }

  static void OnNoticeSent(void* request, ucs_status_t status,
                           void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->state->Finish(op, status == UCS_OK
                              ? absl::OkStatus()
                              : UcxError("sending the notice", status));
    ucp_request_free(request);
  }

  // Forgets `op` once its UCX requests are over, reporting `status` unless
  // the operation was already finished (cancelled, deadline, peer failure).
  void Finish(Op* op, absl::Status status) {
    owner->operations_.Complete(op->id, std::move(status));
    if (op->local != nullptr) --op->local->inflight;
    if (op->peer != nullptr && --op->peer->inflight == 0 &&
        op->peer->released) {
      DestroyPeer(op->peer);
    }
    ops.erase(op->id);
  }

  // Frees a released peer region once no write uses its rkey.
  void DestroyPeer(PeerRegion* peer) {
    for (auto it = peers.begin(); it != peers.end(); ++it) {
      if (it->second.get() != peer) continue;
      if (peer->rkey != nullptr) ucp_rkey_destroy(peer->rkey);
      peers.erase(it);
      return;
    }
  }

  void FlushDone(Op* op, ucs_status_t status) {
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

  void SendNotice(Op* op) {
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

  // True while the endpoint `op` was posted on is still the connection's.
  // UCX may run the error handler inside a put or flush call, which clears
  // the connection's endpoint under our feet.
  static bool EndpointAlive(const Op* op) {
    return op->connection->ep != nullptr &&
           op->generation == op->connection->generation;
  }

  // Flushes the op's endpoint; completion continues in FlushDone.
  void Flush(Op* op) {
    if (!EndpointAlive(op)) {
      Finish(op, absl::UnavailableError("connection to the peer was lost"));
      return;
    }
    ucp_request_param_t param = {};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &State::OnFlushed;
    param.user_data = op;
    void* request = ucp_ep_flush_nbx(op->connection->ep, &param);
    if (request == nullptr) {
      FlushDone(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      FlushDone(op, UCS_PTR_STATUS(request));
    }
  }

  Op* NewOp(OperationId id, Connection* connection, absl::Time deadline) {
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

  void StartWrite(OperationId id, const WriteRequest& request) {
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
    for (const Extent& e : CoalesceExtents(request.extents)) {
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

  void StartNotice(OperationId id, PeerRegionId remote, std::string key,
                   std::string payload, absl::Time deadline) {
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

  // Fails operations past their deadline and force-closes their endpoints:
  // a stalled peer must not hold requests (or write late) forever.
  void ExpireOperations(absl::Time now) {
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

  // --- notices -------------------------------------------------------------

  static ucs_status_t OnNotice(void* arg, const void* header,
                               size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* state = static_cast<State*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      // Notices are sent eagerly; a rendezvous one is not ours.
      PD_LOG(WARNING) << "dropping an unexpected rendezvous notice";
      return UCS_OK;
    }
    std::string key(static_cast<const char*>(header), header_length);
    state->owner->mailbox_.Deliver(
        key, std::string(static_cast<const char*>(data), length));
    return UCS_OK;
  }
};

// ---------------------------------------------------------------------------
// Public API.

UcxTransport::UcxTransport(const UcxTransportOptions& options)
    : options_(options), state_(std::make_unique<State>()) {
  state_->owner = this;
}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  auto transport = std::unique_ptr<UcxTransport>(new UcxTransport(options));
  PD_RETURN_IF_ERROR(transport->Start());
  return transport;
}

absl::Status UcxTransport::Start() {
  State& s = *state_;
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return UcxError("ucp_config_read", status);
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = options_.name.c_str();
  status = ucp_init(&params, config, &s.context);
  ucp_config_release(config);
  if (status != UCS_OK) return UcxError("ucp_init", status);

  ucp_worker_params_t worker_params = {};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Created and destroyed on the caller's thread, run on the progress thread:
  // one thread at a time, not always the same one.
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  status = ucp_worker_create(s.context, &worker_params, &s.worker);
  if (status != UCS_OK) return UcxError("ucp_worker_create", status);

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(s.worker, &address, &address_length);
  if (status != UCS_OK) return UcxError("ucp_worker_get_address", status);
  s.worker_address.assign(reinterpret_cast<const char*>(address),
                          address_length);
  ucp_worker_release_address(s.worker, address);

  ucp_am_handler_param_t handler = {};
  handler.field_mask =
      UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  handler.id = kNoticeAmId;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  handler.cb = &State::OnNotice;
  handler.arg = &s;
  status = ucp_worker_set_am_recv_handler(s.worker, &handler);
  if (status != UCS_OK)
    return UcxError("ucp_worker_set_am_recv_handler", status);

  int ucx_fd = -1;
  status = ucp_worker_get_efd(s.worker, &ucx_fd);
  if (status != UCS_OK) return UcxError("ucp_worker_get_efd", status);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || s.epoll_fd < 0) {
    return absl::InternalError("cannot create the progress thread's fds");
  }
  epoll_event event = {};
  event.events = EPOLLIN;
  event.data.fd = ucx_fd;
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, ucx_fd, &event);
  event.data.fd = wake_fd_;
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, wake_fd_, &event);

  progress_thread_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (progress_thread_.joinable()) {
    // Let the progress thread answer what peers sent last (replies to their
    // writes, handshakes) before it stops: UCX 1.13 aborts in
    // ucp_worker_destroy when such exchanges are cut short.
    absl::SleepFor(kShutdownLinger);
    {
      absl::MutexLock lock(&queue_mutex_);
      stopping_ = true;
    }
    Wake();
    progress_thread_.join();
  }
  State& s = *state_;
  // The progress thread has stopped: tear down on this thread.
  for (auto& [id, op] : s.ops) {
    operations_.Complete(id, absl::CancelledError("transport shut down"));
  }
  if (s.worker != nullptr) {
    // Healthy endpoints close gracefully (flush), so the peer sees an orderly
    // disconnect; failed ones were already force-closed.
    for (auto& [address, connection] : s.connections) {
      if (connection->ep == nullptr) continue;
      ucp_request_param_t param = {};
      void* request = ucp_ep_close_nbx(connection->ep, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
        s.closing.push_back(request);
      }
      connection->ep = nullptr;
    }
    s.CloseScheduledEndpoints();
    // Let closes, cancelled requests and any connection handshake still in
    // flight (a peer that just connected to us) finish: UCX 1.13 asserts if
    // a worker is destroyed with wireup messages pending. Bounded, so a dead
    // peer cannot hold shutdown.
    const absl::Time give_up = absl::Now() + absl::Seconds(2);
    absl::Time quiet_since = absl::Now();
    while (absl::Now() < give_up) {
      if (ucp_worker_progress(s.worker) != 0) quiet_since = absl::Now();
      s.CloseScheduledEndpoints();
      if (s.closing.empty() && s.ops.empty() &&
          absl::Now() - quiet_since > absl::Milliseconds(50)) {
        break;
      }
    }
  }
  if (!s.ops.empty() || !s.closing.empty()) {
    // UCX still holds callbacks into our state; freeing it (or the worker)
    // now would be a use-after-free. Leave it all to process exit.
    PD_LOG(ERROR) << options_.name << ": " << s.ops.size()
                  << " operations did not finish at shutdown; leaving the "
                     "UCX worker in place";
    state_.release();
    if (s.epoll_fd >= 0) ::close(s.epoll_fd);
    return;  // wake_fd_ stays open: the leaked state may still refer to it.
  }
  for (auto& [id, peer] : s.peers) {
    if (peer->rkey != nullptr) ucp_rkey_destroy(peer->rkey);
  }
  s.peers.clear();
  for (ucp_rkey_h rkey : s.rkeys_to_destroy) ucp_rkey_destroy(rkey);
  s.rkeys_to_destroy.clear();
  s.connections.clear();
  for (auto& [id, region] : s.regions) ucp_mem_unmap(s.context, region->memh);
  s.regions.clear();
  PD_LOG(DEBUG) << options_.name << ": destroying the UCX worker";
  if (s.worker != nullptr) ucp_worker_destroy(s.worker);
  if (s.context != nullptr) ucp_cleanup(s.context);
  if (s.epoll_fd >= 0) ::close(s.epoll_fd);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void UcxTransport::Enqueue(std::function<void(State&)> command) {
  {
    absl::MutexLock lock(&queue_mutex_);
    queue_.push_back(std::move(command));
  }
  Wake();
}

void UcxTransport::Wake() {
  const uint64_t one = 1;
  // An eventfd write only fails when the counter would overflow, in which
  // case the thread is awake anyway.
  if (::write(wake_fd_, &one, sizeof(one)) != sizeof(one)) return;
}

void UcxTransport::RunAndWait(std::function<void(State&)> command) {
  absl::Notification done;
  Enqueue([&](State& s) {
    command(s);
    done.Notify();
  });
  done.WaitForNotification();
}

void UcxTransport::ProgressLoop() {
  State& s = *state_;
  absl::Time last_activity = absl::Now();
  while (true) {
    std::deque<std::function<void(State&)>> commands;
    {
      absl::MutexLock lock(&queue_mutex_);
      if (stopping_) break;
      commands.swap(queue_);
    }
    for (auto& command : commands) command(s);
    // Deadlines first, so an overdue write's queued bytes are not sent.
    const absl::Time now = absl::Now();
    s.ExpireOperations(now);
    bool progressed = !commands.empty();
    while (ucp_worker_progress(s.worker) != 0) progressed = true;
    s.CloseScheduledEndpoints();
    if (progressed) last_activity = now;
    // With work in flight, spin briefly after the last activity (lowest
    // latency), then sleep on UCX's events like when idle: a stalled or slow
    // peer must not cost a whole core, which prefill compute needs.
    const bool working = !s.ops.empty() || !s.closing.empty();
    if (working && absl::Now() - last_activity < kBusySpin) continue;

    // Sleep until UCX has an event, a command arrives, or the poll interval
    // passes (for transports that raise no events).
    if (ucp_worker_arm(s.worker) == UCS_ERR_BUSY) continue;
    epoll_event events[2];
    const int n = ::epoll_wait(
        s.epoll_fd, events, 2,
        static_cast<int>(std::max<int64_t>(
            1, absl::ToInt64Milliseconds(options_.idle_poll_interval))));
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t value;
        if (::read(wake_fd_, &value, sizeof(value)) != sizeof(value)) {
          continue;  // Nothing to drain (EAGAIN).
        }
      }
    }
  }
}

absl::StatusOr<RegionId> UcxTransport::RegisterRegion(
    void* base, uint64_t length, v1::MemoryKind memory_kind, int device_id) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("cannot register an empty region");
  }
  if (memory_kind != v1::MEMORY_KIND_HOST &&
      memory_kind != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError("unknown memory kind");
  }
  absl::StatusOr<RegionId> result;
  RunAndWait([&](State& s) {
    ucp_mem_map_params_t params = {};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = base;
    params.length = length;
    params.memory_type = memory_kind == v1::MEMORY_KIND_CUDA
                             ? UCS_MEMORY_TYPE_CUDA
                             : UCS_MEMORY_TYPE_HOST;
    auto region = std::make_unique<State::LocalRegion>();
    ucs_status_t status = ucp_mem_map(s.context, &params, &region->memh);
    if (status != UCS_OK) {
      result = UcxError("ucp_mem_map", status);
      return;
    }
    void* rkey = nullptr;
    size_t rkey_size = 0;
    status = ucp_rkey_pack(s.context, region->memh, &rkey, &rkey_size);
    if (status != UCS_OK) {
      ucp_mem_unmap(s.context, region->memh);
      result = UcxError("ucp_rkey_pack", status);
      return;
    }
    region->packed_rkey.assign(static_cast<const char*>(rkey), rkey_size);
    ucp_rkey_buffer_release(rkey);
    region->base = static_cast<uint8_t*>(base);
    region->length = length;
    region->memory_kind = memory_kind;
    region->device_id = device_id;
    const RegionId id = s.next_id++;
    s.regions[id] = std::move(region);
    absl::MutexLock lock(&sizes_mutex_);
    region_sizes_[id] = length;
    result = id;
  });
  return result;
}

absl::Status UcxTransport::DeregisterRegion(RegionId region) {
  absl::Status result;
  RunAndWait([&](State& s) {
    auto it = s.regions.find(region);
    if (it == s.regions.end()) {
      result = absl::NotFoundError(absl::StrCat("no region ", region));
    } else if (it->second->inflight > 0) {
      result = absl::FailedPreconditionError(
          absl::StrCat("region ", region, " has ", it->second->inflight,
                       " writes in flight"));
    } else {
      ucp_mem_unmap(s.context, it->second->memh);
      s.regions.erase(it);
      absl::MutexLock lock(&sizes_mutex_);
      region_sizes_.erase(region);
    }
  });
  return result;
}

absl::StatusOr<v1::MemoryRegionDescriptor> UcxTransport::ExportRegion(
    RegionId region) {
  absl::StatusOr<v1::MemoryRegionDescriptor> result;
  RunAndWait([&](State& s) {
    auto it = s.regions.find(region);
    if (it == s.regions.end()) {
      result = absl::NotFoundError(absl::StrCat("no region ", region));
      return;
    }
    v1::MemoryRegionDescriptor descriptor;
    descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
    descriptor.set_region_id(
        absl::StrCat(options_.name, "/", ::getpid(), "#", region));
    descriptor.set_peer_address(s.worker_address);
    descriptor.set_remote_key(it->second->packed_rkey);
    descriptor.set_base_address(reinterpret_cast<uint64_t>(it->second->base));
    descriptor.set_length_bytes(it->second->length);
    descriptor.set_memory_kind(it->second->memory_kind);
    descriptor.set_device_id(it->second->device_id);
    result = std::move(descriptor);
  });
  return result;
}

absl::StatusOr<PeerRegionId> UcxTransport::ImportPeerRegion(
    const v1::MemoryRegionDescriptor& descriptor) {
  if (descriptor.transport() != v1::TRANSPORT_KIND_UCX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "descriptor is for transport ",
        v1::TransportKind_Name(descriptor.transport()), ", not UCX"));
  }
  if (descriptor.peer_address().empty() || descriptor.remote_key().empty() ||
      descriptor.length_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX descriptor ", descriptor.region_id(),
                     " lacks a worker address, remote key or length"));
  }
  absl::StatusOr<PeerRegionId> result;
  RunAndWait([&](State& s) {
    auto peer = std::make_unique<State::PeerRegion>();
    peer->address = descriptor.peer_address();
    peer->packed_rkey = descriptor.remote_key();
    peer->base = descriptor.base_address();
    peer->length = descriptor.length_bytes();
    // Connect now, so an unreachable peer is reported here.
    absl::StatusOr<State::Connection*> connection =
        s.GetConnection(peer->address);
    if (!connection.ok()) {
      result = connection.status();
      return;
    }
    if (absl::StatusOr<ucp_rkey_h> rkey = s.RkeyFor(peer.get(), *connection);
        !rkey.ok()) {
      result = rkey.status();
      return;
    }
    const PeerRegionId id = s.next_id++;
    absl::MutexLock lock(&sizes_mutex_);
    peer_sizes_[id] = peer->length;
    s.peers[id] = std::move(peer);
    result = id;
  });
  return result;
}

absl::Status UcxTransport::ReleasePeerRegion(PeerRegionId peer) {
  absl::Status result;
  RunAndWait([&](State& s) {
    auto it = s.peers.find(peer);
    if (it == s.peers.end() || it->second->released) {
      result = absl::NotFoundError(absl::StrCat("no peer region ", peer));
      return;
    }
    {
      absl::MutexLock lock(&sizes_mutex_);
      peer_sizes_.erase(peer);  // No new writes to it.
    }
    if (it->second->inflight > 0) {
      it->second->released = true;  // Freed when its last write ends.
    } else {
      if (it->second->rkey != nullptr) ucp_rkey_destroy(it->second->rkey);
      s.peers.erase(it);
    }
  });
  return result;
}

absl::StatusOr<OperationId> UcxTransport::PostWrite(
    const WriteRequest& request) {
  // Validated here, on the caller's thread; the progress thread rechecks
  // that both regions still exist when it starts the write.
  {
    absl::MutexLock lock(&sizes_mutex_);
    auto local = region_sizes_.find(request.local_region);
    auto peer = peer_sizes_.find(request.remote_region);
    if (local == region_sizes_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no local region ", request.local_region));
    }
    if (peer == peer_sizes_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", request.remote_region));
    }
    PD_RETURN_IF_ERROR(
        ValidateExtents(request.extents, local->second, peer->second));
  }
  const OperationId id = operations_.Add();
  Enqueue([this, id, request](State& s) { s.StartWrite(id, request); });
  return id;
}

absl::StatusOr<OperationId> UcxTransport::PostNotice(PeerRegionId remote_region,
                                                     const std::string& key,
                                                     const std::string& payload,
                                                     absl::Time deadline) {
  if (payload.size() > kMaxNoticeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notice of ", payload.size(), " bytes exceeds ", kMaxNoticeBytes));
  }
  if (key.empty()) return absl::InvalidArgumentError("notice key is empty");
  const OperationId id = operations_.Add();
  Enqueue([=](State& s) {
    s.StartNotice(id, remote_region, key, payload, deadline);
  });
  return id;
}

absl::StatusOr<std::string> UcxTransport::DescribeConnection(
    PeerRegionId peer) {
  absl::StatusOr<std::string> result;
  RunAndWait([&](State& s) {
    auto it = s.peers.find(peer);
    if (it == s.peers.end() || it->second->released) {
      result = absl::NotFoundError(absl::StrCat("no peer region ", peer));
      return;
    }
    absl::StatusOr<State::Connection*> connection =
        s.GetConnection(it->second->address);
    if (!connection.ok()) {
      result = connection.status();
    } else {
      result = (*connection)->lanes;
    }
  });
  return result;
}

UcxTransport::ResourceCounts UcxTransport::resource_counts() {
  ResourceCounts counts;
  RunAndWait([&](State& s) {
    counts.regions = s.regions.size();
    for (const auto& [id, peer] : s.peers) {
      counts.peer_regions += !peer->released;
    }
    for (const auto& [address, connection] : s.connections) {
      counts.connections += connection->ep != nullptr;
    }
    counts.pending_operations = s.ops.size();
  });
  return counts;
}

}  // namespace pdserve::kv_transfer
