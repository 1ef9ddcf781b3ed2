#include "decode_worker/kv_admissions.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdserve::decode_worker {

absl::StatusOr<std::unique_ptr<KvAdmissions>> KvAdmissions::Create(
    const KvAdmissionsOptions& options, engine::BlockPool* pool) {
  if (pool == nullptr || options.layout.num_blocks() == 0 ||
      options.layout.block_size_tokens() == 0) {
    return absl::InvalidArgumentError(
        "admissions need a block pool and a layout with blocks");
  }
  if (static_cast<uint32_t>(pool->num_total()) != options.layout.num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool has ", pool->num_total(),
                     " blocks, the layout says ", options.layout.num_blocks()));
  }
  return std::unique_ptr<KvAdmissions>(new KvAdmissions(options, pool));
}

absl::StatusOr<v1::KvTransferTarget> KvAdmissions::Admit(
    const std::string& request_id, uint32_t attempt, uint32_t num_tokens,
    absl::Time now) {
  if (num_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, ": nothing to admit"));
  }
  const uint32_t block_size = options_.layout.block_size_tokens();
  const uint64_t blocks = (uint64_t{num_tokens} + block_size - 1) / block_size;
  if (blocks > options_.layout.num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, ": ", num_tokens,
                     " tokens need more blocks than this worker has (",
                     options_.layout.num_blocks(), ")"));
  }
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<std::vector<engine::BlockId>> reserved =
      pool_->Allocate(static_cast<int32_t>(blocks));
  if (!reserved.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request ", request_id, ": no room for ", blocks,
                     " KV blocks (", pool_->num_free(), " free)"));
  }
  Admission admission;
  admission.blocks = std::move(reserved).value();
  admission.expires = now + options_.time_to_live;
  admission.attempt = attempt;
  v1::KvTransferTarget& target = admission.target;
  target.set_transfer_id(
      absl::StrCat(options_.worker_id, "/", next_transfer_++));
  target.set_request_id(request_id);
  target.set_decode_worker_id(options_.worker_id);
  target.set_notify_address(options_.notify_address);
  *target.mutable_layout() = options_.layout;
  *target.mutable_region() = options_.region;
  for (engine::BlockId b : admission.blocks) target.add_block_ids(b);
  target.set_num_tokens(num_tokens);
  target.set_first_token_position(0);  // No decode-side prefix cache yet.
  target.set_expires_in_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.time_to_live)));
  v1::KvTransferTarget issued = target;
  admissions_[target.transfer_id()] = std::move(admission);
  return issued;
}

absl::StatusOr<v1::KvTransferTarget> KvAdmissions::Find(
    const std::string& transfer_id) {
  absl::MutexLock lock(&mutex_);
  auto it = admissions_.find(transfer_id);
  if (it == admissions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no admission ", transfer_id, " (expired or released)"));
  }
  return it->second.target;
}

absl::StatusOr<std::vector<engine::BlockId>> KvAdmissions::Claim(
    const std::string& transfer_id) {
  absl::MutexLock lock(&mutex_);
  auto it = admissions_.find(transfer_id);
  if (it == admissions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no admission ", transfer_id, " (expired or released)"));
  }
  std::vector<engine::BlockId> blocks = std::move(it->second.blocks);
  admissions_.erase(it);
  return blocks;
}

absl::Status KvAdmissions::Release(const std::string& transfer_id,
                                   bool writes_quiesced, absl::Time now) {
  absl::MutexLock lock(&mutex_);
  auto it = admissions_.find(transfer_id);
  if (it == admissions_.end()) {
    return absl::NotFoundError(absl::StrCat("no admission ", transfer_id));
  }
  std::vector<engine::BlockId> blocks = std::move(it->second.blocks);
  const absl::Time expiry = it->second.expires;
  admissions_.erase(it);
  if (writes_quiesced) return pool_->Release(blocks);
  QuarantineLocked(std::move(blocks), expiry, now);
  return absl::OkStatus();
}

int KvAdmissions::ReleaseRequest(const std::string& request_id,
                                 uint32_t attempt, bool writes_quiesced,
                                 absl::Time now) {
  std::vector<std::string> matching;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [id, a] : admissions_) {
      if (a.target.request_id() == request_id &&
          (attempt == 0 || a.attempt == attempt)) {
        matching.push_back(id);
      }
    }
  }
  int released = 0;
  for (const std::string& id : matching) {
    released += Release(id, writes_quiesced, now).ok();
  }
  return released;
}

void KvAdmissions::QuarantineLocked(std::vector<engine::BlockId> blocks,
                                    absl::Time admission_expiry,
                                    absl::Time now) {
  quarantine_.push_back(
      Quarantined{std::move(blocks),
                  std::max(now, admission_expiry) + options_.quarantine});
}

std::vector<std::string> KvAdmissions::Expire(absl::Time now) {
  absl::MutexLock lock(&mutex_);
  std::vector<std::string> expired;
  for (auto it = admissions_.begin(); it != admissions_.end();) {
    if (it->second.expires <= now) {
      expired.push_back(it->first);
      QuarantineLocked(std::move(it->second.blocks), it->second.expires, now);
      admissions_.erase(it++);
    } else {
      ++it;
    }
  }
  std::vector<Quarantined> still;
  for (Quarantined& q : quarantine_) {
    if (q.until <= now) {
      if (absl::Status s = pool_->Release(q.blocks); !s.ok()) {
        PD_LOG(ERROR) << "releasing quarantined blocks: " << s;
      }
    } else {
      still.push_back(std::move(q));
    }
  }
  quarantine_ = std::move(still);
  for (const std::string& id : expired) {
    PD_LOG(WARNING) << "admission " << id
                    << " expired before its transfer completed";
  }
  return expired;
}

KvAdmissionStats KvAdmissions::stats() {
  absl::MutexLock lock(&mutex_);
  KvAdmissionStats stats;
  stats.admissions = static_cast<int32_t>(admissions_.size());
  for (const auto& [id, a] : admissions_) {
    stats.reserved_blocks += static_cast<int32_t>(a.blocks.size());
  }
  for (const Quarantined& q : quarantine_) {
    stats.quarantined_blocks += static_cast<int32_t>(q.blocks.size());
  }
  return stats;
}

}  // namespace pdserve::decode_worker
