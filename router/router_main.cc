// pd-router: the cluster's front door and control plane.
//
// Three listeners, so that exposing the client API never exposes control of
// the cluster:
//   --listen          client gRPC: pdserve.v1.Generation (+ health,
//                     reflection);
//   --http_listen     OpenAI-compatible HTTP: /v1/completions,
//                     /v1/chat/completions (SSE), /v1/models, /health,
//                     and the router's Prometheus metrics at /metrics;
//   --control_listen  membership (workers register and heartbeat here) and
//                     the admin API (pdctl), bound to loopback by default;
//                     in a multi-host deployment bind it to the cluster
//                     network only. With --cluster_token_file, every
//                     control call must present the cluster's token, and
//                     the router presents it to the workers
//                     (docs/security.md).
// The router reads --model for the tokenizer and chat template (the same
// file the workers serve).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/termination_signal.h"
#include "metrics/metrics_flags.h"
#include "metrics/process_metrics.h"
#include "metrics/registry.h"
#include "model/model_flags.h"
#include "model/model_text.h"
#include "router/control_services.h"
#include "router/generation_core.h"
#include "router/generation_service.h"
#include "router/http_frontend.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"
#include "rpc/cluster_credential_flags.h"
#include "rpc/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50050",
          "host:port for the client gRPC API (port 0 picks a free port)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8000",
          "host:port for the OpenAI-compatible HTTP API ('' disables it)");
ABSL_FLAG(std::string, control_listen, "127.0.0.1:50051",
          "host:port for membership and the admin API");
ABSL_FLAG(std::string, api_key_file, "",
          "file of API keys (one per line) OpenAI HTTP clients must send as "
          "'Authorization: Bearer KEY' (everything but /health and /metrics "
          "answers 401 without one); empty: no key required");
ABSL_FLAG(std::string, port_file, "",
          "if set, written once serving: the client gRPC, control and HTTP "
          "ports on one line");
ABSL_FLAG(std::string, routing_policy, "kv_aware",
          "round_robin, least_loaded or kv_aware (changeable at run time "
          "with pdctl policy)");
ABSL_FLAG(int32_t, local_prefill_max_uncached_tokens, 0,
          "conditional disaggregation: prompts with at most this many tokens "
          "not already cached on the decode worker are prefilled there");
ABSL_FLAG(int32_t, max_inflight, 256,
          "requests running at once; more are refused with "
          "RESOURCE_EXHAUSTED / HTTP 503");
ABSL_FLAG(int32_t, max_prefill_retries, 2,
          "tries on other workers after a failure before the first token");
ABSL_FLAG(int32_t, max_migrations, 2,
          "times a stream may move to another decode worker after its "
          "worker failed; then the request fails with a clear error");
ABSL_FLAG(int32_t, reservation_timeout_ms, 120000,
          "longest a decode worker holds blocks for a prefill's KV (capped by "
          "the request's deadline); after it a failed prefill's blocks are "
          "reclaimed");
ABSL_FLAG(int32_t, capacity_wait_ms, 30000,
          "longest a request waits for room (a decode worker with free KV "
          "blocks for it, a prefill worker whose queue is not full; a "
          "waiting queue at most --max_inflight long) before "
          "RESOURCE_EXHAUSTED / HTTP 503; 0 refuses at once");
ABSL_FLAG(int32_t, request_timeout_ms, 600000,
          "deadline of requests that do not set one");
ABSL_FLAG(int32_t, lease_ms, 3000,
          "a worker silent for this long is removed from the cluster");
ABSL_FLAG(int32_t, heartbeat_ms, 500, "heartbeat interval told to workers");
ABSL_FLAG(int32_t, shutdown_grace_ms, 5000,
          "on SIGTERM, time given to in-flight calls before cancelling them");

namespace pdserve::router {
namespace {

absl::StatusOr<v1::RoutingPolicy> ParsePolicy(std::string name) {
  name = absl::AsciiStrToLower(name);
  if (name == "round_robin") return v1::ROUTING_POLICY_ROUND_ROBIN;
  if (name == "least_loaded") return v1::ROUTING_POLICY_LEAST_LOADED;
  if (name == "kv_aware") return v1::ROUTING_POLICY_KV_AWARE;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown routing policy '", name,
                   "' (round_robin, least_loaded, kv_aware)"));
}

int Run() {
  // --model (model/model_flags.h): the file the workers serve, read here
  // for its tokenizer and chat template (not its weights).
  absl::StatusOr<rpc::ClusterCredential> credential =
      rpc::ClusterCredentialFromFlags();
  if (!credential.ok()) {
    PD_LOG(ERROR) << credential.status();
    return 2;
  }
  rpc::ClusterCredential api_keys;
  if (const std::string path = absl::GetFlag(FLAGS_api_key_file);
      !path.empty()) {
    absl::StatusOr<rpc::ClusterCredential> read =
        rpc::ClusterCredential::FromFile(path);
    if (!read.ok()) {
      PD_LOG(ERROR) << "--api_key_file: " << read.status();
      return 2;
    }
    api_keys = *std::move(read);
  }
  const std::string model_path = model::ModelPathFromFlags();
  absl::StatusOr<std::unique_ptr<model::ModelText>> model =
      model::ModelText::Open(model_path);
  if (!model.ok()) {
    PD_LOG(ERROR) << model.status();
    return 2;
  }
  absl::StatusOr<v1::RoutingPolicy> policy_kind =
      ParsePolicy(absl::GetFlag(FLAGS_routing_policy));
  if (!policy_kind.ok()) {
    PD_LOG(ERROR) << policy_kind.status();
    return 2;
  }
  v1::RoutingConfig routing;
  routing.set_policy(*policy_kind);
  routing.set_local_prefill_max_uncached_tokens(
      absl::GetFlag(FLAGS_local_prefill_max_uncached_tokens));
  RoutingPolicy policy(routing);

  WorkerRegistryOptions registry_options;
  registry_options.lease_duration =
      absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  registry_options.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  absl::StatusOr<std::unique_ptr<WorkerRegistry>> registry =
      WorkerRegistry::Create(registry_options);
  if (!registry.ok()) {
    PD_LOG(ERROR) << registry.status();
    return 2;
  }
  // Prometheus metrics (docs/metrics.md), served on the HTTP port. Declared
  // before everything that records to them.
  metrics::Registry metrics_registry;
  if (absl::Status added = metrics::AddProcessMetrics(&metrics_registry);
      !added.ok()) {
    PD_LOG(ERROR) << added;
    return 2;
  }
  RouterMetricsOptions metrics_options;
  metrics_options.model = model::ServedModelName(model_path);
  if (absl::StatusOr<metrics::LatencyBuckets> buckets =
          metrics::LatencyBucketsFromFlags();
      buckets.ok()) {
    metrics_options.buckets = *std::move(buckets);
  } else {
    PD_LOG(ERROR) << buckets.status();
    return 2;
  }
  absl::StatusOr<std::unique_ptr<RouterMetrics>> router_metrics =
      RouterMetrics::Create(&metrics_registry, metrics_options);
  if (!router_metrics.ok()) {
    PD_LOG(ERROR) << router_metrics.status();
    return 2;
  }
  if (absl::Status added =
          (*router_metrics)
              ->AddWorkerPools(
                  [&registry](v1::WorkerRole role, v1::WorkerState state) {
                    return (*registry)->Count(role, state);
                  });
      !added.ok()) {
    PD_LOG(ERROR) << added;
    return 2;
  }

  GenerationCoreOptions core_options;
  core_options.metrics = router_metrics->get();
  core_options.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  core_options.max_prefill_retries = absl::GetFlag(FLAGS_max_prefill_retries);
  core_options.max_migrations = absl::GetFlag(FLAGS_max_migrations);
  core_options.reservation_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_reservation_timeout_ms));
  core_options.capacity_wait =
      absl::Milliseconds(std::max(0, absl::GetFlag(FLAGS_capacity_wait_ms)));
  core_options.model_id = model::ServedModelName(model_path);
  core_options.credential = *credential;
  GenerationCore core(model->get(), registry->get(), &policy, core_options);
  const absl::Duration request_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_request_timeout_ms));

  MembershipService membership(registry->get(), *credential);
  AdminService admin(registry->get(), &policy, *credential);
  rpc::GrpcServerOptions control_options;
  control_options.listen_address = absl::GetFlag(FLAGS_control_listen);
  control_options.services = {&membership, &admin};
  absl::StatusOr<std::unique_ptr<rpc::GrpcServer>> control =
      rpc::GrpcServer::Start(control_options);
  if (!control.ok()) {
    PD_LOG(ERROR) << "control API: " << control.status();
    return 1;
  }

  auto generation = std::make_unique<GenerationService>(
      &core, request_timeout, core_options.retry_after, router_metrics->get());
  rpc::GrpcServerOptions client_options;
  client_options.listen_address = absl::GetFlag(FLAGS_listen);
  client_options.services = {generation.get()};
  absl::StatusOr<std::unique_ptr<rpc::GrpcServer>> client =
      rpc::GrpcServer::Start(client_options);
  if (!client.ok()) {
    PD_LOG(ERROR) << "client API: " << client.status();
    return 1;
  }

  std::unique_ptr<HttpFrontend> http;
  if (const std::string listen = absl::GetFlag(FLAGS_http_listen);
      !listen.empty()) {
    HttpFrontendOptions http_options;
    http_options.listen_address = listen;
    http_options.default_timeout = request_timeout;
    http_options.metrics = router_metrics->get();
    http_options.metrics_registry = &metrics_registry;
    http_options.api_keys = api_keys;
    http_options.retry_after_s = static_cast<int>(absl::ToInt64Seconds(
        core_options.retry_after + absl::Seconds(1) - absl::Nanoseconds(1)));
    absl::StatusOr<std::unique_ptr<HttpFrontend>> started =
        HttpFrontend::Start(http_options, &core);
    if (!started.ok()) {
      PD_LOG(ERROR) << "HTTP API: " << started.status();
      return 1;
    }
    http = std::move(started).value();
  }

  // Drops workers whose lease ran out even when nobody is listing them, so
  // the log shows when a worker was lost.
  absl::Notification stop_sweeper;
  std::thread sweeper([&] {
    while (
        !stop_sweeper.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      const std::vector<std::string> lost =
          (*registry)->ExpireLeases(absl::Now());
      for (const std::string& id : lost) {
        PD_LOG(WARNING) << "worker " << id
                        << " missed its lease; removed from the cluster";
      }
      if (!lost.empty()) core.WorkersLost(lost);
    }
  });

  (*control)->SetServing(true);
  (*client)->SetServing(true);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file);
      !port_file.empty()) {
    std::ofstream(port_file + ".tmp")
        << (*client)->port() << " " << (*control)->port() << " "
        << (http != nullptr ? http->port() : 0) << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  PD_LOG(INFO) << "router serving model " << core_options.model_id
               << ": gRPC on " << (*client)->address() << ", HTTP on "
               << (http != nullptr ? absl::StrCat("127.0.0.1:", http->port())
                                   : std::string("(off)"))
               << ", control on " << (*control)->address();

  const int signal = WaitForTerminationSignal().value_or(0);
  PD_LOG(INFO) << "signal " << signal << ": shutting down";
  (*client)->SetServing(false);
  (*control)->SetServing(false);
  const absl::Duration grace =
      absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  if (http != nullptr) http->Shutdown();
  (*client)->Shutdown(grace);
  generation.reset();  // waits for request threads
  (*control)->Shutdown(absl::Seconds(1));
  stop_sweeper.Notify();
  sweeper.join();
  PD_LOG(INFO) << "router stopped";
  return 0;
}

}  // namespace
}  // namespace pdserve::router

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "pd-router: pdserve's front door and control plane.");
  absl::ParseCommandLine(argc, argv);
  pdserve::SetLogTag("router");
  return pdserve::router::Run();
}
