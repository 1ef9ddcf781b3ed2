#include "kv_transfer/kv_block_transfer.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"

namespace pdserve::kv_transfer {

using ::pdserve::kv_layout::CheckKvLayoutsCompatible;
using ::pdserve::kv_layout::KvGeometry;
using ::pdserve::kv_layout::KvHalf;

namespace {

// Calls `fn(block_index, first_slot, end_slot)` for each block touched by
// `range`.
template <typename Fn>
void ForEachWrittenBlock(uint32_t block_size, WrittenRange range, Fn fn) {
  for (uint32_t pos = range.first; pos < range.end;) {
    const uint32_t index = pos / block_size;
    const uint32_t first_slot = pos % block_size;
    const uint32_t end_slot =
        std::min<uint32_t>(block_size, first_slot + (range.end - pos));
    fn(index, first_slot, end_slot);
    pos += end_slot - first_slot;
  }
}

absl::Status CheckBlocks(absl::Span<const uint32_t> blocks,
                         const KvGeometry& geometry, uint32_t num_tokens,
                         absl::string_view side) {
  const uint32_t block_size = geometry.layout().block_size_tokens();
  const uint64_t needed = (uint64_t{num_tokens} + block_size - 1) / block_size;
  if (blocks.size() != needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(side, " lists ", blocks.size(), " blocks; ", num_tokens,
                     " tokens need ", needed));
  }
  for (uint32_t b : blocks) {
    if (b >= geometry.layout().num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat(side, " block ", b, " is outside its pool of ",
                       geometry.layout().num_blocks(), " blocks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<Extent> LayerExtents(const KvGeometry& local,
                                 absl::Span<const uint32_t> local_blocks,
                                 const KvGeometry& remote,
                                 absl::Span<const uint32_t> remote_blocks,
                                 uint32_t layer, WrittenRange range) {
  std::vector<Extent> extents;
  const uint64_t token_bytes = local.token_bytes();
  ForEachWrittenBlock(
      local.layout().block_size_tokens(), range,
      [&](uint32_t index, uint32_t first_slot, uint32_t end_slot) {
        for (KvHalf half : {KvHalf::kKey, KvHalf::kValue}) {
          extents.push_back(Extent{
              local.Offset(layer, local_blocks[index], half, first_slot),
              remote.Offset(layer, remote_blocks[index], half, first_slot),
              (end_slot - first_slot) * token_bytes});
        }
      });
  return extents;
}

uint64_t LayerChecksum(const uint8_t* pool, const KvGeometry& geometry,
                       absl::Span<const uint32_t> blocks, uint32_t layer,
                       WrittenRange range) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const uint64_t token_bytes = geometry.token_bytes();
  ForEachWrittenBlock(
      geometry.layout().block_size_tokens(), range,
      [&](uint32_t index, uint32_t first_slot, uint32_t end_slot) {
        for (KvHalf half : {KvHalf::kKey, KvHalf::kValue}) {
          XXH3_64bits_update(
              state,
              pool + geometry.Offset(layer, blocks[index], half, first_slot),
              (end_slot - first_slot) * token_bytes);
        }
      });
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

absl::Status VerifyKvTransfer(const v1::KvTransferComplete& notice,
                              const v1::KvTransferTarget& target,
                              const uint8_t* pool, const KvGeometry& geometry) {
  if (notice.transfer_id() != target.transfer_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat("notice for transfer ", notice.transfer_id(),
                     " does not match transfer ", target.transfer_id()));
  }
  if (notice.first_token_position() != target.first_token_position() ||
      notice.num_tokens() != target.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", target.transfer_id(), ": notice covers positions [",
        notice.first_token_position(), ", ", notice.num_tokens(),
        "), target is [", target.first_token_position(), ", ",
        target.num_tokens(), ")"));
  }
  const uint32_t layers = geometry.layout().num_layers();
  if (notice.num_layers() != layers ||
      notice.checksum_algorithm() != v1::CHECKSUM_ALGORITHM_XXH3_64 ||
      notice.layer_checksums_size() != static_cast<int>(layers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", target.transfer_id(), ": notice has ", notice.num_layers(),
        " layers and ", notice.layer_checksums_size(), " checksums (",
        v1::ChecksumAlgorithm_Name(notice.checksum_algorithm()), "); expected ",
        layers, " XXH3_64 checksums"));
  }
  const std::vector<uint32_t> blocks(target.block_ids().begin(),
                                     target.block_ids().end());
  PD_RETURN_IF_ERROR(
      CheckBlocks(blocks, geometry, target.num_tokens(), "target"));
  const WrittenRange range{target.first_token_position(), target.num_tokens()};
  for (uint32_t layer = 0; layer < layers; ++layer) {
    const uint64_t actual = LayerChecksum(pool, geometry, blocks, layer, range);
    if (actual != notice.layer_checksums(layer)) {
      return absl::DataLossError(absl::StrCat(
          "transfer ", target.transfer_id(), ": KV of layer ", layer,
          " is corrupt (checksum ", absl::Hex(actual), ", writer sent ",
          absl::Hex(notice.layer_checksums(layer)), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvTransferWriter>> KvTransferWriter::Create(
    KvTransferWriterOptions options) {
  if (options.transport == nullptr || options.local_pool == nullptr) {
    return absl::InvalidArgumentError("writer needs a transport and a pool");
  }
  const v1::KvTransferTarget& target = options.target;
  PD_RETURN_IF_ERROR(
      CheckKvLayoutsCompatible(options.local_layout, target.layout()));
  PD_ASSIGN_OR_RETURN(KvGeometry local,
                      KvGeometry::FromProto(options.local_layout));
  PD_ASSIGN_OR_RETURN(KvGeometry remote,
                      KvGeometry::FromProto(target.layout()));
  const uint32_t block_size = local.layout().block_size_tokens();
  if (target.first_token_position() > target.num_tokens() ||
      target.first_token_position() % block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", target.transfer_id(), ": first_token_position ",
        target.first_token_position(), " must be a multiple of ", block_size,
        " and at most num_tokens ", target.num_tokens()));
  }
  const std::vector<uint32_t> remote_blocks(target.block_ids().begin(),
                                            target.block_ids().end());
  PD_RETURN_IF_ERROR(
      CheckBlocks(remote_blocks, remote, target.num_tokens(), "target"));
  PD_RETURN_IF_ERROR(CheckBlocks(options.local_block_ids, local,
                                 target.num_tokens(), "prefill side"));
  return std::unique_ptr<KvTransferWriter>(new KvTransferWriter(
      std::move(options), std::move(local), std::move(remote)));
}

KvTransferWriter::KvTransferWriter(KvTransferWriterOptions options,
                                   KvGeometry local, KvGeometry remote)
    : options_(std::move(options)),
      local_(std::move(local)),
      remote_(std::move(remote)),
      range_{options_.target.first_token_position(),
             options_.target.num_tokens()},
      layer_written_(local_.layout().num_layers(), false),
      checksums_(local_.layout().num_layers(), 0),
      deadline_(
          options_.target.expires_in_ms() == 0
              ? options_.deadline
              : std::min(options_.deadline,
                         absl::Now() + absl::Milliseconds(
                                           options_.target.expires_in_ms()))) {}

KvTransferWriter::~KvTransferWriter() {
  if (!finished_ || !pending_.empty()) Abort();
}

absl::Status KvTransferWriter::WriteLayer(uint32_t layer) {
  if (!failure_.ok()) return failure_;
  if (layer >= layer_written_.size() || layer_written_[layer]) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is out of range or already written"));
  }
  // Fail fast: if an earlier layer's write already failed (dead peer), stop
  // here rather than after computing and posting every remaining layer.
  std::vector<OperationId> running;
  for (OperationId op : pending_) {
    const OperationStatus status = options_.transport->Poll(op);
    if (status.state == OperationState::kFailed) {
      Fail(status.status);
      return failure_;
    }
    if (status.state == OperationState::kInProgress) running.push_back(op);
  }
  pending_ = std::move(running);
  const std::vector<uint32_t> remote_blocks(options_.target.block_ids().begin(),
                                            options_.target.block_ids().end());
  WriteRequest request;
  request.local_region = options_.local_region;
  request.remote_region = options_.remote_region;
  request.extents = LayerExtents(local_, options_.local_block_ids, remote_,
                                 remote_blocks, layer, range_);
  request.deadline = deadline_;
  checksums_[layer] = LayerChecksum(options_.local_pool, local_,
                                    options_.local_block_ids, layer, range_);
  layer_written_[layer] = true;
  if (request.extents.empty()) return absl::OkStatus();  // Fully cached.
  const absl::Time now = absl::Now();
  if (now >= deadline_) {
    // Never post past the deadline: the decode worker may have reused the
    // blocks, and a transport may close the whole connection to stop an
    // overdue write, failing other transfers with it.
    Fail(absl::DeadlineExceededError(
        "the deadline (or the decode worker's reservation) passed before "
        "the KV was written"));
    return failure_;
  }
  if (first_post_ == absl::InfiniteFuture()) first_post_ = now;
  absl::StatusOr<OperationId> op = options_.transport->PostWrite(request);
  if (!op.ok()) {
    Fail(op.status());
    return failure_;
  }
  pending_.push_back(*op);
  bytes_posted_ += TotalBytes(request.extents);
  return absl::OkStatus();
}

absl::StatusOr<v1::KvTransferComplete> KvTransferWriter::Finish() {
  if (!failure_.ok()) return failure_;
  for (size_t layer = 0; layer < layer_written_.size(); ++layer) {
    if (!layer_written_[layer]) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, " was never written"));
    }
  }
  while (!pending_.empty()) {
    const absl::Status status =
        options_.transport->Wait(pending_.back(), deadline_);
    if (!status.ok()) {
      Fail(status);
      return failure_;
    }
    pending_.pop_back();
  }
  v1::KvTransferComplete notice;
  notice.set_transfer_id(options_.target.transfer_id());
  notice.set_request_id(options_.target.request_id());
  notice.set_prefill_worker_id(options_.prefill_worker_id);
  notice.set_num_layers(local_.layout().num_layers());
  notice.set_first_token_position(range_.first);
  notice.set_num_tokens(range_.end);
  notice.set_bytes_written(bytes_posted_);
  notice.set_checksum_algorithm(v1::CHECKSUM_ALGORITHM_XXH3_64);
  for (uint64_t c : checksums_) notice.add_layer_checksums(c);
  notice.set_transport(options_.transport->kind());
  notice.set_transfer_ms(
      first_post_ == absl::InfiniteFuture()
          ? 0.0
          : absl::ToDoubleMilliseconds(absl::Now() - first_post_));
  absl::StatusOr<OperationId> op = options_.transport->PostNotice(
      options_.remote_region, options_.target.transfer_id(),
      notice.SerializeAsString(), deadline_);
  if (!op.ok()) {
    Fail(op.status());
    return failure_;
  }
  if (const absl::Status sent = options_.transport->Wait(*op, deadline_);
      !sent.ok()) {
    pending_.push_back(*op);  // Cancelled with the rest: never sent late.
    Fail(sent);
    return failure_;
  }
  finished_ = true;
  return notice;
}

void KvTransferWriter::Fail(const absl::Status& status) {
  if (failure_.ok()) {
    failure_ = absl::Status(
        status.code(), absl::StrCat("transfer ", options_.target.transfer_id(),
                                    ": ", status.message()));
  }
  finished_ = true;
}

bool KvTransferWriter::Quiesce(absl::Time deadline) {
  finished_ = true;
  if (failure_.ok()) {
    failure_ = absl::AbortedError(absl::StrCat(
        "transfer ", options_.target.transfer_id(), " was aborted"));
  }
  bool clean = true;
  while (!pending_.empty()) {
    // Wait() forgets a finished operation, whatever its status; only one
    // still running at the deadline answers DEADLINE_EXCEEDED and stays.
    const absl::Status status =
        options_.transport->Wait(pending_.back(), deadline);
    if (status.code() == absl::StatusCode::kDeadlineExceeded &&
        absl::Now() >= deadline) {
      Abort();
      return false;
    }
    // A failure (or an operation already forgotten because it failed) may
    // leave bytes in flight: the blocks must be quarantined.
    clean &= status.ok();
    pending_.pop_back();
  }
  return clean;
}

void KvTransferWriter::Abort() {
  for (OperationId op : pending_) options_.transport->Cancel(op);
  for (OperationId op : pending_) (void)options_.transport->Poll(op);
  pending_.clear();
  finished_ = true;
  if (failure_.ok()) {
    failure_ = absl::AbortedError(absl::StrCat(
        "transfer ", options_.target.transfer_id(), " was aborted"));
  }
}

}  // namespace pdserve::kv_transfer
