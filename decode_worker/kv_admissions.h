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
// request. A writer that has seen all its writes finish says so
// (Release with writes_quiesced), which frees the blocks at once, also
// when they are already in quarantine.
// Nothing is ever stranded: Expire() is the backstop for every path.
//
// Blocks come from a KvReserver: the decode engine's KV cache in the worker
// (so reservations, prefix-cache hits and running sequences share one
// accounting), a plain block pool in tests.
//
// Time is passed in (`now`), so expiry is deterministic in tests.
// Thread-safety: all methods are thread-safe. The reserver is not owned; it
// is called without the ledger's lock held.
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
#include "absl/types/span.h"
#include "engine/block_pool.h"
#include "proto/kv_transfer.pb.h"

namespace pdserve::decode_worker {

// Where admissions get their blocks.
class KvReserver {
 public:
  struct Reservation {
    // Names the reservation to Free (and to the decode engine).
    int64_t handle = 0;
    // Leading positions already present (local prefix cache); the writer
    // sends positions [cached_tokens, tokens.size()).
    uint32_t cached_tokens = 0;
    // One block per block_size positions of `tokens`, in order.
    std::vector<engine::BlockId> blocks;
  };
  virtual ~KvReserver() = default;
  // RESOURCE_EXHAUSTED when the blocks are not free now; INVALID_ARGUMENT
  // when the tokens can never fit.
  virtual absl::StatusOr<Reservation> Reserve(
      absl::Span<const int32_t> tokens) = 0;
  // Returns a reservation's blocks.
  virtual void Free(int64_t handle) = 0;
};

struct KvAdmissionsOptions {
  std::string worker_id;
  // gRPC address of this worker's DecodeWorker service (for the target's
  // notify_address).
  std::string notify_address;
  // The decode pool's layout (num_blocks set) and its exported region.
  v1::KvLayout layout;
  v1::MemoryRegionDescriptor region;
  // An admission whose transfer is not complete by then is expired (the
  // most an Admit may ask for; see Admit's time_to_live).
  absl::Duration time_to_live = absl::Seconds(30);
  // How long blocks possibly still being written wait before reuse.
  absl::Duration quarantine = absl::Seconds(10);
};

struct KvAdmissionStats {
  int32_t admissions = 0;       // Reserved, not yet claimed or released.
  int32_t reserved_blocks = 0;  // Held by those admissions.
  int32_t quarantined_blocks = 0;
  // Since creation: admissions whose transfer never completed in time.
  uint64_t expired = 0;
};

class KvAdmissions {
 public:
  // INVALID_ARGUMENT for a layout without blocks or no reserver.
  static absl::StatusOr<std::unique_ptr<KvAdmissions>> Create(
      const KvAdmissionsOptions& options, KvReserver* reserver);

  // Reserves blocks for the KV of `tokens` of `request_id`; the target's
  // first_token_position skips what the reserver found cached. The
  // transfer must complete within `time_to_live` (capped at the options';
  // zero: the options') — the request's own deadline, so a failed writer
  // never holds blocks longer than the request could use them.
  // INVALID_ARGUMENT for no tokens or more than the pool holds;
  // RESOURCE_EXHAUSTED when the blocks are not free now.
  absl::StatusOr<v1::KvTransferTarget> Admit(
      const std::string& request_id, uint32_t attempt,
      absl::Span<const int32_t> tokens, absl::Time now,
      absl::Duration time_to_live = absl::ZeroDuration());

  // The target issued for `transfer_id` (to verify its completion notice).
  absl::StatusOr<v1::KvTransferTarget> Find(const std::string& transfer_id);

  // Hands a verified transfer's reservation to the caller (the decode
  // batch, which now owns its blocks) and forgets the admission. NOT_FOUND
  // when unknown, expired or released.
  absl::StatusOr<int64_t> Claim(const std::string& transfer_id);

  // Ends an admission without decoding. NOT_FOUND when unknown. With
  // writes_quiesced, a transfer already in quarantine is freed too.
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
    int64_t handle = 0;
    int32_t num_blocks = 0;
    absl::Time expires;
  };
  struct Quarantined {
    std::string transfer_id;
    int64_t handle = 0;
    int32_t num_blocks = 0;
    absl::Time until;
  };

  KvAdmissions(const KvAdmissionsOptions& options, KvReserver* reserver)
      : options_(options), reserver_(reserver) {}

  void QuarantineLocked(const std::string& transfer_id,
                        const Admission& admission, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const KvAdmissionsOptions options_;
  KvReserver* const reserver_;
  absl::Mutex mutex_;
  absl::flat_hash_map<std::string, Admission> admissions_
      ABSL_GUARDED_BY(mutex_);
  std::vector<Quarantined> quarantine_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_transfer_ ABSL_GUARDED_BY(mutex_) = 1;
  uint64_t expired_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace pdserve::decode_worker

#endif  // PDSERVE_DECODE_WORKER_KV_ADMISSIONS_H_
