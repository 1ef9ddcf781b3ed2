// KvAdmissions: the decode worker's ledger of KV blocks reserved for
// transfers ("admission first": no KV is ever sent to a worker without room
// for it).
//
// Admit() reserves the blocks a request's tokens need from the decode pool
// and issues the KvTransferTarget a prefill worker writes into. From then on
// every admission ends in exactly one of:
//   Claim()   the transfer was verified; the blocks pass to the decode batch
//             (the caller now owns them and releases them to the pool);
//   Release() the request failed or was cancelled: blocks are freed at once
//             if no write can still land (writes_quiesced), else quarantined;
//   expiry    the writer never completed within the admission's time to
//             live: the blocks are quarantined (a late write may still land).
// Quarantined blocks return to the pool `quarantine` after the admission's
// own time to live has run out: writers cap their deadline at the target's
// expires_in_ms (KvTransferWriter), so by then any write from a dead or
// stalled writer has failed, and a late write can never corrupt another
// request.
// Nothing is ever stranded: Expire() is the backstop for every path.
//
// Time is passed in (`now`), so expiry is deterministic in tests.
// Thread-safety: all methods are thread-safe. The block pool is not owned.
#ifndef PDSERVE_DECODE_WORKER_KV_ADMISSIONS_H_
#define PDSERVE_DECODE_WORKER_KV_ADMISSIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/block_pool.h"
#include "proto/kv_transfer.pb.h"

namespace pdserve::decode_worker {

struct KvAdmissionsOptions {
  std::string worker_id;
  // gRPC address of this worker's DecodeWorker service (for the target's
  // notify_address).
  std::string notify_address;
  // The decode pool's layout (num_blocks set) and its exported region.
  v1::KvLayout layout;
  v1::MemoryRegionDescriptor region;
  // An admission whose transfer is not complete by then is expired.
  absl::Duration time_to_live = absl::Seconds(30);
  // How long blocks possibly still being written wait before reuse.
  absl::Duration quarantine = absl::Seconds(10);
};

struct KvAdmissionStats {
  int32_t admissions = 0;       // Reserved, not yet claimed or released.
  int32_t reserved_blocks = 0;  // Held by those admissions.
  int32_t quarantined_blocks = 0;
};

class KvAdmissions {
 public:
  // INVALID_ARGUMENT for a layout without blocks or a pool of another size.
  static absl::StatusOr<std::unique_ptr<KvAdmissions>> Create(
      const KvAdmissionsOptions& options, engine::BlockPool* pool);

  // Reserves blocks for `num_tokens` tokens of `request_id`. INVALID_ARGUMENT
  // for 0 tokens; RESOURCE_EXHAUSTED when the pool cannot hold them now.
  absl::StatusOr<v1::KvTransferTarget> Admit(const std::string& request_id,
                                             uint32_t attempt,
                                             uint32_t num_tokens,
                                             absl::Time now);

  // The target issued for `transfer_id` (to verify its completion notice).
  absl::StatusOr<v1::KvTransferTarget> Find(const std::string& transfer_id);

  // Hands a verified transfer's blocks to the caller (the decode batch) and
  // forgets the admission. NOT_FOUND when unknown, expired or released.
  absl::StatusOr<std::vector<engine::BlockId>> Claim(
      const std::string& transfer_id);

  // Ends an admission without decoding. NOT_FOUND when unknown.
  absl::Status Release(const std::string& transfer_id, bool writes_quiesced,
                       absl::Time now);

  // Cancel: releases the admissions of `request_id` made for `attempt`
  // (0 = every attempt), so a late cancel of an abandoned attempt leaves a
  // retry alone. Returns how many were released.
  int ReleaseRequest(const std::string& request_id, uint32_t attempt,
                     bool writes_quiesced, absl::Time now);

  // Expires admissions past their time to live (into quarantine) and frees
  // quarantined blocks whose quarantine is over. Returns the transfer ids
  // that expired.
  std::vector<std::string> Expire(absl::Time now);

  KvAdmissionStats stats();

 private:
  struct Admission {
    v1::KvTransferTarget target;
    uint32_t attempt = 0;
    std::vector<engine::BlockId> blocks;
    absl::Time expires;
  };
  struct Quarantined {
    std::vector<engine::BlockId> blocks;
    absl::Time until;
  };

  KvAdmissions(const KvAdmissionsOptions& options, engine::BlockPool* pool)
      : options_(options), pool_(pool) {}

  void QuarantineLocked(std::vector<engine::BlockId> blocks,
                        absl::Time admission_expiry, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const KvAdmissionsOptions options_;
  engine::BlockPool* const pool_;
  absl::Mutex mutex_;
  absl::flat_hash_map<std::string, Admission> admissions_
      ABSL_GUARDED_BY(mutex_);
  std::vector<Quarantined> quarantine_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_transfer_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace pdserve::decode_worker

#endif  // PDSERVE_DECODE_WORKER_KV_ADMISSIONS_H_
