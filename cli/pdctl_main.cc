// pdctl: the operator CLI.
//
//   pdctl up       [--routers=N --prefill=N --decode=N --colocated=N
//                  --model=FILE ...]
//                  starts a local cluster in the background, waits until
//                  every process is healthy and registered, prints the
//                  endpoints and returns (--foreground: stay until Ctrl-C)
//   pdctl down     stops the local cluster `up` started (workers drain)
//   pdctl status   [--router=H:P]   pools and workers as the router sees them,
//                  with each worker's running and waiting requests and KV use
//   pdctl top      [--router=H:P --router_http=H:P --interval_ms=1000
//                  --iterations=N]  live view of the pools from the router's
//                  and every worker's /metrics: requests running and
//                  waiting, KV use, tokens/s, TTFT and ITL p50/p99 over the
//                  last minute (cli/top_view.h); refreshes in place on a
//                  terminal, plain frames separated by a blank line elsewhere
//   pdctl drain    WORKER_ID [--deadline_ms=N]
//   pdctl scale    POOL N [--deadline_ms=N]   resizes a pool (prefill,
//                  decode, colocated) of the local cluster `up` started:
//                  new workers get work once SERVING; removed ones drain
//                  within --deadline_ms, then hand what still runs back to
//                  the router, which migrates it (cli/scale.h). Concurrent
//                  scales wait their turn; a cluster left with no decode
//                  or colocated worker is refused
//   pdctl plan     --profile=FILE [--once --ttft_target_ms --itl_target_ms
//                  --interval_s ...]  the SLO planner (docs/planner.md) on
//                  the router's metrics: --once prints one advisory
//                  decision (measured over --interval_s) and changes
//                  nothing; without it, resizes the local cluster `up`
//                  started every interval until Ctrl-C (pd-planner is the
//                  same as a process of its own)
//   pdctl policy   [round_robin|least_loaded|kv_aware]
//                  [--local_prefill_max_uncached_tokens=N]
//                  shows, or sets at run time, the router's routing policy
//   pdctl generate --prompt=TEXT [--chat --max_tokens=N --temperature=T]
//                  [--grpc=H:P]     streams an answer through the router and
//                  prints its TTFT and TPOT
//   pdctl health   ADDRESS [--service=NAME --wait_ms=N]
//   pdctl bench    [--target=grpc://H:P|http://H:P --request_rate=R,...]
//                  load generator: TTFT, TPOT, ITL, goodput; JSON and plots
//                  (cli/bench_command.h lists its flags)
//   pdctl profile  [--model=FILE --worker_args=... --prompt_lengths=...
//                  --batch_sizes=... --context_lengths=... --out=FILE]
//                  starts its own router + 1 prefill + 1 decode worker,
//                  measures them and writes the planner's capacity profile
//                  (cli/profile.h)
//
// --router is the router's control address (membership and admin API;
// loopback by default; unset with a local cluster up: its first router that
// answers); --grpc its client address.
// --cluster_token_file (else $PDSERVE_CLUSTER_TOKEN_FILE, else the one the
// running `pdctl up` cluster was started with) holds the token presented to
// the admin API; `pdctl up --cluster_token_file=F` starts every process
// with it (docs/security.md).
// Exit codes: 0 success, 1 the operation failed, 2 bad usage.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "autoscaler/planner_process.h"
#include "cli/admin_client.h"
#include "cli/bench_command.h"
#include "cli/cluster_state.h"
#include "cli/generate_client.h"
#include "cli/local_cluster.h"
#include "cli/profile.h"
#include "cli/scale.h"
#include "cli/supervisor.h"
#include "cli/top_scrape.h"
#include "cli/top_view.h"
#include "common/termination_signal.h"
#include "rpc/cluster_credential_flags.h"
#include "rpc/health_client.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50051",
          "the router's control address (admin API)");
ABSL_FLAG(std::string, grpc, "127.0.0.1:50050",
          "generate: the router's client gRPC address");
ABSL_FLAG(int32_t, routers, 1,
          "up: number of routers (each serves every worker; the first on "
          "--router_listen/--http_listen/--control_listen, the others on "
          "free ports listed by pdctl up)");
ABSL_FLAG(int32_t, prefill, 1, "up: number of prefill workers");
ABSL_FLAG(int32_t, decode, 1, "up: number of decode workers");
ABSL_FLAG(int32_t, colocated, 0,
          "up: number of colocated workers (both phases in one process)");
ABSL_FLAG(std::string, model, "", "up: GGUF file (default: the default model)");
ABSL_FLAG(std::string, router_listen, "127.0.0.1:50050",
          "up: the router's client gRPC listen address");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8000",
          "up: the router's OpenAI HTTP listen address");
ABSL_FLAG(std::string, control_listen, "127.0.0.1:50051",
          "up: the router's control (membership, admin) listen address");
ABSL_FLAG(std::vector<std::string>, router_args, {},
          "up: extra router flags, comma-separated");
ABSL_FLAG(std::vector<std::string>, worker_args, {},
          "up: extra flags for every worker, comma-separated (e.g. "
          "--threads=1,--kv_cache_mb=64)");
ABSL_FLAG(std::string, bin_dir, "",
          "up: where the server binaries are (default: next to pdctl)");
ABSL_FLAG(std::string, work_dir, "",
          "up/down: logs, port files and the cluster's state file (default: "
          "$PDSERVE_HOME/local-cluster)");
ABSL_FLAG(bool, foreground, false,
          "up: stay in the foreground until Ctrl-C instead of returning");
ABSL_FLAG(std::string, ready_file, "",
          "up: written with the router address once the cluster is ready");
ABSL_FLAG(int32_t, startup_timeout_s, 120,
          "up: time allowed to start (the cluster, or one restarted process)");
ABSL_FLAG(int32_t, restart_backoff_ms, 1000,
          "up: wait before starting a crashed process again; doubles with "
          "each crash in a row");
ABSL_FLAG(int32_t, max_restart_backoff_ms, 30000,
          "up: the longest wait before a restart");
ABSL_FLAG(int32_t, crash_loop_restarts, 5,
          "up: crashes in a row (each before --stable_uptime_s) after which "
          "a process is left down as crash-looping");
ABSL_FLAG(int32_t, stable_uptime_s, 60,
          "up: a process that ran this long before crashing starts a new "
          "count of crashes");
ABSL_FLAG(int32_t, deadline_ms, 60000,
          "drain, scale: time a drained worker is allowed for its in-flight "
          "work; what still runs then is migrated to other workers");
ABSL_FLAG(int32_t, local_prefill_max_uncached_tokens, -1,
          "policy: conditional disaggregation threshold (-1: keep)");
ABSL_FLAG(std::string, prompt, "", "generate: the prompt");
ABSL_FLAG(bool, chat, false, "generate: send the prompt as a chat message");
ABSL_FLAG(int32_t, max_tokens, 128, "generate: most tokens to generate");
ABSL_FLAG(double, temperature, 0, "generate: sampling temperature");
ABSL_FLAG(int32_t, timeout_s, 300, "generate: request deadline");
ABSL_FLAG(std::string, service, "", "health: service name ('' = server)");
ABSL_FLAG(std::string, router_http, "",
          "top: the router's HTTP address, where it serves /metrics (default: "
          "the running local cluster's, else 127.0.0.1:8000)");
ABSL_FLAG(int32_t, interval_ms, 1000, "top: time between two refreshes");
ABSL_FLAG(bool, once, false,
          "plan: one advisory decision, printed; change nothing");
ABSL_FLAG(int32_t, iterations, 0,
          "top: stop after this many frames (0: until Ctrl-C)");
ABSL_FLAG(std::vector<std::string>, prompt_lengths,
          (std::vector<std::string>{"32", "128", "512", "1536"}),
          "profile: prompt lengths to measure prefill at (capped at the "
          "model's context)");
ABSL_FLAG(int32_t, lone_runs, 3,
          "profile: lone prompts per length; their median TTFT is ttft_s");
ABSL_FLAG(int32_t, burst, 6,
          "profile: prompts sent at once per length to measure busy "
          "throughput");
ABSL_FLAG(std::vector<std::string>, batch_sizes,
          (std::vector<std::string>{"1", "4", "16", "64"}),
          "profile: decode batch sizes (must include 1; capped at the decode "
          "worker's --max_running)");
ABSL_FLAG(std::vector<std::string>, context_lengths,
          (std::vector<std::string>{"16", "512", "1536"}),
          "profile: decode context (prompt) lengths");
ABSL_FLAG(int32_t, decode_tokens, 64,
          "profile: tokens each decode stream generates");
ABSL_FLAG(std::vector<std::string>, prefill_worker_args, {},
          "profile: extra flags for the prefill worker only, after "
          "--worker_args");
ABSL_FLAG(std::vector<std::string>, decode_worker_args, {},
          "profile: extra flags for the decode worker only, after "
          "--worker_args");
ABSL_FLAG(std::string, cost_unit, "workers",
          "profile: what the planner's budget counts (the profile's "
          "cost_unit; each worker costs 1)");
ABSL_FLAG(std::string, out, "",
          "profile: write the profile JSON here (default: stdout)");
ABSL_FLAG(int32_t, wait_ms, 0,
          "health: keep polling up to this long for SERVING");

namespace pdserve::cli {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);

std::string ExecutableDir() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  std::string exe(path, n);
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "." : exe.substr(0, slash);
}

std::string WorkDir() {
  if (!absl::GetFlag(FLAGS_work_dir).empty()) {
    return absl::GetFlag(FLAGS_work_dir);
  }
  const char* home = std::getenv("PDSERVE_HOME");
  if (home != nullptr) return absl::StrCat(home, "/local-cluster");
  const char* user_home = std::getenv("HOME");
  return absl::StrCat(user_home ? user_home : "/tmp",
                      "/.cache/pdserve/local-cluster");
}

// The running cluster's supervisor pid and endpoints (cli/cluster_state.h).
std::string StateFile() { return ClusterStatePath(WorkDir()); }

std::optional<pid_t> LiveSupervisor() {
  return pdserve::cli::LiveSupervisor(WorkDir());
}

// The local cluster's processes as its supervisor last recorded them, for
// pdctl status; empty when no supervisor runs.
std::string FormatLocalProcesses() {
  if (!LiveSupervisor().has_value()) return "";
  absl::StatusOr<ClusterState> state = ReadClusterState(WorkDir());
  if (!state.ok()) return "";
  std::string out = absl::StrFormat(
      "\nlocal cluster (%s)\n%-14s %-8s %-12s %8s  %s\n", WorkDir(), "PROCESS",
      "PID", "STATE", "RESTARTS", "LAST EXIT");
  for (const ClusterStateProcess& p : state->processes) {
    absl::StrAppendFormat(&out, "%-14s %-8d %-12s %8d  %s\n", p.name, p.pid,
                          p.state, p.restarts, p.last_exit);
  }
  return out;
}

// True while `pid` runs. A process that has exited but is not yet reaped
// (a zombie: a foreground supervisor whose parent has not waited for it)
// has stopped, though kill(pid, 0) still finds it.
bool Running(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() &&
         line[close + 2] != 'Z' && line[close + 2] != 'X';
}

// The running local cluster's state, unless --router names a router
// (then pdctl talks to that one alone) or no `pdctl up` cluster runs.
std::optional<ClusterState> LocalClusterUnlessRouterGiven() {
  const absl::CommandLineFlag* router = absl::FindCommandLineFlag("router");
  if ((router != nullptr && router->CurrentValue() != router->DefaultValue()) ||
      !LiveSupervisor().has_value()) {
    return std::nullopt;
  }
  absl::StatusOr<ClusterState> state = ReadClusterState(WorkDir());
  if (!state.ok()) return std::nullopt;
  return *std::move(state);
}

// --router when set to other than its default; else, with a local cluster
// up, its first router that answers (another may have died), else the
// default.
std::string RouterControl() {
  const std::string flag = absl::GetFlag(FLAGS_router);
  const std::optional<ClusterState> state = LocalClusterUnlessRouterGiven();
  if (!state.has_value()) return flag;
  const std::string live =
      FirstLiveRouterControl(*state, [](const std::string& control) {
        absl::StatusOr<rpc::HealthStatus> health =
            rpc::CheckHealth(control, "", absl::Milliseconds(500));
        return health.ok() && *health == rpc::HealthStatus::kServing;
      });
  return live.empty() ? flag : live;
}

int Fail(const absl::Status& status) {
  std::cerr << "pdctl: " << status << "\n";
  return 1;
}

// The token file pdctl presents: --cluster_token_file, else
// $PDSERVE_CLUSTER_TOKEN_FILE, else the running local cluster's.
std::string TokenFile() {
  std::string path = rpc::ClusterTokenFileFromFlags();
  if (!path.empty() || !LiveSupervisor().has_value()) return path;
  absl::StatusOr<ClusterState> state = ReadClusterState(WorkDir());
  return state.ok() ? state->cluster_token_file : std::string();
}

// The credential the admin calls present (auth off without a token file).
absl::StatusOr<rpc::ClusterCredential> Credential() {
  const std::string path = TokenFile();
  if (path.empty()) return rpc::ClusterCredential();
  return rpc::ClusterCredential::FromFile(path);
}

int Status() {
  const std::string router = RouterControl();
  absl::StatusOr<rpc::ClusterCredential> credential = Credential();
  if (!credential.ok()) return Fail(credential.status());
  // The local processes first when the router does not answer: it may be
  // the one restarting.
  absl::StatusOr<v1::ListPoolsResponse> pools =
      ListPools(router, kRpcTimeout, *credential);
  absl::StatusOr<v1::ListWorkersResponse> workers = ListWorkers(
      router, v1::WORKER_ROLE_UNSPECIFIED, kRpcTimeout, *credential);
  if (!pools.ok() || !workers.ok()) {
    std::cout << FormatLocalProcesses();
    return Fail(pools.ok() ? workers.status() : pools.status());
  }
  absl::StatusOr<v1::GetRoutingPolicyResponse> policy =
      GetRoutingPolicy(router, kRpcTimeout, *credential);
  std::cout << "router " << router;
  if (policy.ok()) {
    std::cout << ", routing "
              << v1::RoutingPolicy_Name(policy->config().policy());
  }
  std::cout << "\n" << FormatStatus(*pools, *workers) << FormatLocalProcesses();
  return 0;
}

// pdctl top keeps each process's scrapes of the last minute.
constexpr absl::Duration kTopWindow = absl::Seconds(60);

// "127.0.0.1:PORT" of the running local cluster's HTTP port.
std::optional<std::string> LocalClusterHttp() {
  if (!LiveSupervisor().has_value()) return std::nullopt;
  absl::StatusOr<ClusterState> state = ReadClusterState(WorkDir());
  if (!state.ok() || state->http.empty()) return std::nullopt;
  return state->HttpAddress();
}

// pdctl top: a baseline scrape, then a frame every --interval_ms (so the
// first frame already has rates over one interval) until --iterations
// frames or Ctrl-C. Exit 1 when the router's admin API did not answer for
// the last frame.
int Top() {
  const int interval_ms = absl::GetFlag(FLAGS_interval_ms);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  if (interval_ms <= 0 || iterations < 0) {
    std::cerr << "pdctl: top needs --interval_ms > 0 and --iterations >= 0\n";
    return 2;
  }
  const absl::Duration interval = absl::Milliseconds(interval_ms);
  // A round waits for its slowest scrape; keep it within the interval where
  // the interval allows.
  const absl::Duration timeout =
      std::clamp(interval, absl::Milliseconds(250), absl::Seconds(2));
  TopFrameInput input;
  input.router_control = RouterControl();
  input.router_http = absl::GetFlag(FLAGS_router_http);
  if (input.router_http.empty()) {
    input.router_http = LocalClusterHttp().value_or("127.0.0.1:8000");
  }
  input.window = kTopWindow;
  absl::StatusOr<rpc::ClusterCredential> credential = Credential();
  if (!credential.ok()) return Fail(credential.status());
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  ClusterScrapes scrapes(kTopWindow);
  const ListWorkersFn list_workers = [&] {
    return ListWorkers(input.router_control, v1::WORKER_ROLE_UNSPECIFIED,
                       timeout, *credential);
  };
  ScrapeCluster(list_workers, input.router_http, timeout, scrapes)
      .IgnoreError();
  absl::Time next = absl::Now() + interval;
  int exit_code = 0;
  for (int i = 0; iterations == 0 || i < iterations; ++i) {
    if (WaitForTerminationSignal(
            std::max(next - absl::Now(), absl::ZeroDuration()))
            .has_value()) {
      break;
    }
    // A round slower than the interval delays the next, never bunches them.
    next = std::max(next + interval, absl::Now());
    input.workers =
        ScrapeCluster(list_workers, input.router_http, timeout, scrapes);
    std::cout << FrameForOutput(RenderTopFrame(input, scrapes), terminal, i)
              << std::flush;
    exit_code = input.workers.ok() ? 0 : 1;
  }
  return exit_code;
}

int Drain(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: pdctl drain WORKER_ID\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_deadline_ms) <= 0) {
    std::cerr << "pdctl: --deadline_ms must be positive\n";
    return 2;
  }
  absl::StatusOr<rpc::ClusterCredential> credential = Credential();
  if (!credential.ok()) return Fail(credential.status());
  absl::StatusOr<v1::DrainWorkerResponse> drained =
      DrainWorker(RouterControl(), args[2],
                  absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms)),
                  kRpcTimeout, *credential);
  if (!drained.ok()) return Fail(drained.status());
  std::cout << "draining " << args[2] << " (" << drained->inflight_requests()
            << " requests in flight)\n";
  return 0;
}

int Scale(const std::vector<char*>& args) {
  if (args.size() != 4) {
    std::cerr << "usage: pdctl scale POOL N   (POOL: prefill, decode or "
                 "colocated; N >= 0)\n";
    return 2;
  }
  ScaleRequest request;
  request.pool = args[2];
  if (absl::Status pool = CheckPoolName(request.pool); !pool.ok()) {
    std::cerr << "pdctl: " << pool.message() << "\n";
    return 2;
  }
  if (!absl::SimpleAtoi(args[3], &request.replicas) || request.replicas < 0) {
    std::cerr << "pdctl: the number of workers must be a whole number >= 0, "
                 "not '"
              << args[3] << "'\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_deadline_ms) <= 0) {
    std::cerr << "pdctl: --deadline_ms must be positive\n";
    return 2;
  }
  request.drain_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms));
  if (!LiveSupervisor().has_value()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "no local cluster is up (", StateFile(),
        "); pdctl scale resizes a cluster started with pdctl up")));
  }
  request.id = absl::StrCat(::getpid(), "-", absl::ToUnixMicros(absl::Now()));
  // Room for the drain and hand-back of every removed worker (they drain
  // together), or for starting each new worker in turn.
  const absl::Duration timeout =
      request.drain_deadline + absl::Seconds(60) +
      absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s)) *
          std::max(1, request.replicas);
  absl::StatusOr<std::string> report = RequestScale(
      WorkDir(), request, timeout, [] { return LiveSupervisor().has_value(); },
      std::cerr);
  if (!report.ok()) return Fail(report.status());
  std::cout << *report << "\n";
  return 0;
}

// The routers a policy change goes to: --router's alone when given or with
// no local cluster up; else every router of the local cluster.
std::vector<std::string> PolicyRouters(const std::string& router) {
  const std::optional<ClusterState> state = LocalClusterUnlessRouterGiven();
  if (!state.has_value() || state->routers.empty()) return {router};
  std::vector<std::string> controls;
  for (const ClusterStateRouter& r : state->routers) {
    controls.push_back(r.control);
  }
  return controls;
}

int Policy(const std::vector<char*>& args) {
  const std::string router = RouterControl();
  absl::StatusOr<rpc::ClusterCredential> credential = Credential();
  if (!credential.ok()) return Fail(credential.status());
  absl::StatusOr<v1::GetRoutingPolicyResponse> current =
      GetRoutingPolicy(router, kRpcTimeout, *credential);
  if (!current.ok()) return Fail(current.status());
  v1::RoutingConfig config = current->config();
  bool change = false;
  if (args.size() == 3) {
    const std::string name =
        absl::AsciiStrToUpper(absl::StrCat("ROUTING_POLICY_", args[2]));
    v1::RoutingPolicy policy;
    if (!v1::RoutingPolicy_Parse(name, &policy) ||
        policy == v1::ROUTING_POLICY_UNSPECIFIED) {
      std::cerr << "pdctl: unknown policy '" << args[2]
                << "' (round_robin, least_loaded, kv_aware)\n";
      return 2;
    }
    config.set_policy(policy);
    change = true;
  } else if (args.size() > 3) {
    std::cerr << "usage: pdctl policy [NAME]\n";
    return 2;
  }
  if (const int n = absl::GetFlag(FLAGS_local_prefill_max_uncached_tokens);
      n >= 0) {
    config.set_local_prefill_max_uncached_tokens(n);
    change = true;
  }
  if (change) {
    // Every router routes by its own policy: a change goes to each.
    std::vector<std::string> failed;
    for (const std::string& control : PolicyRouters(router)) {
      absl::StatusOr<v1::SetRoutingPolicyResponse> set =
          SetRoutingPolicy(control, config, kRpcTimeout, *credential);
      if (set.ok() && control == router) config = set->current();
      if (!set.ok()) failed.push_back(set.status().ToString());
    }
    if (!failed.empty()) {
      std::cerr << "pdctl: the policy was not set on every router: "
                << absl::StrJoin(failed, "; ") << "\n";
      return 1;
    }
  }
  std::cout << "routing " << v1::RoutingPolicy_Name(config.policy())
            << ", local prefill up to "
            << config.local_prefill_max_uncached_tokens()
            << " uncached tokens\n";
  return 0;
}

int Generate() {
  if (absl::GetFlag(FLAGS_prompt).empty()) {
    std::cerr << "usage: pdctl generate --prompt=TEXT\n";
    return 2;
  }
  v1::GenerateRequest request;
  if (absl::GetFlag(FLAGS_chat)) {
    v1::ChatMessage* m = request.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(absl::GetFlag(FLAGS_prompt));
  } else {
    request.set_text(absl::GetFlag(FLAGS_prompt));
  }
  request.mutable_sampling()->set_temperature(absl::GetFlag(FLAGS_temperature));
  request.mutable_sampling()->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  request.mutable_stream_options()->set_include_usage(true);
  request.mutable_stream_options()->set_include_timing(true);
  v1::GenerateResponse last;
  const absl::Time start = absl::Now();
  absl::Time first_token;
  const absl::Status status = StreamGenerate(
      absl::GetFlag(FLAGS_grpc), request,
      absl::Seconds(absl::GetFlag(FLAGS_timeout_s)),
      [&](const v1::GenerateResponse& chunk) {
        if (first_token == absl::Time() && chunk.token_ids_size() > 0) {
          first_token = absl::Now();
        }
        std::cout << chunk.text() << std::flush;
        last = chunk;
      });
  std::cout << "\n";
  if (!status.ok()) return Fail(status);
  const v1::Timing& t = last.timing();
  std::cout << "\n[" << last.usage().prompt_tokens() << " prompt tokens ("
            << last.usage().cached_prompt_tokens() << " cached), "
            << last.usage().completion_tokens() << " generated, finish "
            << v1::FinishReason_Name(last.finish_reason()) << "]\n"
            << "[TTFT " << absl::StrFormat("%.1f", t.ttft_ms())
            << " ms at the router, "
            << absl::StrFormat("%.1f",
                               absl::ToDoubleMilliseconds(first_token - start))
            << " ms at the client; TPOT "
            << absl::StrFormat("%.1f", t.tpot_ms()) << " ms; prefill compute "
            << absl::StrFormat("%.1f", t.prefill_compute_ms())
            << " ms; KV transfer "
            << absl::StrFormat("%.1f", t.kv_transfer_ms()) << " ms, of it "
            << absl::StrFormat("%.1f", t.kv_transfer_tail_ms())
            << " ms after the compute; prefill on "
            << (t.prefill_worker_id().empty() ? std::string("the decode worker")
                                              : t.prefill_worker_id())
            << ", decode on " << t.decode_worker_id() << "]\n";
  return 0;
}

int Health(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: pdctl health ADDRESS\n";
    return 2;
  }
  const std::string address = args[2];
  if (const int wait_ms = absl::GetFlag(FLAGS_wait_ms); wait_ms > 0) {
    const absl::Status ready =
        rpc::WaitUntilServing(address, absl::Milliseconds(wait_ms));
    if (!ready.ok()) return Fail(ready);
  }
  absl::StatusOr<rpc::HealthStatus> health =
      rpc::CheckHealth(address, absl::GetFlag(FLAGS_service), kRpcTimeout);
  if (!health.ok()) return Fail(health.status());
  std::cout << rpc::HealthStatusName(*health) << "\n";
  return *health == rpc::HealthStatus::kServing ? 0 : 1;
}

// Rewrites the state file (cli/cluster_state.h) from the supervisor's
// records: whenever a process changes, and after every scale.
void WriteStateFile(LocalCluster& cluster, const Supervisor& supervisor) {
  ClusterState state;
  state.supervisor_pid = ::getpid();
  state.grpc = cluster.router_address();
  state.http = absl::StrCat(cluster.http_url(), "/v1");
  state.control = cluster.control_address();
  state.cluster_token_file = cluster.cluster_token_file();
  for (const LocalRouter& r : cluster.routers()) {
    state.routers.push_back({.name = r.name,
                             .grpc = r.address,
                             .http = absl::StrCat(r.http_url, "/v1"),
                             .control = r.control_address});
  }
  for (const SupervisedProcess& s : supervisor.processes()) {
    const LocalProcess* p = cluster.Find(s.name);
    state.processes.push_back({.name = p->name,
                               .address = p->address,
                               .pid = p->process->pid(),
                               .log_path = p->log_path,
                               .state = SupervisedStateName(s.state),
                               .restarts = s.restarts,
                               .last_exit = s.last_exit});
  }
  if (absl::Status written = WriteClusterState(WorkDir(), state);
      !written.ok()) {
    std::cerr << "pdctl: " << written << std::endl;
  }
}

RestartPolicy RestartPolicyFromFlags() {
  return {.initial_backoff =
              absl::Milliseconds(absl::GetFlag(FLAGS_restart_backoff_ms)),
          .max_backoff =
              absl::Milliseconds(absl::GetFlag(FLAGS_max_restart_backoff_ms)),
          .stable_uptime = absl::Seconds(absl::GetFlag(FLAGS_stable_uptime_s)),
          .crash_loop_limit = absl::GetFlag(FLAGS_crash_loop_restarts)};
}

// Runs the cluster until a termination signal, starting crashed processes
// again (cli/supervisor.h); writes the state file once ready and whenever a
// process changes. Returns the exit code.
int Supervise(const LocalClusterOptions& options) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  if (!cluster.ok()) return Fail(cluster.status());
  Supervisor supervisor(**cluster, RestartPolicyFromFlags(), absl::Now());
  WriteStateFile(**cluster, supervisor);
  if (const std::string ready = absl::GetFlag(FLAGS_ready_file);
      !ready.empty()) {
    std::ofstream(ready) << (*cluster)->router_address() << "\n";
  }
  std::cout << "cluster ready; router gRPC " << (*cluster)->router_address()
            << ", HTTP " << (*cluster)->http_url() << "/v1, control "
            << (*cluster)->control_address() << std::endl;
  auto tick = [&] {
    if (supervisor.Poll(absl::Now(), options.startup_timeout)) {
      WriteStateFile(**cluster, supervisor);
    }
  };
  while (!WaitForTerminationSignal(absl::Milliseconds(200)).has_value()) {
    tick();
    // pdctl scale's requests (cli/scale.h), one at a time; a termination
    // signal meanwhile waits for the scale to end.
    std::string id;
    if (std::optional<absl::StatusOr<ScaleRequest>> taken =
            TakeScaleRequest(options.work_dir, &id)) {
      std::cout << "scale request " << id << std::endl;
      const absl::StatusOr<std::string> result =
          taken->ok() ? ScaleLocalCluster(**cluster, supervisor, **taken,
                                          options.startup_timeout, tick)
                      : absl::StatusOr<std::string>(taken->status());
      WriteStateFile(**cluster, supervisor);
      std::cout << "scale " << id << ": "
                << (result.ok() ? *result : result.status().ToString())
                << std::endl;
      if (!id.empty()) WriteScaleResult(options.work_dir, id, result);
    }
  }
  std::cout << "stopping the cluster" << std::endl;
  const absl::Status stopped = (*cluster)->Stop(absl::Seconds(30));
  std::remove(StateFile().c_str());
  if (!stopped.ok()) return Fail(stopped);
  std::cout << "cluster stopped" << std::endl;
  return 0;
}

int Up() {
  LocalClusterOptions options;
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                        ? absl::StrCat(ExecutableDir(), "/..")
                        : absl::GetFlag(FLAGS_bin_dir);
  options.num_routers = absl::GetFlag(FLAGS_routers);
  options.num_prefill = absl::GetFlag(FLAGS_prefill);
  options.num_decode = absl::GetFlag(FLAGS_decode);
  options.num_colocated = absl::GetFlag(FLAGS_colocated);
  options.model_path = absl::GetFlag(FLAGS_model);
  options.router_listen = absl::GetFlag(FLAGS_router_listen);
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  options.control_listen = absl::GetFlag(FLAGS_control_listen);
  options.router_args = absl::GetFlag(FLAGS_router_args);
  options.worker_args = absl::GetFlag(FLAGS_worker_args);
  options.startup_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s));
  options.work_dir = WorkDir();
  if (const std::string token_file = rpc::ClusterTokenFileFromFlags();
      !token_file.empty()) {
    // Absolute: later pdctl commands read it from the state file.
    options.cluster_token_file = std::filesystem::absolute(token_file);
    if (absl::StatusOr<rpc::ClusterCredential> checked =
            rpc::ClusterCredential::FromFile(options.cluster_token_file);
        !checked.ok()) {
      return Fail(checked.status());
    }
  }
  std::error_code error;
  std::filesystem::create_directories(options.work_dir, error);
  if (error) {
    return Fail(absl::InternalError(absl::StrCat(
        "cannot create ", options.work_dir, ": ", error.message())));
  }
  if (std::ifstream(StateFile()).good()) {
    if (LiveSupervisor().has_value()) {
      return Fail(absl::AlreadyExistsError(
          absl::StrCat("a local cluster is already up (", StateFile(),
                       "); run pdctl down first")));
    }
    std::remove(StateFile().c_str());  // left by a supervisor that died
  }
  // Scale requests nobody took, and results nobody read, are stale.
  std::remove(ScaleRequestPath(options.work_dir).c_str());
  std::remove(ScaleResultPath(options.work_dir).c_str());
  std::cout << "starting " << options.num_routers << " router(s), "
            << options.num_prefill << " prefill, " << options.num_decode
            << " decode and " << options.num_colocated
            << " colocated workers (logs in " << options.work_dir << ")"
            << std::endl;
  if (absl::GetFlag(FLAGS_foreground)) return Supervise(options);

  // Background: a supervisor process owns the cluster (its processes never
  // outlive it); this one waits until it is ready, then returns.
  const std::string supervisor_log = options.work_dir + "/pdctl.log";
  const pid_t pid = ::fork();
  if (pid < 0) return Fail(absl::InternalError("fork failed"));
  if (pid == 0) {
    ::setsid();
    if (std::freopen(supervisor_log.c_str(), "w", stdout) == nullptr ||
        std::freopen(supervisor_log.c_str(), "a", stderr) == nullptr) {
      std::_Exit(1);
    }
    std::_Exit(Supervise(options));
  }
  const absl::Time give_up =
      absl::Now() + options.startup_timeout + absl::Seconds(10);
  while (absl::Now() < give_up) {
    if (absl::StatusOr<ClusterState> state = ReadClusterState(WorkDir());
        state.ok()) {
      std::cout << "  router gRPC     " << state->grpc << "\n"
                << "  router HTTP     " << state->http << "\n"
                << "  router control  " << state->control << "\n";
      for (const ClusterStateProcess& p : state->processes) {
        std::cout << "  " << p.name << " on " << p.address << " (pid " << p.pid
                  << ")\n";
      }
      std::cout << "cluster ready (supervisor pid " << pid
                << "); pdctl down stops it" << std::endl;
      return 0;
    }
    int wstatus = 0;
    if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
      std::cerr << "pdctl: the cluster failed to start; end of "
                << supervisor_log << ":\n"
                << TailOfFile(supervisor_log) << std::endl;
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ::kill(pid, SIGTERM);
  return Fail(absl::DeadlineExceededError(
      absl::StrCat("the cluster did not become ready; see ", supervisor_log)));
}

// pdctl profile's work folder: --work_dir, else "profile" beside the local
// cluster's (so a profile never writes over a running cluster's logs).
std::string ProfileWorkDir() {
  if (!absl::GetFlag(FLAGS_work_dir).empty()) {
    return absl::GetFlag(FLAGS_work_dir);
  }
  return std::filesystem::path(WorkDir()).parent_path() / "profile";
}

int Profile() {
  ProfileOptions options;
  options.cluster.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                                ? absl::StrCat(ExecutableDir(), "/..")
                                : absl::GetFlag(FLAGS_bin_dir);
  options.cluster.model_path = absl::GetFlag(FLAGS_model);
  options.cluster.router_args = absl::GetFlag(FLAGS_router_args);
  options.cluster.worker_args = absl::GetFlag(FLAGS_worker_args);
  options.cluster.pool_args["prefill"] =
      absl::GetFlag(FLAGS_prefill_worker_args);
  options.cluster.pool_args["decode"] = absl::GetFlag(FLAGS_decode_worker_args);
  options.cluster.startup_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s));
  options.cluster.work_dir = ProfileWorkDir();
  if (const std::string token_file = rpc::ClusterTokenFileFromFlags();
      !token_file.empty()) {
    options.cluster.cluster_token_file = std::filesystem::absolute(token_file);
  }
  for (auto [flag, value, grid] :
       {std::tuple{"prompt_lengths", absl::GetFlag(FLAGS_prompt_lengths),
                   &options.prompt_lengths},
        std::tuple{"batch_sizes", absl::GetFlag(FLAGS_batch_sizes),
                   &options.batch_sizes},
        std::tuple{"context_lengths", absl::GetFlag(FLAGS_context_lengths),
                   &options.context_lengths}}) {
    absl::StatusOr<std::vector<int>> parsed = ParseGrid(flag, value);
    if (!parsed.ok()) {
      std::cerr << "pdctl: " << parsed.status().message() << "\n";
      return 2;
    }
    *grid = *std::move(parsed);
  }
  options.lone_runs = absl::GetFlag(FLAGS_lone_runs);
  options.burst = absl::GetFlag(FLAGS_burst);
  options.decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  if (options.lone_runs < 1 || options.burst < 2 || options.decode_tokens < 2) {
    std::cerr << "pdctl: profile needs --lone_runs >= 1, --burst >= 2 and "
                 "--decode_tokens >= 2\n";
    return 2;
  }
  options.cost_unit = absl::GetFlag(FLAGS_cost_unit);
  options.request_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.interrupted = [] {
    return WaitForTerminationSignal(absl::ZeroDuration()).has_value();
  };
  std::error_code error;
  std::filesystem::create_directories(options.cluster.work_dir, error);
  if (error) {
    return Fail(absl::InternalError(absl::StrCat(
        "cannot create ", options.cluster.work_dir, ": ", error.message())));
  }
  absl::StatusOr<ProfileResult> result = RunProfile(options, std::cerr);
  if (!result.ok()) return Fail(result.status());
  absl::StatusOr<std::string> json = ValidatedProfileJson(*result);
  if (!json.ok()) return Fail(json.status());
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cout << *json << std::flush;
    return 0;
  }
  std::ofstream file(out);
  file << *json;
  file.close();
  if (!file) {
    return Fail(absl::InternalError(absl::StrCat("cannot write ", out)));
  }
  std::cerr << "wrote " << out << std::endl;
  return 0;
}

int Down() {
  const std::optional<pid_t> supervisor = LiveSupervisor();
  if (!supervisor.has_value()) {
    const bool stale = std::ifstream(StateFile()).good();
    std::remove(StateFile().c_str());
    std::cout << (stale ? "the cluster's supervisor was already gone ("
                        : "no local cluster is up (")
              << StateFile() << ")\n";
    return 0;
  }
  const pid_t pid = *supervisor;
  if (::kill(pid, SIGTERM) != 0) {
    std::remove(StateFile().c_str());
    std::cout << "the cluster's supervisor (pid " << pid
              << ") was already gone\n";
    return 0;
  }
  std::cout << "stopping the local cluster (supervisor pid " << pid << ")"
            << std::flush;
  const absl::Time give_up = absl::Now() + absl::Seconds(90);
  while (Running(pid) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (Running(pid)) {
    std::cout << std::endl;
    return Fail(absl::DeadlineExceededError(
        "the cluster did not stop within 90 s; see its logs"));
  }
  std::cout << "; stopped" << std::endl;
  return 0;
}

// pdctl plan: the planner process (autoscaler/planner_process.h) on this
// pdctl's router and local cluster.
int Plan() {
  // Every router's /metrics: each counts only the requests it served.
  std::string router_http = absl::GetFlag(FLAGS_router_http);
  if (router_http.empty() && LiveSupervisor().has_value()) {
    if (absl::StatusOr<ClusterState> state = ReadClusterState(WorkDir());
        state.ok() && !state->http.empty()) {
      router_http = absl::StrJoin(state->RouterHttpAddresses(), ",");
    }
  }
  if (router_http.empty()) router_http = "127.0.0.1:8000";
  return autoscaler::RunPlannerProcess(
      {.router_control = RouterControl(),
       .router_http = router_http,
       .scaler = "local",
       .local = {.work_dir = WorkDir(),
                 .drain_deadline =
                     absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms)),
                 .startup_timeout =
                     absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s))},
       .metrics_listen = "",
       .port_file = "",
       .once = absl::GetFlag(FLAGS_once),
       .cluster_token_file = TokenFile()});
}

}  // namespace
}  // namespace pdserve::cli

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "pdctl COMMAND [flags]\n"
      "  up                 start a local cluster (background; --foreground)\n"
      "  down               stop the local cluster\n"
      "  status             pools and workers\n"
      "  top                live view of pools and workers from /metrics\n"
      "  drain WORKER_ID    stop sending work to a worker and let it exit\n"
      "  scale POOL N       resize a pool of the local cluster (prefill,\n"
      "                     decode, colocated); no request is dropped\n"
      "  plan --profile=F   the SLO planner: --once for one advisory\n"
      "                     decision, else it resizes the local cluster\n"
      "  policy [NAME]      show or set the routing policy\n"
      "  generate           stream an answer through the router\n"
      "  health ADDRESS     grpc.health.v1 check (exit 0 when SERVING)\n"
      "  bench              load generator: TTFT, TPOT, goodput (--target)\n"
      "  profile            measure one prefill and one decode worker into\n"
      "                     the planner's capacity profile (--out)");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::cerr << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string command = args[1];
  if (command == "up") return pdserve::cli::Up();
  if (command == "down") return pdserve::cli::Down();
  if (command == "status") return pdserve::cli::Status();
  if (command == "top") return pdserve::cli::Top();
  if (command == "drain") return pdserve::cli::Drain(args);
  if (command == "scale") return pdserve::cli::Scale(args);
  if (command == "plan") return pdserve::cli::Plan();
  if (command == "policy") return pdserve::cli::Policy(args);
  if (command == "generate") return pdserve::cli::Generate();
  if (command == "health") return pdserve::cli::Health(args);
  if (command == "bench") return pdserve::cli::Bench();
  if (command == "profile") return pdserve::cli::Profile();
  std::cerr << "pdctl: unknown command '" << command << "'\n"
            << absl::ProgramUsageMessage() << "\n";
  return 2;
}
