// Moving one request's KV blocks, layer by layer, and certifying them.
//
// The prefill side creates a KvTransferWriter for a KvTransferTarget that a
// decode worker issued, calls WriteLayer(l) as soon as layer l is computed
// (the write overlaps the remaining layers' compute), then Finish(): it waits
// for every write to be complete at the destination and sends the completion
// notice (a v1::KvTransferComplete with one XXH3-64 checksum per layer) under
// the key transfer_id. The decode side claims the notice and runs
// VerifyKvTransfer over its own copy of the bytes before decoding from them:
// a mismatch is DATA_LOSS, never a silent success.
//
// What moves (proto/kv_transfer.proto): positions [first_token_position,
// num_tokens) of the request, for each layer: in each block, K of the written
// slots then V of the written slots. Blocks of a cached prefix and slots past
// num_tokens are never written.
//
// Ownership: the writer borrows the transport and the local pool, which must
// outlive it. Thread-safety: a writer is used from one thread at a time.
#ifndef PDSERVE_KV_TRANSFER_KV_BLOCK_TRANSFER_H_
#define PDSERVE_KV_TRANSFER_KV_BLOCK_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kv_layout/kv_layout.h"
#include "kv_transfer/transport.h"
#include "proto/kv_transfer.pb.h"

namespace pdserve::kv_transfer {

// Positions [first, end) of a request whose blocks are `blocks`.
struct WrittenRange {
  uint32_t first = 0;
  uint32_t end = 0;
};

// The extents that move `range` of `layer` from `local_blocks` (in a pool of
// `local` geometry) to `remote_blocks` (pool of `remote` geometry).
std::vector<Extent> LayerExtents(const kv_layout::KvGeometry& local,
                                 absl::Span<const uint32_t> local_blocks,
                                 const kv_layout::KvGeometry& remote,
                                 absl::Span<const uint32_t> remote_blocks,
                                 uint32_t layer, WrittenRange range);

// XXH3-64 (seed 0) of `range` of `layer` in the pool at `pool`, in the byte
// order defined for KvTransferComplete.layer_checksums.
uint64_t LayerChecksum(const uint8_t* pool,
                       const kv_layout::KvGeometry& geometry,
                       absl::Span<const uint32_t> blocks, uint32_t layer,
                       WrittenRange range);

// Checks a completion notice against the target this decode worker issued
// and the bytes now in its pool (`pool`, laid out as `geometry`).
// DATA_LOSS naming the first layer whose checksum differs; INVALID_ARGUMENT
// for a notice that does not describe the target.
absl::Status VerifyKvTransfer(const v1::KvTransferComplete& notice,
                              const v1::KvTransferTarget& target,
                              const uint8_t* pool,
                              const kv_layout::KvGeometry& geometry);

struct KvTransferWriterOptions {
  KvTransport* transport = nullptr;
  // The prefill pool: its registered region, its bytes and its layout.
  RegionId local_region = 0;
  const uint8_t* local_pool = nullptr;
  v1::KvLayout local_layout;
  // The request's blocks in the prefill pool, in sequence order; as many as
  // target.block_ids.
  std::vector<uint32_t> local_block_ids;
  // Where to write, as issued by the decode worker, and its region imported
  // into `transport` (ImportPeerRegion(target.region)).
  v1::KvTransferTarget target;
  PeerRegionId remote_region = 0;
  std::string prefill_worker_id;
  // Every write and the notice must be complete by then. Capped at
  // target.expires_in_ms from Create(): past the admission's life the decode
  // worker reuses the blocks, so no write may still be running.
  absl::Time deadline = absl::InfiniteFuture();
};

class KvTransferWriter {
 public:
  // FAILED_PRECONDITION when the layouts differ (other than pool size);
  // INVALID_ARGUMENT for inconsistent block lists or positions.
  static absl::StatusOr<std::unique_ptr<KvTransferWriter>> Create(
      KvTransferWriterOptions options);
  ~KvTransferWriter();  // Abort()s unless Finish() succeeded.

  // Posts the writes of `layer` (each layer exactly once, any order) and
  // checksums its source bytes. Fails (and aborts the transfer) if a write
  // posted earlier has failed.
  absl::Status WriteLayer(uint32_t layer);

  // Waits until every layer's writes are complete at the destination, then
  // sends the completion notice and waits for it to be sent. Returns the
  // notice. Every layer must have been written.
  absl::StatusOr<v1::KvTransferComplete> Finish();

  // Cancels whatever is in flight. Bytes already posted may still land: the
  // decode worker must quarantine the blocks (writes_quiesced = false).
  // After Abort (or any failure) WriteLayer and Finish refuse to continue.
  void Abort();

  // Stops the transfer (like Abort) but, instead of cancelling, waits until
  // every write posted so far has finished. True when all of them finished
  // successfully by `deadline`: their bytes have landed and nothing of this
  // transfer can land any more, so the decode worker may reuse its blocks at
  // once (writes_quiesced = true). False when one is still running or
  // failed (a failed write's bytes may still be in flight, see
  // transport.h): the rest is cancelled as by Abort and the decode worker
  // quarantines the blocks.
  bool Quiesce(absl::Time deadline);

  uint64_t bytes_posted() const { return bytes_posted_; }

 private:
  KvTransferWriter(KvTransferWriterOptions options, kv_layout::KvGeometry local,
                   kv_layout::KvGeometry remote);
  // Records the first failure (prefixed with the transfer id) and stops
  // posting; writes already posted keep running until Quiesce or Abort.
  void Fail(const absl::Status& status);

  const KvTransferWriterOptions options_;
  const kv_layout::KvGeometry local_;
  const kv_layout::KvGeometry remote_;
  const WrittenRange range_;
  std::vector<OperationId> pending_;
  std::vector<bool> layer_written_;
  std::vector<uint64_t> checksums_;
  uint64_t bytes_posted_ = 0;
  absl::Time first_post_ = absl::InfiniteFuture();
  absl::Time deadline_;
  bool finished_ = false;
  // Set by the first failure or Abort; every later call returns it.
  absl::Status failure_;
};

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_KV_BLOCK_TRANSFER_H_
