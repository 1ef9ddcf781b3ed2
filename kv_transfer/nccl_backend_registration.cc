// Makes TRANSPORT_KIND_NCCL available to CreateKvTransport in binaries that
// link //kv_transfer:nccl_backend (which brings CUDA and NCCL with it).
#include <memory>
#include <utility>

#include "common/status_macros.h"
#include "kv_transfer/nccl_transport.h"
#include "kv_transfer/transport_factory.h"

namespace pdserve::kv_transfer {
namespace {

absl::StatusOr<std::unique_ptr<KvTransport>> CreateNccl(
    const KvTransportConfig& config) {
  NcclTransportOptions options;
  options.device = config.cuda_device;
  options.name = config.name;
  PD_ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> transport,
                      NcclTransport::Create(options));
  return std::unique_ptr<KvTransport>(std::move(transport));
}

const bool registered =
    RegisterKvTransportBackend(v1::TRANSPORT_KIND_NCCL, &CreateNccl);

}  // namespace
}  // namespace pdserve::kv_transfer
