#include "kv_transfer/transport_factory.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kv_transfer/in_process_transport.h"
#include "kv_transfer/ucx_transport.h"

namespace pdserve::kv_transfer {
namespace {

absl::Mutex registry_mutex(absl::kConstInit);

absl::flat_hash_map<int, KvTransportFactory>& Registry()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mutex) {
  static auto* registry = new absl::flat_hash_map<int, KvTransportFactory>();
  return *registry;
}

}  // namespace

bool RegisterKvTransportBackend(v1::TransportKind kind,
                                KvTransportFactory factory) {
  absl::MutexLock lock(&registry_mutex);
  Registry()[kind] = std::move(factory);
  return true;
}

absl::StatusOr<std::unique_ptr<KvTransport>> CreateKvTransport(
    const KvTransportConfig& config) {
  std::unique_ptr<KvTransport> transport;
  switch (config.kind) {
    case v1::TRANSPORT_KIND_UCX: {
      PD_ASSIGN_OR_RETURN(transport,
                          UcxTransport::Create({.name = config.name}));
      break;
    }
    case v1::TRANSPORT_KIND_IN_PROCESS: {
      PD_ASSIGN_OR_RETURN(transport, InProcessTransport::Create());
      break;
    }
    default: {
      KvTransportFactory factory;
      {
        absl::MutexLock lock(&registry_mutex);
        auto it = Registry().find(config.kind);
        if (it != Registry().end()) factory = it->second;
      }
      if (!factory) {
        return absl::FailedPreconditionError(absl::StrCat(
            "KV transport ", v1::TransportKind_Name(config.kind),
            " is not built into this binary (NCCL needs the CUDA build: link "
            "//kv_transfer:nccl_backend)"));
      }
      PD_ASSIGN_OR_RETURN(transport, factory(config));
    }
  }
  if (config.faults.has_value()) {
    auto faulty =
        std::make_unique<FaultInjectingTransport>(std::move(transport));
    faulty->set_faults(*config.faults);
    transport = std::move(faulty);
  }
  return transport;
}

absl::StatusOr<v1::TransportKind> ParseTransportKind(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "ucx") return v1::TRANSPORT_KIND_UCX;
  if (lower == "nccl") return v1::TRANSPORT_KIND_NCCL;
  if (lower == "in_process" || lower == "in-process") {
    return v1::TRANSPORT_KIND_IN_PROCESS;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown KV transport '", name, "' (use ucx, nccl or in_process)"));
}

absl::StatusOr<TransportFaults> ParseTransportFaults(absl::string_view spec) {
  TransportFaults faults;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string& name = kv.first;
    uint64_t number = 0;
    const bool has_number = absl::SimpleAtoi(kv.second, &number);
    if (name == "drop_writes" && kv.second.empty()) {
      faults.drop_writes = true;
    } else if (name == "drop_notices" && kv.second.empty()) {
      faults.drop_notices = true;
    } else if (name == "corrupt_writes" && kv.second.empty()) {
      faults.corrupt_writes = true;
    } else if (name == "delay_ms" && has_number) {
      faults.delay = absl::Milliseconds(number);
    } else if (name == "fail_after_bytes" && has_number) {
      faults.fail_after_bytes = number;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad KV transport fault '", item,
          "' (use drop_writes, drop_notices, corrupt_writes, delay_ms=N, "
          "fail_after_bytes=N)"));
    }
  }
  return faults;
}

}  // namespace pdserve::kv_transfer
