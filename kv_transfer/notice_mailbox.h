// NoticeMailbox: the receiving end of KvTransport notices. Notices arrive
// (from a transport's progress thread) under a key and wait until a receiver
// claims them; a receiver may also wait for a notice not yet arrived.
//
// Bounded: at most `capacity` unclaimed notices are kept; past that the
// oldest is dropped (its transfer then times out at the receiver, which is
// the same outcome as a lost notice and never corrupts anything).
//
// Thread-safety: all methods are thread-safe.
#ifndef PDSERVE_KV_TRANSFER_NOTICE_MAILBOX_H_
#define PDSERVE_KV_TRANSFER_NOTICE_MAILBOX_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pdserve::kv_transfer {

class NoticeMailbox {
 public:
  explicit NoticeMailbox(size_t capacity = 4096) : capacity_(capacity) {}

  // Stores a notice; a second notice under the same key replaces the first.
  void Deliver(const std::string& key, std::string payload);

  // The payload stored under `key`, waiting up to `deadline`; removes it.
  // DEADLINE_EXCEEDED when none arrives in time.
  absl::StatusOr<std::string> Await(const std::string& key,
                                    absl::Time deadline);

  size_t size();

 private:
  const size_t capacity_;
  absl::Mutex mutex_;
  struct Notice {
    std::string payload;
    uint64_t seq = 0;  // Arrival number.
  };
  absl::flat_hash_map<std::string, Notice> notices_ ABSL_GUARDED_BY(mutex_);
  // (key, seq) in arrival order, for dropping the oldest. Entries whose
  // notice was claimed (or replaced) are skipped and compacted away.
  std::deque<std::pair<std::string, uint64_t>> arrival_order_
      ABSL_GUARDED_BY(mutex_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_NOTICE_MAILBOX_H_
