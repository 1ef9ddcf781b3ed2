// UcxTransport's public methods. Each one that touches UCX is a command run
// on the progress thread (ucx_worker.cc); PostWrite and PostNotice validate
// on the caller's thread and return at once, the send path
// (ucx_send_path.cc) carrying them out.
#include "kv_transfer/ucx_transport.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"
#include "kv_transfer/ucx_transport_state.h"

namespace pdserve::kv_transfer {

using ucx_internal::UcxError;

absl::StatusOr<RegionId> UcxTransport::RegisterRegion(
    void* base, uint64_t length, v1::MemoryKind memory_kind, int device_id) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("cannot register an empty region");
  }
  if (memory_kind != v1::MEMORY_KIND_HOST &&
      memory_kind != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError("unknown memory kind");
  }
  PD_ASSIGN_OR_RETURN(const AllocatedRegion region,
                      MapRegion(base, length, memory_kind, device_id));
  return region.id;
}

absl::StatusOr<AllocatedRegion> UcxTransport::AllocateRegion(uint64_t length) {
  if (length == 0) {
    return absl::InvalidArgumentError("cannot allocate an empty region");
  }
  return MapRegion(nullptr, length, v1::MEMORY_KIND_HOST, 0);
}

absl::StatusOr<AllocatedRegion> UcxTransport::MapRegion(
    void* base, uint64_t length, v1::MemoryKind memory_kind, int device_id) {
  ucp_mem_map_params_t params = {};
  params.field_mask =
      UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = length;
  if (base == nullptr) {
    // UCX allocates with the first method of UCX_ALLOC_PRIO that works:
    // System V or POSIX shared memory by default, which peers on this host
    // can map; plain memory (reached only through the endpoint) after that.
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.flags = UCP_MEM_MAP_ALLOCATE;
  } else {
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.memory_type = memory_kind == v1::MEMORY_KIND_CUDA
                             ? UCS_MEMORY_TYPE_CUDA
                             : UCS_MEMORY_TYPE_HOST;
  }
  absl::StatusOr<AllocatedRegion> result;
  RunAndWait([&](State& s) {
    auto region = std::make_unique<State::LocalRegion>();
    ucs_status_t status = ucp_mem_map(s.context, &params, &region->memh);
    if (status != UCS_OK) {
      result = UcxError("ucp_mem_map", status);
      return;
    }
    ucp_mem_attr_t attr = {};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    status = ucp_mem_query(region->memh, &attr);
    void* rkey = nullptr;
    size_t rkey_size = 0;
    if (status == UCS_OK) {
      status = ucp_rkey_pack(s.context, region->memh, &rkey, &rkey_size);
    }
    if (status != UCS_OK) {
      ucp_mem_unmap(s.context, region->memh);
      result = UcxError("packing the region's remote key", status);
      return;
    }
    region->packed_rkey.assign(static_cast<const char*>(rkey), rkey_size);
    ucp_rkey_buffer_release(rkey);
    // Allocated memory: its address is UCX's choice (page-aligned by every
    // allocation method but the heap's, which is refused: pool bases must
    // be page-aligned).
    region->base = static_cast<uint8_t*>(base != nullptr ? base : attr.address);
    if (base == nullptr &&
        reinterpret_cast<uintptr_t>(region->base) % ::getpagesize() != 0) {
      ucp_mem_unmap(s.context, region->memh);
      result = absl::ResourceExhaustedError(
          "UCX allocated a region that is not page-aligned");
      return;
    }
    region->length = length;
    region->memory_kind = memory_kind;
    region->device_id = device_id;
    const RegionId id = s.next_id++;
    AllocatedRegion allocated{.id = id, .base = region->base};
    s.regions[id] = std::move(region);
    absl::MutexLock lock(&bounds_mutex_);
    local_bounds_[id] = {.length = length,
                         .host_base = memory_kind == v1::MEMORY_KIND_HOST
                                          ? allocated.base
                                          : nullptr};
    result = allocated;
  });
  return result;
}

absl::Status UcxTransport::DeregisterRegion(RegionId region) {
  absl::Status result;
  RunAndWait([&](State& s) {
    auto it = s.regions.find(region);
    if (it == s.regions.end()) {
      result = absl::NotFoundError(absl::StrCat("no region ", region));
    } else if (it->second->inflight > 0) {
      result = absl::FailedPreconditionError(
          absl::StrCat("region ", region, " has ", it->second->inflight,
                       " writes in flight"));
    } else {
      {
        // First, so no direct store reads it any more (waits for those
        // running): unmapping frees an allocated region's memory.
        absl::MutexLock lock(&bounds_mutex_);
        local_bounds_.erase(region);
      }
      ucp_mem_unmap(s.context, it->second->memh);
      s.regions.erase(it);
    }
  });
  return result;
}

absl::StatusOr<v1::MemoryRegionDescriptor> UcxTransport::ExportRegion(
    RegionId region) {
  absl::StatusOr<v1::MemoryRegionDescriptor> result;
  RunAndWait([&](State& s) {
    auto it = s.regions.find(region);
    if (it == s.regions.end()) {
      result = absl::NotFoundError(absl::StrCat("no region ", region));
      return;
    }
    v1::MemoryRegionDescriptor descriptor;
    descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
    descriptor.set_region_id(
        absl::StrCat(options_.name, "/", ::getpid(), "#", region));
    descriptor.set_peer_address(s.worker_address);
    descriptor.set_remote_key(it->second->packed_rkey);
    descriptor.set_base_address(reinterpret_cast<uint64_t>(it->second->base));
    descriptor.set_length_bytes(it->second->length);
    descriptor.set_memory_kind(it->second->memory_kind);
    descriptor.set_device_id(it->second->device_id);
    if (it->second->memory_kind == v1::MEMORY_KIND_HOST) {
      descriptor.set_shared_memory_domain(s.shared_memory_domain);
    }
    result = std::move(descriptor);
  });
  return result;
}

absl::StatusOr<PeerRegionId> UcxTransport::ImportPeerRegion(
    const v1::MemoryRegionDescriptor& descriptor) {
  if (descriptor.transport() != v1::TRANSPORT_KIND_UCX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "descriptor is for transport ",
        v1::TransportKind_Name(descriptor.transport()), ", not UCX"));
  }
  if (descriptor.peer_address().empty() || descriptor.remote_key().empty() ||
      descriptor.length_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX descriptor ", descriptor.region_id(),
                     " lacks a worker address, remote key or length"));
  }
  absl::StatusOr<PeerRegionId> result;
  RunAndWait([&](State& s) {
    auto peer = std::make_unique<State::PeerRegion>();
    peer->address = descriptor.peer_address();
    peer->packed_rkey = descriptor.remote_key();
    peer->base = descriptor.base_address();
    peer->length = descriptor.length_bytes();
    peer->memory_kind = descriptor.memory_kind();
    peer->shared_memory_domain = descriptor.shared_memory_domain();
    peer->id = s.next_id++;
    // Connect now, so an unreachable peer is reported here.
    absl::StatusOr<State::Connection*> connection =
        s.GetConnection(peer->address);
    if (!connection.ok()) {
      result = connection.status();
      return;
    }
    if (absl::StatusOr<ucp_rkey_h> rkey = s.RkeyFor(peer.get(), *connection);
        !rkey.ok()) {
      result = rkey.status();
      return;
    }
    const PeerRegionId id = peer->id;
    {
      absl::MutexLock lock(&bounds_mutex_);
      peer_bounds_[id] = {.length = peer->length, .direct = peer->direct};
    }
    PD_LOG(INFO) << options_.name << ": peer region " << descriptor.region_id()
                 << (peer->direct != nullptr
                         ? " is shared memory: writes store into it directly"
                         : " is written through the endpoint's lanes");
    s.peers[id] = std::move(peer);
    result = id;
  });
  return result;
}

absl::Status UcxTransport::ReleasePeerRegion(PeerRegionId peer) {
  absl::Status result;
  RunAndWait([&](State& s) {
    auto it = s.peers.find(peer);
    if (it == s.peers.end() || it->second->released) {
      result = absl::NotFoundError(absl::StrCat("no peer region ", peer));
      return;
    }
    {
      // No new writes to it; waits for direct stores in progress.
      absl::MutexLock lock(&bounds_mutex_);
      peer_bounds_.erase(peer);
    }
    if (it->second->inflight > 0) {
      it->second->released = true;  // Freed when its last write ends.
    } else {
      s.DropRkey(it->second.get(), /*after_close=*/false);
      s.peers.erase(it);
    }
  });
  return result;
}

absl::StatusOr<OperationId> UcxTransport::PostWrite(
    const WriteRequest& request) {
  // Validated here, on the caller's thread; the progress thread rechecks
  // that both regions still exist when it starts the write.
  {
    absl::ReaderMutexLock lock(&bounds_mutex_);
    auto local = local_bounds_.find(request.local_region);
    auto peer = peer_bounds_.find(request.remote_region);
    if (local == local_bounds_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no local region ", request.local_region));
    }
    if (peer == peer_bounds_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", request.remote_region));
    }
    PD_RETURN_IF_ERROR(ValidateExtents(request.extents, local->second.length,
                                       peer->second.length));
    if (peer->second.direct != nullptr && local->second.host_base != nullptr) {
      // The peer's memory is mapped here: the copy is the whole transfer,
      // done on this thread with no hand-off (the reader lock keeps the
      // mapping; see bounds_mutex_).
      const OperationId id = operations_.Add();
      operations_.Complete(
          id, CopyExtents(peer->second.direct, local->second.host_base,
                          CoalesceExtents(request.extents), request.deadline));
      return id;
    }
  }
  const OperationId id = operations_.Add();
  Enqueue([this, id, request](State& s) { s.StartWrite(id, request); });
  return id;
}

absl::StatusOr<OperationId> UcxTransport::PostNotice(PeerRegionId remote_region,
                                                     const std::string& key,
                                                     const std::string& payload,
                                                     absl::Time deadline) {
  if (payload.size() > kMaxNoticeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notice of ", payload.size(), " bytes exceeds ", kMaxNoticeBytes));
  }
  if (key.empty()) return absl::InvalidArgumentError("notice key is empty");
  const OperationId id = operations_.Add();
  Enqueue([=](State& s) {
    s.StartNotice(id, remote_region, key, payload, deadline);
  });
  return id;
}

absl::StatusOr<std::string> UcxTransport::DescribeConnection(
    PeerRegionId peer) {
  absl::StatusOr<std::string> result;
  RunAndWait([&](State& s) {
    auto it = s.peers.find(peer);
    if (it == s.peers.end() || it->second->released) {
      result = absl::NotFoundError(absl::StrCat("no peer region ", peer));
      return;
    }
    absl::StatusOr<State::Connection*> connection =
        s.GetConnection(it->second->address);
    if (!connection.ok()) {
      result = connection.status();
    } else if (absl::StatusOr<ucp_rkey_h> rkey =
                   s.RkeyFor(it->second.get(), *connection);
               !rkey.ok()) {
      result = rkey.status();
    } else {
      result = absl::StrCat((*connection)->lanes,
                            it->second->direct != nullptr
                                ? "; writes: direct stores into the "
                                  "peer's shared memory"
                                : "; writes: puts through the lanes");
    }
  });
  return result;
}

UcxTransport::ResourceCounts UcxTransport::resource_counts() {
  ResourceCounts counts;
  RunAndWait([&](State& s) {
    counts.regions = s.regions.size();
    for (const auto& [id, peer] : s.peers) {
      counts.peer_regions += !peer->released;
    }
    for (const auto& [address, connection] : s.connections) {
      counts.connections += connection->ep != nullptr;
    }
    counts.pending_operations = s.ops.size();
  });
  return counts;
}

}  // namespace pdserve::kv_transfer
