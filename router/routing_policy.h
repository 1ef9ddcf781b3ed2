// RoutingPolicy: which prefill worker computes a prompt and which decode
// worker generates from it.
//
// The policy scores candidates from what the router knows: each worker's
// heartbeat load (free KV blocks, running sequences), the router's own count
// of work it has sent and not yet seen finish (fresher than heartbeats), and,
// for KV-aware routing, how many leading blocks of the prompt each worker
// holds in its prefix cache (the index built from the workers' events).
//
//   ROUND_ROBIN   prefill and decode each in turn;
//   LEAST_LOADED  prefill: fewest outstanding prompt tokens;
//                 decode: fewest running + outstanding sequences, then most
//                 free blocks;
//   KV_AWARE      prefill: lowest  overlap_weight * uncached prompt tokens
//                 + outstanding prompt tokens (Dynamo's cost: work left after
//                 the cached prefix, plus the queue); decode as LEAST_LOADED,
//                 preferring free blocks.
// Conditional disaggregation (any policy): when the decode worker chosen
// would itself have at most local_prefill_max_uncached_tokens of the prompt
// left to compute after its own prefix cache, it prefills locally and no KV
// moves. Colocated (BOTH) workers always prefill locally, and so does every
// request when no prefill worker is serving.
//
// Thread-safety: all methods are thread-safe.
#ifndef PDSERVE_ROUTER_ROUTING_POLICY_H_
#define PDSERVE_ROUTER_ROUTING_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/admin.pb.h"
#include "proto/common.pb.h"

namespace pdserve::router {

// One serving candidate, as the policy sees it.
struct WorkerView {
  std::string worker_id;
  std::string address;
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  v1::WorkerLoad load;
  // Sent by this router and not finished: prompt tokens (prefill) and
  // sequences (decode).
  int64_t outstanding_tokens = 0;
  int32_t outstanding_sequences = 0;
  // Leading blocks of this prompt in the worker's prefix cache.
  int32_t cached_blocks = 0;
  // From its registration.
  int32_t block_size = 16;
  v1::KvLayout kv_layout;
  std::vector<v1::TransportKind> transports;
};

struct Route {
  // Index into the prefill candidates; unset: prefill on the decode worker.
  std::optional<size_t> prefill;
  // Index into the decode candidates, best first (the caller tries the next
  // when one refuses the admission).
  std::vector<size_t> decode_order;
};

// INVALID_ARGUMENT for UNSPECIFIED policies or a negative weight.
absl::Status ValidateRoutingConfig(const v1::RoutingConfig& config);

class RoutingPolicy {
 public:
  explicit RoutingPolicy(const v1::RoutingConfig& config) : config_(config) {}

  v1::RoutingConfig config() const ABSL_LOCKS_EXCLUDED(mu_);
  // Returns the previous config. Validates first.
  absl::StatusOr<v1::RoutingConfig> SetConfig(const v1::RoutingConfig& config)
      ABSL_LOCKS_EXCLUDED(mu_);

  // `decode` must not be empty. prompt_tokens and block_size size the
  // uncached work from cached_blocks.
  Route Choose(const std::vector<WorkerView>& prefill,
               const std::vector<WorkerView>& decode, int32_t prompt_tokens,
               int32_t block_size) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  v1::RoutingConfig config_ ABSL_GUARDED_BY(mu_);
  uint64_t next_prefill_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_decode_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_ROUTING_POLICY_H_
