// One gRPC stub per address, created on first use and kept: every caller of
// a worker service (the router's request drivers, a prefill worker
// completing transfers) reuses the channel to each peer instead of
// connecting per call.
//
// Thread-safety: Get is thread-safe; stubs are thread-safe themselves.
#ifndef PDSERVE_RPC_STUB_CACHE_H_
#define PDSERVE_RPC_STUB_CACHE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace pdserve::rpc {

// `Service` is a generated gRPC service class (v1::DecodeWorker, ...).
template <typename Service>
class StubCache {
 public:
  // The stub for `address`; valid for the cache's life.
  typename Service::Stub* Get(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<typename Service::Stub>& stub = stubs_[address];
    if (stub == nullptr) {
      stub = Service::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    }
    return stub.get();
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<typename Service::Stub>>
      stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_STUB_CACHE_H_
