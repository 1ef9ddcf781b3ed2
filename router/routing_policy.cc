#include "router/routing_policy.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace pdserve::router {

absl::Status ValidateRoutingConfig(const v1::RoutingConfig& config) {
  if (config.policy() == v1::ROUTING_POLICY_UNSPECIFIED ||
      !v1::RoutingPolicy_IsValid(config.policy())) {
    return absl::InvalidArgumentError(
        "routing policy must be ROUND_ROBIN, LEAST_LOADED or KV_AWARE");
  }
  if (config.has_kv_overlap_weight() && !(config.kv_overlap_weight() >= 0)) {
    return absl::InvalidArgumentError("kv_overlap_weight must be >= 0");
  }
  return absl::OkStatus();
}

v1::RoutingConfig RoutingPolicy::config() const {
  absl::MutexLock lock(&mu_);
  return config_;
}

absl::StatusOr<v1::RoutingConfig> RoutingPolicy::SetConfig(
    const v1::RoutingConfig& config) {
  if (absl::Status valid = ValidateRoutingConfig(config); !valid.ok()) {
    return valid;
  }
  absl::MutexLock lock(&mu_);
  v1::RoutingConfig previous = config_;
  config_ = config;
  return previous;
}

namespace {

int64_t Uncached(const WorkerView& w, int32_t prompt_tokens,
                 int32_t block_size) {
  return std::max<int64_t>(
      1, prompt_tokens - int64_t{w.cached_blocks} * block_size);
}

// Prompt tokens waiting on a prefill worker: what it reported, or what this
// router sent since, whichever is larger (heartbeats lag).
int64_t QueuedTokens(const WorkerView& w) {
  return std::max<int64_t>(w.outstanding_tokens,
                           w.load.queued_prefill_tokens());
}

// Decode candidates, most attractive first: fewest sequences (running as
// reported plus what this router sent since), then most free blocks.
std::vector<size_t> RankDecode(const std::vector<WorkerView>& decode) {
  std::vector<size_t> order(decode.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](size_t i) {
    const WorkerView& w = decode[i];
    return std::make_tuple(std::max<int64_t>(w.load.running_sequences(), 0) +
                               w.outstanding_sequences,
                           -static_cast<int64_t>(w.load.free_kv_blocks()),
                           w.worker_id);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return key(a) < key(b); });
  return order;
}

}  // namespace

Route RoutingPolicy::Choose(const std::vector<WorkerView>& prefill,
                            const std::vector<WorkerView>& decode,
                            int32_t prompt_tokens, int32_t block_size) {
  absl::MutexLock lock(&mu_);
  Route route;
  if (decode.empty()) return route;
  block_size = std::max(block_size, 1);
  if (config_.policy() == v1::ROUTING_POLICY_ROUND_ROBIN) {
    const size_t first = next_decode_++ % decode.size();
    for (size_t i = 0; i < decode.size(); ++i) {
      route.decode_order.push_back((first + i) % decode.size());
    }
  } else {
    route.decode_order = RankDecode(decode);
  }
  const WorkerView& chosen = decode[route.decode_order.front()];
  const bool local = prefill.empty() || chosen.role == v1::WORKER_ROLE_BOTH ||
                     Uncached(chosen, prompt_tokens, block_size) <=
                         config_.local_prefill_max_uncached_tokens();
  if (local) return route;

  switch (config_.policy()) {
    case v1::ROUTING_POLICY_ROUND_ROBIN:
      route.prefill = next_prefill_++ % prefill.size();
      break;
    case v1::ROUTING_POLICY_KV_AWARE: {
      const double weight =
          config_.has_kv_overlap_weight() ? config_.kv_overlap_weight() : 1.0;
      double best = 0;
      for (size_t i = 0; i < prefill.size(); ++i) {
        const WorkerView& w = prefill[i];
        const double cost =
            weight * Uncached(w, prompt_tokens, block_size) + QueuedTokens(w);
        if (!route.prefill.has_value() || cost < best) {
          best = cost;
          route.prefill = i;
        }
      }
      break;
    }
    default: {  // LEAST_LOADED
      int64_t best = 0;
      for (size_t i = 0; i < prefill.size(); ++i) {
        const int64_t load = QueuedTokens(prefill[i]);
        if (!route.prefill.has_value() || load < best) {
          best = load;
          route.prefill = i;
        }
      }
      break;
    }
  }
  return route;
}

}  // namespace pdserve::router
