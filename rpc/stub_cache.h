// One gRPC stub per address, created on first use and kept: every caller of
// a worker service (the router's request drivers, a prefill worker
// completing transfers) reuses the channel to each peer instead of
// connecting per call. The worker services are the control plane: every
// call presents the cluster's credential (rpc/control_plane_auth.h).
//
// Thread-safety: Get is thread-safe; stubs are thread-safe themselves.
#ifndef PDSERVE_RPC_STUB_CACHE_H_
#define PDSERVE_RPC_STUB_CACHE_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "rpc/cluster_credential.h"
#include "rpc/control_plane_auth.h"

namespace pdserve::rpc {

// `Service` is a generated gRPC service class (v1::DecodeWorker, ...).
template <typename Service>
class StubCache {
 public:
  // Auth off by default (tests, local development).
  explicit StubCache(ClusterCredential credential = ClusterCredential())
      : credential_(std::move(credential)) {}

  // The stub for `address`; valid for the cache's life.
  typename Service::Stub* Get(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<typename Service::Stub>& stub = stubs_[address];
    if (stub == nullptr) {
      stub = Service::NewStub(NewControlPlaneChannel(address, credential_));
    }
    return stub.get();
  }

 private:
  const ClusterCredential credential_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<typename Service::Stub>>
      stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_STUB_CACHE_H_
