// UcxTransport::State: everything UCX that a UcxTransport owns (context,
// worker, registered and imported regions, endpoints, outstanding
// operations), touched only on the progress thread. Shared by the files that
// implement UcxTransport:
//   ucx_worker.cc       the UCP context and worker, the progress thread and
//                       its commands, and received notices;
//   ucx_connections.cc  endpoints to peers and their remote keys;
//   ucx_send_path.cc    writes and notices, from posting to completion;
//   ucx_transport.cc    the public methods, as commands to the thread.
//
// Thread-safety: none; the progress thread (or, once it has stopped, the
// destructor) is the only user.
#ifndef PDSERVE_KV_TRANSFER_UCX_TRANSPORT_STATE_H_
#define PDSERVE_KV_TRANSFER_UCX_TRANSPORT_STATE_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kv_transfer/transport.h"
#include "kv_transfer/ucx_transport.h"

namespace pdserve::kv_transfer {
namespace ucx_internal {

// Active-message id of notices.
constexpr unsigned kNoticeAmId = 17;

// UCX's status as a status: CANCELLED, RESOURCE_EXHAUSTED, INVALID_ARGUMENT
// where UCX says so, UNAVAILABLE otherwise.
absl::Status UcxError(absl::string_view what, ucs_status_t status);

}  // namespace ucx_internal

struct UcxTransport::State {
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
    PeerRegionId id = 0;
    std::string address;  // The peer worker's address (opaque bytes).
    std::string packed_rkey;
    uint64_t base = 0;
    uint64_t length = 0;
    v1::MemoryKind memory_kind = v1::MEMORY_KIND_HOST;
    // From the descriptor: which processes may map the region's memory.
    std::string shared_memory_domain;
    ucp_rkey_h rkey = nullptr;  // Unpacked on `rkey_generation`'s ep.
    uint64_t rkey_generation = 0;
    // The region's memory mapped into this process (ucp_rkey_ptr), when it
    // is shared memory of a process in our domain; valid while `rkey` is.
    // Writes store into it directly instead of putting through the ep.
    uint8_t* direct = nullptr;
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
  // This process's MemoryRegionDescriptor.shared_memory_domain; empty when
  // it cannot be read (then no region is written directly).
  std::string shared_memory_domain;
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

  // --- connections (ucx_connections.cc) -----------------------------------

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // The live connection to the worker at `address`, connecting if needed.
  absl::StatusOr<Connection*> GetConnection(const std::string& address);
  // Fails every operation on `connection`, forgets its rkeys and schedules
  // its endpoint for a forced close; the next operation reconnects.
  void FailConnection(Connection* connection, const absl::Status& why);
  void CloseScheduledEndpoints();
  // `peer`'s remote key, unpacked on `connection`'s current endpoint (and
  // `peer->direct` set where the region can be stored into directly).
  absl::StatusOr<ucp_rkey_h> RkeyFor(PeerRegion* peer, Connection* connection);
  // Forgets `peer`'s remote key (and its mapping); destroyed at once, or
  // once the endpoint's forced close completes (`after_close`).
  void DropRkey(PeerRegion* peer, bool after_close);
  // Sets `peer->direct` and what PostWrite sees of it (owner->peer_bounds_),
  // under the writer lock: no caller is storing into the old mapping after.
  void SetDirect(PeerRegion* peer, uint8_t* direct);

  // --- operations (ucx_send_path.cc) ---------------------------------------

  static void OnFlushed(void* request, ucs_status_t status, void* user_data);
  static void OnNoticeSent(void* request, ucs_status_t status, void* user_data);
  // Forgets `op` once its UCX requests are over, reporting `status` unless
  // the operation was already finished (cancelled, deadline, peer failure).
  void Finish(Op* op, absl::Status status);
  // Frees a released peer region once no write uses its rkey.
  void DestroyPeer(PeerRegion* peer);
  void FlushDone(Op* op, ucs_status_t status);
  void SendNotice(Op* op);
  // True while the endpoint `op` was posted on is still the connection's.
  // UCX may run the error handler inside a put or flush call, which clears
  // the connection's endpoint under our feet.
  static bool EndpointAlive(const Op* op);
  // Flushes the op's endpoint; completion continues in FlushDone.
  void Flush(Op* op);
  Op* NewOp(OperationId id, Connection* connection, absl::Time deadline);
  void StartWrite(OperationId id, const WriteRequest& request);
  void StartNotice(OperationId id, PeerRegionId remote, std::string key,
                   std::string payload, absl::Time deadline);
  // Fails operations past their deadline and force-closes their endpoints:
  // a stalled peer must not hold requests (or write late) forever.
  void ExpireOperations(absl::Time now);

  // --- notices (ucx_worker.cc) ---------------------------------------------

  static ucs_status_t OnNotice(void* arg, const void* header,
                               size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_UCX_TRANSPORT_STATE_H_
