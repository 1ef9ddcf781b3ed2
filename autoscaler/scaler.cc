#include "autoscaler/scaler.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/cluster_state.h"
#include "cli/scale.h"

namespace pdserve::autoscaler {
namespace {

class LocalClusterScaler : public Scaler {
 public:
  explicit LocalClusterScaler(LocalClusterScalerOptions options)
      : options_(std::move(options)) {}

  std::string Describe() const override {
    return absl::StrCat("local cluster in ", options_.work_dir,
                        " (pdctl scale's channel)");
  }

  absl::StatusOr<std::optional<PoolSizes>> Configured() override {
    absl::StatusOr<cli::ClusterState> state =
        cli::ReadClusterState(options_.work_dir);
    if (!state.ok()) return state.status();
    const std::map<std::string, int> sizes = state->PoolSizes();
    return PoolSizes{{"prefill", sizes.at("prefill")},
                     {"decode", sizes.at("decode")}};
  }

  absl::StatusOr<std::string> Scale(const std::string& pool,
                                    int replicas) override {
    cli::ScaleRequest request;
    request.id = absl::StrCat("planner-", ::getpid(), "-",
                              absl::ToUnixMicros(absl::Now()));
    request.pool = pool;
    request.replicas = replicas;
    request.drain_deadline = options_.drain_deadline;
    // As pdctl scale allows: the drain of every removed worker (together),
    // or each new worker's start in turn.
    const absl::Duration timeout =
        options_.drain_deadline + absl::Seconds(60) +
        options_.startup_timeout * std::max(1, replicas);
    const std::string work_dir = options_.work_dir;
    std::ostringstream waiting;
    return cli::RequestScale(
        work_dir, request, timeout,
        [work_dir] { return cli::LiveSupervisor(work_dir).has_value(); },
        waiting);
  }

 private:
  const LocalClusterScalerOptions options_;
};

class PublishOnlyScaler : public Scaler {
 public:
  std::string Describe() const override {
    return "publish only (pdserve_planner_desired_replicas for an HPA or "
           "KEDA)";
  }
  absl::StatusOr<std::optional<PoolSizes>> Configured() override {
    return std::optional<PoolSizes>();
  }
  absl::StatusOr<std::string> Scale(const std::string& pool,
                                    int replicas) override {
    return absl::StrCat("published ", pool, " = ", replicas);
  }
};

}  // namespace

std::unique_ptr<Scaler> MakeLocalClusterScaler(
    LocalClusterScalerOptions options) {
  return std::make_unique<LocalClusterScaler>(std::move(options));
}

std::unique_ptr<Scaler> MakePublishOnlyScaler() {
  return std::make_unique<PublishOnlyScaler>();
}

}  // namespace pdserve::autoscaler
