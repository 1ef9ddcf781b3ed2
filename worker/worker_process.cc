#include "worker/worker_process.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/termination_signal.h"
#include "metrics/metrics_server.h"
#include "proto/enum_names.h"
#include "rpc/server.h"
#include "worker/membership_client.h"
#include "worker/prefix_cache_feed.h"
#include "worker/router_membership.h"
#include "worker/router_targets.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port for the worker's gRPC server (port 0 picks a free port)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port the router and peers should dial (default: the bound "
          "address; set it to the pod or host IP when listening on 0.0.0.0)");
ABSL_FLAG(std::string, router, "127.0.0.1:50050",
          "the routers' control addresses to register with: host:port, a "
          "comma-separated list of them, or dns:///NAME:PORT (every address "
          "NAME resolves to, resolved again every "
          "--router_resolve_interval_ms; a Kubernetes headless Service); "
          "empty runs standalone");
ABSL_FLAG(int32_t, router_resolve_interval_ms, 5000,
          "with --router=dns:///NAME:PORT, how often NAME is resolved again "
          "(new routers get a registration, vanished ones are left)");
ABSL_FLAG(std::string, worker_id, "",
          "stable worker name (default: ROLE-HOST-PID)");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written here once serving");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "host:port where GET /metrics serves Prometheus metrics over plain "
          "HTTP (port 0 picks a free port; '' turns it off); registered with "
          "the router for pdctl top");
ABSL_FLAG(int32_t, drain_timeout_ms, 30000,
          "on SIGTERM or a drain, how long in-flight work may take; what "
          "still runs then is handed back to the router, which migrates "
          "streams and retries prompts on other workers");

namespace pdserve::worker {
namespace {

std::string DefaultWorkerId(v1::WorkerRole role) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return absl::StrCat(ShortRoleName(role), "-", host, "-", ::getpid());
}

// Drain state shared by the membership thread (router DRAIN command) and
// main (SIGTERM).
class DrainState {
 public:
  void Begin(absl::Duration deadline) {
    absl::MutexLock lock(&mutex_);
    const absl::Time until = absl::Now() + deadline;
    if (!draining_ || until < deadline_) deadline_ = until;
    draining_ = true;
  }
  bool draining() {
    absl::MutexLock lock(&mutex_);
    return draining_;
  }
  absl::Time deadline() {
    absl::MutexLock lock(&mutex_);
    return deadline_;
  }

 private:
  absl::Mutex mutex_;
  bool draining_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Time deadline_ ABSL_GUARDED_BY(mutex_) = absl::InfiniteFuture();
};

// `advertised`'s host with `port`: where peers reach another port of this
// worker.
std::string SameHost(const std::string& advertised, int port) {
  const size_t colon = advertised.rfind(':');
  return absl::StrCat(advertised.substr(0, colon), ":", port);
}

}  // namespace

std::string WorkerIdFromFlags(v1::WorkerRole role) {
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  return worker_id.empty() ? DefaultWorkerId(role) : worker_id;
}

int RunWorkerProcess(const WorkerProcessOptions& options) {
  const std::string worker_id = WorkerIdFromFlags(options.role);
  SetLogTag(worker_id);

  rpc::GrpcServerOptions server_options;
  server_options.listen_address = absl::GetFlag(FLAGS_listen);
  server_options.services = options.services;
  absl::StatusOr<std::unique_ptr<rpc::GrpcServer>> server =
      rpc::GrpcServer::Start(server_options);
  if (!server.ok()) {
    PD_LOG(ERROR) << server.status();
    return 1;
  }

  const std::string advertised = absl::GetFlag(FLAGS_advertise_address).empty()
                                     ? (*server)->address()
                                     : absl::GetFlag(FLAGS_advertise_address);
  if (options.on_serving) {
    if (absl::Status ready = options.on_serving(advertised); !ready.ok()) {
      PD_LOG(ERROR) << "cannot start serving: " << ready;
      return 1;
    }
  }

  // Prometheus metrics, up before the worker registers so that whoever
  // finds it through the router can scrape it at once.
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  std::string metrics_address;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
      options.metrics != nullptr && !listen.empty()) {
    metrics::MetricsServerOptions metrics_options;
    metrics_options.listen_address = listen;
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> started =
        metrics::MetricsServer::Start(metrics_options, options.metrics);
    if (!started.ok()) {
      PD_LOG(ERROR) << "--metrics_listen: " << started.status();
      return 1;
    }
    metrics_server = std::move(started).value();
    metrics_address = SameHost(advertised, metrics_server->port());
  }

  DrainState drain;
  auto begin_drain = [&](absl::Duration deadline) {
    drain.Begin(deadline);
    if (options.on_drain) options.on_drain();
  };
  absl::StatusOr<RouterTargets> targets =
      ParseRouterTargets(absl::GetFlag(FLAGS_router));
  if (!targets.ok()) {
    PD_LOG(ERROR) << targets.status();
    return 2;
  }
  // Every router gets every prefix-cache event (one queue each).
  PrefixCacheFeed prefix_cache_feed([&options] {
    return options.take_events ? options.take_events()
                               : std::vector<v1::PrefixCacheEvent>();
  });
  std::unique_ptr<RouterMembership> membership;
  if (targets->is_dns() || !targets->addresses.empty()) {
    RouterMembershipOptions router_options;
    router_options.targets = *std::move(targets);
    router_options.prefix_cache_feed = &prefix_cache_feed;
    router_options.resolve_interval = absl::Milliseconds(
        std::max(100, absl::GetFlag(FLAGS_router_resolve_interval_ms)));
    MembershipClientOptions& membership_options = router_options.session;
    membership_options.credential = options.credential;
    v1::RegisterRequest& registration = membership_options.registration;
    registration.set_worker_id(worker_id);
    registration.set_instance_id(
        absl::StrCat(worker_id, "@", absl::ToUnixMicros(absl::Now())));
    registration.set_role(options.role);
    registration.set_grpc_address(advertised);
    *registration.mutable_model() = options.model;
    for (v1::TransportKind kind : options.transports) {
      registration.add_transports(kind);
    }
    registration.set_max_running_sequences(options.max_running_sequences);
    registration.set_max_batch_tokens(options.max_batch_tokens);
    registration.set_metrics_address(metrics_address);
    membership_options.report_status = [&] {
      WorkerStatusReport report;
      report.state = drain.draining() ? v1::WORKER_STATE_DRAINING
                                      : v1::WORKER_STATE_SERVING;
      report.inflight_requests = options.inflight_requests();
      if (options.load) report.load = options.load();
      return report;
    };
    membership_options.on_drain = [&](absl::Duration deadline) {
      PD_LOG(INFO) << "router asked us to drain within "
                   << absl::FormatDuration(deadline);
      begin_drain(deadline);
    };
    absl::StatusOr<std::unique_ptr<RouterMembership>> client =
        RouterMembership::Start(std::move(router_options));
    if (!client.ok()) {
      PD_LOG(ERROR) << client.status();
      return 2;
    }
    membership = std::move(client).value();
  }

  (*server)->SetServing(true);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file);
      !port_file.empty()) {
    // The gRPC port, then the metrics port when there is one.
    std::ofstream out(port_file + ".tmp");
    out << (*server)->port();
    if (metrics_server != nullptr) out << " " << metrics_server->port();
    out << "\n";
    out.close();
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  PD_LOG(INFO) << ShortRoleName(options.role) << " worker " << worker_id
               << " serving on " << (*server)->address() << ", metrics on "
               << (metrics_address.empty() ? "(off)" : metrics_address);

  // Wait for SIGTERM/SIGINT or a router drain command.
  while (!drain.draining()) {
    if (std::optional<int> signal =
            WaitForTerminationSignal(absl::Milliseconds(100))) {
      PD_LOG(INFO) << "signal " << *signal << ": draining";
      begin_drain(absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
    }
  }
  // No new work from here on; the router sees DRAINING with the next
  // heartbeat and probes see NOT_SERVING now.
  (*server)->SetServing(false);
  while (options.inflight_requests() > 0 && absl::Now() < drain.deadline()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (const uint32_t left = options.inflight_requests(); left > 0) {
    // Never dropped: each goes back to the router, which retries or
    // migrates it on another worker.
    PD_LOG(WARNING) << "drain deadline passed with " << left
                    << " requests in flight; handing them back to the "
                       "router to migrate or retry elsewhere";
    const uint32_t handed = options.hand_back ? options.hand_back() : 0;
    const absl::Time give_up = absl::Now() + kHandBackGrace;
    while (options.inflight_requests() > 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (const uint32_t stuck = options.inflight_requests(); stuck > 0) {
      PD_LOG(WARNING) << stuck << " requests still in flight "
                      << absl::FormatDuration(kHandBackGrace)
                      << " after handing " << handed
                      << " back; stopping anyway";
    }
  }
  if (membership != nullptr) membership->Stop("drained");
  (*server)->Shutdown(absl::Seconds(1));
  if (metrics_server != nullptr) metrics_server->Shutdown();
  PD_LOG(INFO) << "worker " << worker_id << " stopped";
  return 0;
}

}  // namespace pdserve::worker
