#include "decode_worker/kv_admissions.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pdserve::decode_worker {

absl::StatusOr<std::unique_ptr<KvAdmissions>> KvAdmissions::Create(
    const KvAdmissionsOptions& options, KvReserver* reserver) {
  if (reserver == nullptr || options.layout.num_blocks() == 0 ||
      options.layout.block_size_tokens() == 0) {
    return absl::InvalidArgumentError(
        "admissions need a reserver and a layout with blocks");
  }
  return std::unique_ptr<KvAdmissions>(new KvAdmissions(options, reserver));
}

absl::StatusOr<v1::KvTransferTarget> KvAdmissions::Admit(
    const std::string& request_id, uint32_t attempt,
    absl::Span<const int32_t> tokens, absl::Time now,
    absl::Duration time_to_live) {
  if (time_to_live <= absl::ZeroDuration() ||
      time_to_live > options_.time_to_live) {
    time_to_live = options_.time_to_live;
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, ": nothing to admit"));
  }
  const uint32_t block_size = options_.layout.block_size_tokens();
  const uint64_t blocks = (tokens.size() + block_size - 1) / block_size;
  if (blocks > options_.layout.num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, ": ", tokens.size(),
                     " tokens need more blocks than this worker has (",
                     options_.layout.num_blocks(), ")"));
  }
  absl::StatusOr<KvReserver::Reservation> reserved = reserver_->Reserve(tokens);
  if (!reserved.ok()) {
    return absl::Status(reserved.status().code(),
                        absl::StrCat("request ", request_id, ": ",
                                     reserved.status().message()));
  }
  Admission admission;
  admission.handle = reserved->handle;
  admission.num_blocks = static_cast<int32_t>(reserved->blocks.size());
  admission.expires = now + time_to_live;
  admission.attempt = attempt;
  v1::KvTransferTarget& target = admission.target;
  target.set_request_id(request_id);
  target.set_decode_worker_id(options_.worker_id);
  target.set_notify_address(options_.notify_address);
  *target.mutable_layout() = options_.layout;
  *target.mutable_region() = options_.region;
  for (engine::BlockId b : reserved->blocks) target.add_block_ids(b);
  target.set_num_tokens(static_cast<uint32_t>(tokens.size()));
  target.set_first_token_position(reserved->cached_tokens);
  target.set_expires_in_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(time_to_live)));
  absl::MutexLock lock(&mutex_);
  target.set_transfer_id(
      absl::StrCat(options_.worker_id, "/", next_transfer_++));
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

absl::StatusOr<int64_t> KvAdmissions::Claim(const std::string& transfer_id) {
  absl::MutexLock lock(&mutex_);
  auto it = admissions_.find(transfer_id);
  if (it == admissions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no admission ", transfer_id, " (expired or released)"));
  }
  const int64_t handle = it->second.handle;
  admissions_.erase(it);
  return handle;
}

absl::Status KvAdmissions::Release(const std::string& transfer_id,
                                   bool writes_quiesced, absl::Time now) {
  int64_t handle = 0;
  {
    absl::MutexLock lock(&mutex_);
    auto it = admissions_.find(transfer_id);
    if (it == admissions_.end()) {
      auto q = std::find_if(
          quarantine_.begin(), quarantine_.end(),
          [&](const Quarantined& q) { return q.transfer_id == transfer_id; });
      if (!writes_quiesced || q == quarantine_.end()) {
        return absl::NotFoundError(absl::StrCat("no admission ", transfer_id));
      }
      handle = q->handle;
      quarantine_.erase(q);
    } else if (!writes_quiesced) {
      QuarantineLocked(transfer_id, it->second, now);
      admissions_.erase(it);
      return absl::OkStatus();
    } else {
      handle = it->second.handle;
      admissions_.erase(it);
    }
  }
  reserver_->Free(handle);
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

void KvAdmissions::QuarantineLocked(const std::string& transfer_id,
                                    const Admission& admission,
                                    absl::Time now) {
  quarantine_.push_back(
      Quarantined{transfer_id, admission.handle, admission.num_blocks,
                  std::max(now, admission.expires) + options_.quarantine});
}

std::vector<std::string> KvAdmissions::Expire(absl::Time now) {
  std::vector<std::string> expired;
  // "transfer T of request R", for the log.
  std::vector<std::string> described;
  std::vector<int64_t> to_free;
  {
    absl::MutexLock lock(&mutex_);
    for (auto it = admissions_.begin(); it != admissions_.end();) {
      if (it->second.expires <= now) {
        expired.push_back(it->first);
        described.push_back(absl::StrCat("transfer ", it->first, " of request ",
                                         it->second.target.request_id()));
        ++expired_;
        QuarantineLocked(it->first, it->second, now);
        admissions_.erase(it++);
      } else {
        ++it;
      }
    }
    std::vector<Quarantined> still;
    for (Quarantined& q : quarantine_) {
      if (q.until <= now) {
        to_free.push_back(q.handle);
      } else {
        still.push_back(q);
      }
    }
    quarantine_ = std::move(still);
  }
  for (int64_t handle : to_free) reserver_->Free(handle);
  for (const std::string& what : described) {
    PD_LOG(WARNING) << "admission of " << what
                    << " expired before its transfer completed";
  }
  return expired;
}

KvAdmissionStats KvAdmissions::stats() {
  absl::MutexLock lock(&mutex_);
  KvAdmissionStats stats;
  stats.admissions = static_cast<int32_t>(admissions_.size());
  stats.expired = expired_;
  for (const auto& [id, a] : admissions_) {
    stats.reserved_blocks += a.num_blocks;
  }
  for (const Quarantined& q : quarantine_) {
    stats.quarantined_blocks += q.num_blocks;
  }
  return stats;
}

}  // namespace pdserve::decode_worker
