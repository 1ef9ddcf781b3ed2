// UcxTransport's engine room: the UCP context and worker, the progress thread
// that makes every UCX call (running the commands the public methods queue,
// progressing the worker, sleeping on its events when idle), and the receive
// side, which is all UCX's: peers write straight into registered memory, and
// only notices arrive, as active messages handled here.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kv_transfer/ucx_transport.h"
#include "kv_transfer/ucx_transport_state.h"

namespace pdserve::kv_transfer {

using ucx_internal::kNoticeAmId;
using ucx_internal::UcxError;

namespace {

// MemoryRegionDescriptor.shared_memory_domain of this process: the boot id
// and the IPC and PID namespaces, which together decide whether another
// process's System V or POSIX (/proc/<pid>/fd) shared memory is the same
// memory here. Empty when any of them cannot be read.
std::string SharedMemoryDomain() {
  std::ifstream boot_id_file("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot_id_file, boot_id);
  std::error_code ipc_error, pid_error;
  const std::filesystem::path ipc =
      std::filesystem::read_symlink("/proc/self/ns/ipc", ipc_error);
  const std::filesystem::path pid =
      std::filesystem::read_symlink("/proc/self/ns/pid", pid_error);
  if (boot_id.empty() || ipc_error || pid_error) return "";
  return absl::StrCat(boot_id, "/", ipc.string(), "/", pid.string());
}

// How long the progress thread spins after the last activity, while work is
// in flight, before it sleeps on UCX's events.
constexpr absl::Duration kBusySpin = absl::Microseconds(200);

// How long a transport keeps progressing after destruction starts.
constexpr absl::Duration kShutdownLinger = absl::Milliseconds(50);

}  // namespace

ucs_status_t UcxTransport::State::OnNotice(void* arg, const void* header,
                                           size_t header_length, void* data,
                                           size_t length,
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
  s.shared_memory_domain = SharedMemoryDomain();

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

}  // namespace pdserve::kv_transfer
