#include "kv_transfer/in_process_transport.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"

namespace pdserve::kv_transfer {
namespace {

// Every live instance of the process, by instance name. Lock order: this
// lock, then an instance's mutex_.
absl::Mutex registry_mutex(absl::kConstInit);
absl::flat_hash_map<std::string, InProcessTransport*>* registry
    ABSL_GUARDED_BY(registry_mutex) = nullptr;
uint64_t next_instance ABSL_GUARDED_BY(registry_mutex) = 1;

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessTransport>>
InProcessTransport::Create() {
  absl::MutexLock lock(&registry_mutex);
  if (registry == nullptr) {
    registry = new absl::flat_hash_map<std::string, InProcessTransport*>();
  }
  const std::string name = absl::StrCat(::getpid(), "/", next_instance++);
  auto transport =
      std::unique_ptr<InProcessTransport>(new InProcessTransport(name));
  (*registry)[name] = transport.get();
  return transport;
}

InProcessTransport::~InProcessTransport() {
  absl::MutexLock lock(&registry_mutex);
  registry->erase(instance_);
}

absl::StatusOr<RegionId> InProcessTransport::RegisterRegion(
    void* base, uint64_t length, v1::MemoryKind memory_kind, int device_id) {
  if (memory_kind != v1::MEMORY_KIND_HOST) {
    return absl::InvalidArgumentError(
        "the in-process transport copies host memory only");
  }
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("cannot register an empty region");
  }
  absl::MutexLock lock(&mutex_);
  const RegionId id = next_id_++;
  regions_[id] = Region{static_cast<uint8_t*>(base), length};
  return id;
}

absl::Status InProcessTransport::DeregisterRegion(RegionId region) {
  // Under the registry lock: no peer is copying into it right now.
  absl::MutexLock registry_lock(&registry_mutex);
  absl::MutexLock lock(&mutex_);
  if (regions_.erase(region) == 0) {
    return absl::NotFoundError(absl::StrCat("no region ", region));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::MemoryRegionDescriptor> InProcessTransport::ExportRegion(
    RegionId region) {
  absl::MutexLock lock(&mutex_);
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no region ", region));
  }
  v1::MemoryRegionDescriptor descriptor;
  descriptor.set_transport(v1::TRANSPORT_KIND_IN_PROCESS);
  descriptor.set_region_id(absl::StrCat(instance_, "#", region));
  descriptor.set_peer_address(instance_);
  descriptor.set_base_address(reinterpret_cast<uint64_t>(it->second.base));
  descriptor.set_length_bytes(it->second.length);
  descriptor.set_memory_kind(v1::MEMORY_KIND_HOST);
  return descriptor;
}

absl::StatusOr<PeerRegionId> InProcessTransport::ImportPeerRegion(
    const v1::MemoryRegionDescriptor& descriptor) {
  if (descriptor.transport() != v1::TRANSPORT_KIND_IN_PROCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "descriptor is for transport ",
        v1::TransportKind_Name(descriptor.transport()), ", not IN_PROCESS"));
  }
  const std::vector<std::string> parts =
      absl::StrSplit(descriptor.region_id(), '#');
  RegionId region = 0;
  if (parts.size() != 2 || parts[0] != descriptor.peer_address() ||
      !absl::SimpleAtoi(parts[1], &region)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed in-process region id '", descriptor.region_id(), "'"));
  }
  const std::string own_pid = absl::StrCat(::getpid(), "/");
  if (descriptor.peer_address().rfind(own_pid, 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("region ", descriptor.region_id(),
                     " belongs to another process; the in-process transport "
                     "cannot reach it"));
  }
  {
    absl::MutexLock registry_lock(&registry_mutex);
    if (!registry->contains(descriptor.peer_address())) {
      return absl::UnavailableError(absl::StrCat(
          "in-process peer ", descriptor.peer_address(), " is gone"));
    }
  }
  absl::MutexLock lock(&mutex_);
  const PeerRegionId id = next_id_++;
  peers_[id] = Peer{descriptor.peer_address(), region};
  return id;
}

absl::Status InProcessTransport::ReleasePeerRegion(PeerRegionId peer) {
  absl::MutexLock lock(&mutex_);
  if (peers_.erase(peer) == 0) {
    return absl::NotFoundError(absl::StrCat("no peer region ", peer));
  }
  return absl::OkStatus();
}

absl::StatusOr<OperationId> InProcessTransport::PostWrite(
    const WriteRequest& request) {
  Region local;
  Peer peer;
  {
    absl::MutexLock lock(&mutex_);
    auto l = regions_.find(request.local_region);
    auto p = peers_.find(request.remote_region);
    if (l == regions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no local region ", request.local_region));
    }
    if (p == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", request.remote_region));
    }
    local = l->second;
    peer = p->second;
  }
  // The registry lock is held through the copy, so the peer can neither
  // disappear nor deregister the region meanwhile.
  absl::MutexLock registry_lock(&registry_mutex);
  absl::Status failure;
  Region remote{nullptr, 0};
  if (auto target = registry->find(peer.instance); target == registry->end()) {
    failure = absl::UnavailableError(
        absl::StrCat("in-process peer ", peer.instance, " is gone"));
  } else {
    absl::MutexLock peer_lock(&target->second->mutex_);
    auto r = target->second->regions_.find(peer.region);
    if (r == target->second->regions_.end()) {
      failure = absl::UnavailableError(
          absl::StrCat("peer region ", peer.region, " was deregistered"));
    } else {
      remote = r->second;
    }
  }
  if (failure.ok()) {
    PD_RETURN_IF_ERROR(
        ValidateExtents(request.extents, local.length, remote.length));
    failure = CopyExtents(remote.base, local.base,
                          CoalesceExtents(request.extents), request.deadline);
  }
  const OperationId op = operations_.Add();
  operations_.Complete(op, failure);
  return op;
}

absl::StatusOr<OperationId> InProcessTransport::PostNotice(
    PeerRegionId remote_region, const std::string& key,
    const std::string& payload, absl::Time deadline) {
  if (payload.size() > kMaxNoticeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notice of ", payload.size(), " bytes exceeds ", kMaxNoticeBytes));
  }
  std::string instance;
  {
    absl::MutexLock lock(&mutex_);
    auto p = peers_.find(remote_region);
    if (p == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", remote_region));
    }
    instance = p->second.instance;
  }
  const OperationId op = operations_.Add();
  absl::MutexLock registry_lock(&registry_mutex);
  auto target = registry->find(instance);
  if (target == registry->end()) {
    operations_.Complete(op, absl::UnavailableError(absl::StrCat(
                                 "in-process peer ", instance, " is gone")));
    return op;
  }
  // Writes complete synchronously, so every earlier write is already there.
  target->second->mailbox_.Deliver(key, payload);
  operations_.Complete(op, absl::OkStatus());
  return op;
}

}  // namespace pdserve::kv_transfer
