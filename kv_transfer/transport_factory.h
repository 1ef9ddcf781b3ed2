// Choosing a KvTransport by configuration.
//
//   KvTransportConfig config;
//   config.kind = v1::TRANSPORT_KIND_UCX;        // or from ParseTransportKind
//   PD_ASSIGN_OR_RETURN(auto transport, CreateKvTransport(config));
//
// UCX and in-process are always available. Backends that need more (NCCL:
// CUDA libraries) register themselves when their library is linked into the
// binary (see nccl_backend_registration.cc), so CPU-only binaries never link
// or load CUDA, and asking them for NCCL is a clear FAILED_PRECONDITION
// rather than a silent fallback to another transport.
//
// Thread-safety: all functions are thread-safe.
#ifndef PDSERVE_KV_TRANSFER_TRANSPORT_FACTORY_H_
#define PDSERVE_KV_TRANSFER_TRANSPORT_FACTORY_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kv_transfer/fault_injecting_transport.h"
#include "kv_transfer/transport.h"

namespace pdserve::kv_transfer {

struct KvTransportConfig {
  v1::TransportKind kind = v1::TRANSPORT_KIND_UCX;
  // Names the transport in logs.
  std::string name = "kv";
  // NCCL: the CUDA device whose memory the transport moves.
  int cuda_device = 0;
  // Tests: wrap the backend in a FaultInjectingTransport with these faults.
  std::optional<TransportFaults> faults;
};

absl::StatusOr<std::unique_ptr<KvTransport>> CreateKvTransport(
    const KvTransportConfig& config);

// "ucx", "nccl", "in_process" (case-insensitive) -> the kind;
// INVALID_ARGUMENT listing the accepted names otherwise.
absl::StatusOr<v1::TransportKind> ParseTransportKind(absl::string_view name);

// Test faults from a comma-separated list: drop_writes, drop_notices,
// corrupt_writes, delay_ms=N, fail_after_bytes=N (see TransportFaults).
// INVALID_ARGUMENT naming the bad item.
absl::StatusOr<TransportFaults> ParseTransportFaults(absl::string_view spec);

// For backend libraries: makes `kind` available to CreateKvTransport.
using KvTransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<KvTransport>>(
        const KvTransportConfig&)>;
bool RegisterKvTransportBackend(v1::TransportKind kind,
                                KvTransportFactory factory);

}  // namespace pdserve::kv_transfer

#endif  // PDSERVE_KV_TRANSFER_TRANSPORT_FACTORY_H_
