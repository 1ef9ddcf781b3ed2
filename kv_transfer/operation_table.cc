#include "kv_transfer/operation_table.h"

#include "absl/strings/str_cat.h"

namespace pdserve::kv_transfer {

OperationId OperationTable::Add() {
  absl::MutexLock lock(&mutex_);
  const OperationId id = next_id_++;
  entries_[id] = Entry();
  return id;
}

bool OperationTable::Complete(OperationId op, absl::Status status) {
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(op);
  if (it == entries_.end() || it->second.finished) return false;
  it->second.finished = true;
  it->second.status = std::move(status);
  return true;
}

OperationStatus OperationTable::Poll(OperationId op) {
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(op);
  if (it == entries_.end()) {
    return {OperationState::kFailed,
            absl::NotFoundError(absl::StrCat("no operation ", op))};
  }
  if (!it->second.finished) return {OperationState::kInProgress, {}};
  OperationStatus result{
      it->second.status.ok() ? OperationState::kDone : OperationState::kFailed,
      it->second.status};
  entries_.erase(it);
  return result;
}

absl::Status OperationTable::Wait(OperationId op, absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  auto finished_or_unknown = [this,
                              op]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    auto it = entries_.find(op);
    return it == entries_.end() || it->second.finished;
  };
  mutex_.AwaitWithDeadline(absl::Condition(&finished_or_unknown), deadline);
  auto it = entries_.find(op);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("no operation ", op));
  }
  if (!it->second.finished) {
    return absl::DeadlineExceededError(
        absl::StrCat("operation ", op, " still in progress"));
  }
  absl::Status status = std::move(it->second.status);
  entries_.erase(it);
  return status;
}

bool OperationTable::IsFinished(OperationId op) {
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(op);
  return it == entries_.end() || it->second.finished;
}

size_t OperationTable::size() {
  absl::MutexLock lock(&mutex_);
  return entries_.size();
}

}  // namespace pdserve::kv_transfer
