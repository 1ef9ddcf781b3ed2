#include "autoscaler/planner_process.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "autoscaler/planner_flags.h"
#include "autoscaler/planner_loop.h"
#include "common/termination_signal.h"
#include "metrics/metrics_server.h"
#include "metrics/process_metrics.h"
#include "metrics/registry.h"
#include "rpc/cluster_credential.h"

namespace pdserve::autoscaler {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "pd-planner: " << status << std::endl;
  return 1;
}

}  // namespace

int RunPlannerProcess(const PlannerProcessOptions& process) {
  absl::StatusOr<std::unique_ptr<planner::Planner>> planner =
      PlannerFromFlags();
  if (!planner.ok()) return Fail(planner.status());
  rpc::ClusterCredential credential;
  if (!process.cluster_token_file.empty()) {
    absl::StatusOr<rpc::ClusterCredential> read =
        rpc::ClusterCredential::FromFile(process.cluster_token_file);
    if (!read.ok()) return Fail(read.status());
    credential = *std::move(read);
  }
  const bool once = process.once;
  std::unique_ptr<Scaler> scaler;
  const std::string& kind = process.scaler;
  if (kind == "local") {
    if (process.local.work_dir.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--scaler=local needs --work_dir (the pdctl up cluster's folder)"));
    }
    scaler = MakeLocalClusterScaler(process.local);
  } else if (kind == "publish") {
    scaler = MakePublishOnlyScaler();
  } else {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--scaler must be local or publish, not '", kind, "'")));
  }

  metrics::Registry registry;
  if (absl::Status added = metrics::AddProcessMetrics(&registry); !added.ok()) {
    return Fail(added);
  }
  PlannerLoopOptions options;
  options.router_control = process.router_control;
  options.credential = credential;
  options.router_http = process.router_http;
  options.interval = PlannerIntervalFromFlags();
  options.decision_log = DecisionLogFromFlags();
  options.act = !once;
  const std::string describe = once ? "advisory" : scaler->Describe();
  absl::StatusOr<std::unique_ptr<PlannerLoop>> loop = PlannerLoop::Create(
      options, *std::move(planner), std::move(scaler), &registry);
  if (!loop.ok()) return Fail(loop.status());

  std::unique_ptr<metrics::MetricsServer> server;
  if (const std::string& listen = process.metrics_listen;
      !listen.empty() && !once) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> started =
        metrics::MetricsServer::Start({.listen_address = listen}, &registry);
    if (!started.ok()) return Fail(started.status());
    server = *std::move(started);
    if (const std::string& port_file = process.port_file; !port_file.empty()) {
      std::ofstream(port_file + ".tmp") << server->port() << "\n";
      std::rename((port_file + ".tmp").c_str(), port_file.c_str());
    }
  }
  std::cerr << "pd-planner: deciding every "
            << absl::FormatDuration(options.interval) << " from router "
            << options.router_control << " (metrics " << options.router_http
            << "); acting: " << describe
            << (server ? absl::StrCat("; /metrics on port ", server->port())
                       : "")
            << std::endl;

  if (once) {
    if (absl::Status s = (*loop)->Baseline(); !s.ok()) return Fail(s);
    if (WaitForTerminationSignal(options.interval).has_value()) return 0;
    absl::StatusOr<planner::Decision> d = (*loop)->Tick();
    if (!d.ok()) return Fail(d.status());
    std::cout << FormatDecision(*d, (*loop)->planner().options());
    return 0;
  }
  (*loop)->Run([](absl::Duration wait) {
    return WaitForTerminationSignal(wait).has_value();
  });
  std::cerr << "pd-planner: stopping (a scale in progress finishes first)"
            << std::endl;
  return 0;
}

}  // namespace pdserve::autoscaler
