// NcclTransport's public methods: creation and shutdown, regions, exports and
// imports, and posting operations to a peer's queue. The threads that run the
// communicators are in nccl_export_receiver.cc (receiver side) and
// nccl_peer_writer.cc (writer side); the wire format is nccl_wire.h.
#include "kv_transfer/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kv_transfer/extents.h"
#include "kv_transfer/nccl_comm.h"
#include "kv_transfer/nccl_export_receiver.h"
#include "kv_transfer/nccl_peer_writer.h"
#include "kv_transfer/nccl_transport_state.h"
#include "kv_transfer/nccl_wire.h"

namespace pdserve::kv_transfer {

using nccl_internal::CudaError;
using nccl_internal::MessageKind;
using nccl_internal::NcclError;
using nccl_internal::ScopedDevice;

// ---------------------------------------------------------------------------
// Creation and destruction.

NcclTransport::NcclTransport(const NcclTransportOptions& options)
    : options_(options), staging_(std::make_unique<Staging>()) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    const NcclTransportOptions& options) {
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", options.device, " is negative"));
  }
  if (options.staging_slots <= kMaxSlotsPerPeer) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_slots must exceed ", kMaxSlotsPerPeer));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("connect_timeout must be positive");
  }
  auto transport = std::unique_ptr<NcclTransport>(new NcclTransport(options));
  PD_RETURN_IF_ERROR(transport->Start());
  return transport;
}

absl::Status NcclTransport::Start() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL transport needs a GPU: CUDA error ", cudaGetErrorName(status),
        ": ", cudaGetErrorString(status)));
  }
  if (count <= options_.device) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL transport needs CUDA device ", options_.device,
                     " but CUDA reports ", count, " device(s)"));
  }
  ScopedDevice scoped(options_.device);
  if (scoped.status() != cudaSuccess) {
    return CudaError(absl::StrCat("cudaSetDevice(", options_.device, ")"),
                     scoped.status());
  }
  PD_RETURN_IF_ERROR(
      staging_->Allocate(options_.device, options_.staging_slots));
  int version = 0;
  ncclGetVersion(&version);
  PD_LOG(INFO) << options_.name << ": NCCL transport on CUDA device "
               << options_.device << " (NCCL " << version << ")";
  return absl::OkStatus();
}

NcclTransport::~NcclTransport() {
  std::vector<std::shared_ptr<Peer>> peers;
  std::vector<std::unique_ptr<Export>> exports;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& [id, peer] : peers_) peers.push_back(std::move(peer));
    for (auto& [id, exported] : exports_)
      exports.push_back(std::move(exported));
    peers_.clear();
    exports_.clear();
    imported_ids_.clear();
  }
  // Signal every thread first, then join: teardowns run in parallel.
  for (auto& peer : peers) {
    absl::MutexLock lock(&peer->mutex);
    peer->stop.store(true);
  }
  for (auto& exported : exports) exported->stop.store(true);
  for (auto& peer : peers) {
    if (peer->thread.joinable()) peer->thread.join();
  }
  for (auto& exported : exports) {
    if (exported->thread.joinable()) exported->thread.join();
  }
  staging_.reset();  // Every stream using it has drained (or leaked it).
}

// ---------------------------------------------------------------------------
// Receiver side.

void NcclTransport::ReapExports() {
  for (auto it = exports_.begin(); it != exports_.end();) {
    if (it->second->finished.load()) {
      it->second->thread.join();
      exports_.erase(it++);
    } else {
      ++it;
    }
  }
}

void NcclTransport::StopExport(Export* exported) {
  exported->stop.store(true);
  if (exported->thread.joinable()) exported->thread.join();
}

absl::StatusOr<v1::MemoryRegionDescriptor> NcclTransport::ExportRegion(
    RegionId region) {
  uint8_t* base = nullptr;
  uint64_t length = 0;
  {
    absl::MutexLock lock(&mutex_);
    ReapExports();
    auto it = regions_.find(region);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("no region ", region));
    }
    base = it->second->base;
    length = it->second->length;
  }
  const int slot = staging_->Take(/*for_export=*/true);
  if (slot < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.name, ": no staging slot left for another export (",
        options_.staging_slots, " slots; raise staging_slots)"));
  }
  ncclUniqueId unique_id;
  if (ncclResult_t r = ncclGetUniqueId(&unique_id); r != ncclSuccess) {
    staging_->Give(slot);
    return NcclError("ncclGetUniqueId", r, nullptr);
  }
  auto exported = std::make_unique<Export>();
  exported->region = region;
  exported->base = base;
  exported->length = length;
  exported->unique_id.assign(unique_id.internal, sizeof(unique_id.internal));
  exported->slot = slot;

  absl::MutexLock lock(&mutex_);
  if (!regions_.contains(region)) {  // Deregistered meanwhile.
    staging_->Give(slot);
    return absl::NotFoundError(absl::StrCat("no region ", region));
  }
  exported->id = next_id_++;
  Export* raw = exported.get();
  v1::MemoryRegionDescriptor descriptor;
  descriptor.set_transport(v1::TRANSPORT_KIND_NCCL);
  descriptor.set_region_id(
      absl::StrCat(options_.name, "/", ::getpid(), "#", region, "/", raw->id));
  descriptor.set_peer_address(raw->unique_id);
  descriptor.set_base_address(reinterpret_cast<uint64_t>(base));
  descriptor.set_length_bytes(length);
  descriptor.set_memory_kind(v1::MEMORY_KIND_CUDA);
  descriptor.set_device_id(options_.device);
  exports_[raw->id] = std::move(exported);
  raw->thread = std::thread([this, raw] { ExportReceiver(this, raw).Run(); });
  return descriptor;
}

// ---------------------------------------------------------------------------
// Writer side.

void NcclTransport::ReleaseRegionUse(RegionId region) {
  absl::MutexLock lock(&mutex_);
  auto it = regions_.find(region);
  if (it != regions_.end()) --it->second->inflight;
}

void NcclTransport::StopPeer(Peer* peer) {
  {
    absl::MutexLock lock(&peer->mutex);
    peer->stop.store(true);
  }
  if (peer->thread.joinable()) peer->thread.join();
}

absl::StatusOr<PeerRegionId> NcclTransport::ImportPeerRegion(
    const v1::MemoryRegionDescriptor& descriptor) {
  if (descriptor.transport() != v1::TRANSPORT_KIND_NCCL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "descriptor is for transport ",
        v1::TransportKind_Name(descriptor.transport()), ", not NCCL"));
  }
  if (descriptor.peer_address().size() != NCCL_UNIQUE_ID_BYTES ||
      descriptor.length_bytes() == 0 ||
      descriptor.memory_kind() != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL descriptor ", descriptor.region_id(), " needs a ",
        NCCL_UNIQUE_ID_BYTES, "-byte unique id (has ",
        descriptor.peer_address().size(), " bytes), a length and CUDA memory"));
  }
  auto peer = std::make_shared<Peer>();
  peer->unique_id = descriptor.peer_address();
  peer->label = descriptor.region_id();
  peer->remote_length = descriptor.length_bytes();
  {
    absl::MutexLock lock(&mutex_);
    if (!imported_ids_.insert(peer->unique_id).second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NCCL descriptor ", descriptor.region_id(),
          " is already imported: each writer needs its own ExportRegion"));
    }
    peer->id = next_id_++;
  }
  peer->thread =
      std::thread([this, raw = peer.get()] { PeerWriter(this, raw).Run(); });
  peer->connected.WaitForNotification();
  if (!peer->connect_status.ok()) {
    StopPeer(peer.get());
    absl::MutexLock lock(&mutex_);
    imported_ids_.erase(peer->unique_id);
    return peer->connect_status;
  }
  PD_LOG(INFO) << options_.name << ": connected to " << peer->label
               << " as peer region " << peer->id;
  absl::MutexLock lock(&mutex_);
  const PeerRegionId id = peer->id;
  peers_[id] = std::move(peer);
  return id;
}

absl::Status NcclTransport::ReleasePeerRegion(PeerRegionId id) {
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mutex_);
    auto it = peers_.find(id);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("no peer region ", id));
    }
    peer = std::move(it->second);
    peers_.erase(it);
  }
  StopPeer(peer.get());
  absl::MutexLock lock(&mutex_);
  imported_ids_.erase(peer->unique_id);
  return absl::OkStatus();
}

absl::StatusOr<OperationId> NcclTransport::Enqueue(
    const std::shared_ptr<Peer>& peer, std::unique_ptr<WriterOp> op,
    absl::Time deadline) {
  const bool is_write = op->kind == MessageKind::kWrite;
  const RegionId local_region = op->local_region;
  absl::Status failure;
  OperationId id = 0;
  {
    absl::MutexLock lock(&peer->mutex);
    id = operations_.Add();
    op->id = id;
    op->deadline = deadline;
    failure = peer->failure;
    if (failure.ok()) peer->queue.push_back(std::move(op));
  }
  if (!failure.ok()) {
    // The communicator is gone: reported through Poll/Wait like any failure.
    operations_.Complete(id, failure);
    if (is_write) ReleaseRegionUse(local_region);
  }
  return id;
}

absl::StatusOr<OperationId> NcclTransport::PostWrite(
    const WriteRequest& request) {
  auto op = std::make_unique<WriterOp>();
  op->kind = MessageKind::kWrite;
  op->local_region = request.local_region;
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mutex_);
    auto local = regions_.find(request.local_region);
    if (local == regions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no local region ", request.local_region));
    }
    auto remote = peers_.find(request.remote_region);
    if (remote == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", request.remote_region));
    }
    PD_RETURN_IF_ERROR(ValidateExtents(request.extents, local->second->length,
                                       remote->second->remote_length));
    if (request.extents.empty()) {
      // Nothing to move: done at once.
      const OperationId id = operations_.Add();
      operations_.Complete(id, absl::OkStatus());
      return id;
    }
    peer = remote->second;
    op->local_base = local->second->base;
    ++local->second->inflight;  // Until the operation is over.
  }
  op->extents = CoalesceExtents(request.extents);
  return Enqueue(peer, std::move(op), request.deadline);
}

absl::StatusOr<OperationId> NcclTransport::PostNotice(
    PeerRegionId remote_region, const std::string& key,
    const std::string& payload, absl::Time deadline) {
  if (payload.size() > kMaxNoticeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notice of ", payload.size(), " bytes exceeds ", kMaxNoticeBytes));
  }
  if (key.empty()) return absl::InvalidArgumentError("notice key is empty");
  if (key.size() > kMaxNoticeKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notice key of ", key.size(), " bytes exceeds ", kMaxNoticeKeyBytes));
  }
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mutex_);
    auto it = peers_.find(remote_region);
    if (it == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer region ", remote_region));
    }
    peer = it->second;
  }
  auto op = std::make_unique<WriterOp>();
  op->kind = MessageKind::kNotice;
  op->key = key;
  op->payload = payload;
  return Enqueue(peer, std::move(op), deadline);
}

// ---------------------------------------------------------------------------
// Regions.

absl::StatusOr<RegionId> NcclTransport::RegisterRegion(
    void* base, uint64_t length, v1::MemoryKind memory_kind, int device_id) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("cannot register an empty region");
  }
  if (memory_kind != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the NCCL transport moves CUDA device memory only, not ",
        v1::MemoryKind_Name(memory_kind),
        " memory (use the UCX or in-process transport for host memory)"));
  }
  if (device_id != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region is on CUDA device ", device_id,
        " but this NCCL transport serves device ", options_.device));
  }
  // Both ends must be device memory of our device.
  for (const uint8_t* address :
       {static_cast<const uint8_t*>(base),
        static_cast<const uint8_t*>(base) + (length - 1)}) {
    cudaPointerAttributes attributes = {};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, address);
    if (status != cudaSuccess) {
      cudaGetLastError();  // Not sticky; clear it.
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot inspect the region's memory: CUDA error ",
          cudaGetErrorName(status), ": ", cudaGetErrorString(status)));
    }
    if (attributes.type != cudaMemoryTypeDevice ||
        attributes.device != options_.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region [", reinterpret_cast<uintptr_t>(base), ", +", length,
          ") is not device memory of CUDA device ", options_.device,
          " (memory type ", static_cast<int>(attributes.type), ", device ",
          attributes.device, ")"));
    }
  }
  auto region = std::make_unique<Region>();
  region->base = static_cast<uint8_t*>(base);
  region->length = length;
  absl::MutexLock lock(&mutex_);
  const RegionId id = next_id_++;
  regions_[id] = std::move(region);
  return id;
}

absl::Status NcclTransport::DeregisterRegion(RegionId region) {
  std::vector<std::unique_ptr<Export>> ending;
  {
    absl::MutexLock lock(&mutex_);
    auto it = regions_.find(region);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("no region ", region));
    }
    if (it->second->inflight > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("region ", region, " has ", it->second->inflight,
                       " writes in flight"));
    }
    regions_.erase(it);
    for (auto e = exports_.begin(); e != exports_.end();) {
      if (e->second->region == region) {
        ending.push_back(std::move(e->second));
        exports_.erase(e++);
      } else {
        ++e;
      }
    }
  }
  // The caller may free the memory once this returns: end its exports (and
  // their receives into it) first.
  for (auto& exported : ending) exported->stop.store(true);
  for (auto& exported : ending) StopExport(exported.get());
  return absl::OkStatus();
}

}  // namespace pdserve::kv_transfer
