// OperationTable: the bookkeeping every transport backend shares for its
// posted operations: ids, states, and waiting for completion with a
// deadline. (Operation deadlines are enforced by each backend, which knows
// how to stop its own work.)
//
// A backend adds an operation when it posts it, completes it from wherever
// the completion is observed (a progress thread, a callback, inline), and
// lets Poll/Wait report and forget it.
//
// Thread-safety: all methods are thread-safe.
#ifndef PDSERVE_KV_TRANSFER_OPERATION_TABLE_H_
#define PDSERVE_KV_TRANSFER_OPERATION_TABLE_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kv_transfer/transport.h"

namespace pdserve::kv_transfer {

class OperationTable {
 public:
  // A new in-progress operation.
  OperationId Add();

  // Finishes `op` with `status` (OK = done). The first completion wins;
  // later ones are ignored. Returns whether this call finished it.
  bool Complete(OperationId op, absl::Status status);

  // KvTransport::Poll / Wait semantics (see transport.h).
  OperationStatus Poll(OperationId op);
  absl::Status Wait(OperationId op, absl::Time deadline);

  // True when `op` has finished (done, failed, cancelled) or is unknown.
  bool IsFinished(OperationId op);

  // Number of operations not yet reported.
  size_t size();

 private:
  struct Entry {
    bool finished = false;
    absl::Status status;
  };

  absl::Mutex mutex_;
  absl::flat_hash_map<OperationId, Entry> entries_ ABSL_GUARDED_BY(mutex_);
  OperationId next_id_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_OPERATION_TABLE_H_
