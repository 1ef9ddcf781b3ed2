// TransportBase: what every KvTransport backend shares. It owns the table of
// posted operations and the mailbox of received notices, and implements
// Poll, Wait, Cancel and AwaitNotice on them; a backend completes operations
// in `operations_` and delivers notices to `mailbox_` from wherever it
// observes them (a progress thread, a callback, inline).
//
// Cancel only marks the operation CANCELLED; backends whose in-flight work
// must also be told override it. Thread-safety: as OperationTable and
// NoticeMailbox, fully thread-safe.
#ifndef PDSERVE_KV_TRANSFER_TRANSPORT_BASE_H_
#define PDSERVE_KV_TRANSFER_TRANSPORT_BASE_H_

#include <string>

#include "kv_transfer/notice_mailbox.h"
#include "kv_transfer/operation_table.h"
#include "kv_transfer/transport.h"

namespace pdserve::kv_transfer {

class TransportBase : public KvTransport {
 public:
  OperationStatus Poll(OperationId op) final { return operations_.Poll(op); }
  absl::Status Wait(OperationId op, absl::Time deadline) final {
    return operations_.Wait(op, deadline);
  }
  void Cancel(OperationId op) override {
    operations_.Complete(op, absl::CancelledError("cancelled"));
  }
  absl::StatusOr<std::string> AwaitNotice(const std::string& key,
                                          absl::Time deadline) final {
    return mailbox_.Await(key, deadline);
  }

 protected:
  OperationTable operations_;
  NoticeMailbox mailbox_;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_TRANSPORT_BASE_H_
