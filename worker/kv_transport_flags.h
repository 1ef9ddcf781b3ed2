// The KV transport a worker uses, chosen on its command line:
// --transport (ucx, in_process, nccl) and, for fault tests,
// --testing_kv_faults. Only worker processes link these flags.
#ifndef PDSERVE_WORKER_KV_TRANSPORT_FLAGS_H_
#define PDSERVE_WORKER_KV_TRANSPORT_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "kv_transfer/transport_factory.h"

namespace pdserve::worker {

// The KV transport chosen by --transport (ucx, in_process, nccl), named
// after the worker in logs. INVALID_ARGUMENT for an unknown name.
absl::StatusOr<kv_transfer::KvTransportConfig> KvTransportFromFlags(
    const std::string& worker_id);

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_KV_TRANSPORT_FLAGS_H_
