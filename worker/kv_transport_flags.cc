#include "worker/kv_transport_flags.h"

#include "absl/flags/flag.h"
#include "common/log.h"

ABSL_FLAG(std::string, transport, "ucx",
          "KV transport: ucx, in_process (tests) or nccl (GPU builds)");
ABSL_FLAG(std::string, testing_kv_faults, "",
          "FOR TESTS: inject faults into every KV transfer this worker "
          "makes (comma-separated: drop_writes, drop_notices, "
          "corrupt_writes, delay_ms=N, fail_after_bytes=N)");

namespace pdserve::worker {

absl::StatusOr<kv_transfer::KvTransportConfig> KvTransportFromFlags(
    const std::string& worker_id) {
  kv_transfer::KvTransportConfig config;
  absl::StatusOr<v1::TransportKind> kind =
      kv_transfer::ParseTransportKind(absl::GetFlag(FLAGS_transport));
  if (!kind.ok()) return kind.status();
  config.kind = *kind;
  config.name = worker_id;
  if (const std::string faults = absl::GetFlag(FLAGS_testing_kv_faults);
      !faults.empty()) {
    absl::StatusOr<kv_transfer::TransportFaults> parsed =
        kv_transfer::ParseTransportFaults(faults);
    if (!parsed.ok()) return parsed.status();
    PD_LOG(WARNING) << "injecting KV transfer faults: " << faults;
    config.faults = *parsed;
  }
  return config;
}

}  // namespace pdserve::worker
