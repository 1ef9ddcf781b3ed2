// A real local cluster (pd-router, pd-prefill-worker, pd-decode-worker as
// separate processes on loopback): health, reflection, membership, drain,
// lease expiry after a crash, re-registration after a router restart, and
// pdctl against it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/health_client.h"
#include "tests/cluster_testing.h"
#include "tests/reflection_subset.grpc.pb.h"

namespace pdserve {
namespace {

using ::testing::IsSupersetOf;
using ::testing::UnorderedElementsAre;

using testing::BinDir;
using testing::MakeWorkDir;

class ClusterTest : public ::testing::Test {
 protected:
  void StartCluster(const std::string& name) {
    options_.bin_dir = BinDir();
    options_.work_dir = MakeWorkDir(name);
    options_.model_path = testing::TinyModelPath();
    options_.worker_args = testing::SmallWorkerArgs();
    // Short leases so crash detection is quick to observe.
    options_.lease = absl::Milliseconds(1200);
    options_.heartbeat = absl::Milliseconds(200);
    absl::StatusOr<std::unique_ptr<cli::LocalCluster>> cluster =
        cli::LocalCluster::Start(options_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  // Worker ids the router lists now.
  std::vector<std::string> ListedWorkers() {
    absl::StatusOr<v1::ListWorkersResponse> listed =
        cli::ListWorkers(cluster_->control_address(),
                         v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5));
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::vector<std::string> ids;
    if (listed.ok()) {
      for (const auto& w : listed->workers()) ids.push_back(w.worker_id());
    }
    return ids;
  }

  // Polls until the router lists exactly `expected` (sorted) or `timeout`.
  bool WaitForWorkers(const std::vector<std::string>& expected,
                      absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      if (ListedWorkers() == expected) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  cli::LocalClusterOptions options_;
  std::unique_ptr<cli::LocalCluster> cluster_;
};

std::vector<std::string> ListServices(const std::string& address) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("*");
  std::vector<std::string> names;
  if (!stream->Write(request)) return names;
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  while (stream->Read(&response)) {
    for (const auto& s : response.list_services_response().service()) {
      names.push_back(s.name());
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
  return names;
}

TEST_F(ClusterTest, EveryProcessIsHealthyAndTheRouterListsTheWorkers) {
  StartCluster("healthy");
  ASSERT_EQ(cluster_->processes().size(), 3u);
  for (const cli::LocalProcess& p : cluster_->processes()) {
    absl::StatusOr<rpc::HealthStatus> health =
        rpc::CheckHealth(p.address, "", absl::Seconds(5));
    ASSERT_TRUE(health.ok()) << p.name << ": " << health.status();
    EXPECT_EQ(*health, rpc::HealthStatus::kServing) << p.name;
  }

  absl::StatusOr<v1::ListWorkersResponse> listed =
      cli::ListWorkers(cluster_->control_address(), v1::WORKER_ROLE_UNSPECIFIED,
                       absl::Seconds(5));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->workers_size(), 2);
  const v1::WorkerInfo& prefill = listed->workers(0);  // By role, then id.
  const v1::WorkerInfo& decode = listed->workers(1);
  EXPECT_EQ(decode.worker_id(), "decode-0");
  EXPECT_EQ(decode.role(), v1::WORKER_ROLE_DECODE);
  EXPECT_EQ(decode.grpc_address(), cluster_->Find("decode-0")->address);
  EXPECT_EQ(decode.state(), v1::WORKER_STATE_SERVING);
  EXPECT_EQ(prefill.worker_id(), "prefill-0");
  EXPECT_EQ(prefill.role(), v1::WORKER_ROLE_PREFILL);
  EXPECT_EQ(prefill.state(), v1::WORKER_STATE_SERVING);
  EXPECT_GT(prefill.lease_remaining_ms(), 0u);

  // Filtering by role.
  listed = cli::ListWorkers(cluster_->control_address(),
                            v1::WORKER_ROLE_PREFILL, absl::Seconds(5));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->workers_size(), 1);
  EXPECT_EQ(listed->workers(0).worker_id(), "prefill-0");

  // Reflection lets grpcurl-style tools discover the router's API.
  EXPECT_THAT(ListServices(cluster_->control_address()),
              IsSupersetOf({"pdserve.v1.Membership", "pdserve.v1.Admin",
                            "grpc.health.v1.Health"}));
  // The client API is on its own port, without the control services.
  const std::vector<std::string> client_services =
      ListServices(cluster_->router_address());
  EXPECT_THAT(client_services, ::testing::Contains("pdserve.v1.Generation"));
  EXPECT_THAT(client_services,
              ::testing::Not(::testing::Contains("pdserve.v1.Admin")));

  // Every process exits with code 0 on SIGTERM.
  EXPECT_TRUE(cluster_->Stop(absl::Seconds(10)).ok());
}

TEST_F(ClusterTest, DrainedWorkerDeregistersAndExitsCleanly) {
  StartCluster("drain");
  cli::LocalProcess* decode = cluster_->Find("decode-0");
  absl::StatusOr<v1::DrainWorkerResponse> drained =
      cli::DrainWorker(cluster_->control_address(), "decode-0",
                       absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(drained.ok()) << drained.status();
  // The command travels with the next heartbeat (200 ms); the idle worker
  // then deregisters and exits at once.
  absl::StatusOr<int> status = decode->process->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, 0) << DescribeWaitStatus(*status);
  EXPECT_EQ(ListedWorkers(), std::vector<std::string>{"prefill-0"});
  EXPECT_FALSE(rpc::CheckHealth(decode->address, "", absl::Seconds(1)).ok());

  // Draining an unknown worker is a clear NOT_FOUND.
  drained = cli::DrainWorker(cluster_->control_address(), "decode-9",
                             absl::Seconds(1), absl::Seconds(5));
  EXPECT_EQ(drained.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterTest, CrashedWorkerIsDroppedWhenItsLeaseRunsOut) {
  StartCluster("crash");
  cli::LocalProcess* prefill = cluster_->Find("prefill-0");
  const absl::Time killed_at = absl::Now();
  prefill->process->Signal(SIGKILL);
  ASSERT_TRUE(prefill->process->Wait(absl::Seconds(5)).ok());
  // Gone within lease (1.2 s) plus a sweep; the decode worker stays.
  EXPECT_TRUE(WaitForWorkers({"decode-0"}, absl::Seconds(5)))
      << "still listed after " << absl::Now() - killed_at;
  const absl::Duration detection = absl::Now() - killed_at;
  EXPECT_GE(detection, absl::Milliseconds(900));  // Not before the lease.
  EXPECT_THAT(ListedWorkers(), UnorderedElementsAre("decode-0"));
}

TEST_F(ClusterTest, WorkersRegisterAgainWithARestartedRouter) {
  StartCluster("router-restart");
  // A new router takes over the old one's address, as a restarted pod would.
  cli::LocalProcess* router = cluster_->Find("router");
  const std::string address = router->address;
  const std::string control = cluster_->control_address();
  router->process->Signal(SIGKILL);
  ASSERT_TRUE(router->process->Wait(absl::Seconds(5)).ok());

  SubprocessOptions restart;
  restart.argv = {absl::StrCat(BinDir(), "/router/pd-router"),
                  absl::StrCat("--listen=", address),
                  absl::StrCat("--control_listen=", control),
                  "--http_listen=",
                  absl::StrCat("--model=", testing::TinyModelPath()),
                  "--lease_ms=1200",
                  "--heartbeat_ms=200"};
  restart.log_path = absl::StrCat(options_.work_dir, "/router-2.log");
  absl::StatusOr<std::unique_ptr<Subprocess>> new_router =
      Subprocess::Start(restart);
  ASSERT_TRUE(new_router.ok()) << new_router.status();
  router->process = std::move(new_router).value();  // Cluster cleans it up.
  ASSERT_TRUE(rpc::WaitUntilServing(address, absl::Seconds(10)).ok())
      << cli::TailOfFile(restart.log_path);
  // The new router knows nobody; heartbeats get NOT_FOUND and the workers
  // register again.
  EXPECT_TRUE(WaitForWorkers({"prefill-0", "decode-0"}, absl::Seconds(10)))
      << cli::TailOfFile(restart.log_path);
}

// Runs pdctl with `args`; returns its exit code and combined output.
std::pair<int, std::string> RunPdctl(const std::vector<std::string>& args,
                                     const std::string& work_dir) {
  SubprocessOptions options;
  options.argv = {absl::StrCat(BinDir(), "/cli/pdctl")};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.log_path = absl::StrCat(work_dir, "/pdctl-", ::getpid(), "-",
                                  absl::ToUnixNanos(absl::Now()), ".log");
  absl::StatusOr<std::unique_ptr<Subprocess>> pdctl =
      Subprocess::Start(options);
  EXPECT_TRUE(pdctl.ok()) << pdctl.status();
  if (!pdctl.ok()) return {-1, ""};
  absl::StatusOr<int> status = (*pdctl)->Wait(absl::Seconds(90));
  EXPECT_TRUE(status.ok()) << status.status();
  if (!status.ok()) return {-1, ""};
  return {WIFEXITED(*status) ? WEXITSTATUS(*status) : -1,
          cli::TailOfFile(options.log_path, 100000)};
}

TEST_F(ClusterTest, PdctlReportsHealthStatusAndDrains) {
  StartCluster("pdctl");
  const std::string router = cluster_->control_address();
  const std::string dir = options_.work_dir;

  auto [code, out] = RunPdctl({"health", router}, dir);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, "SERVING\n");

  std::tie(code, out) = RunPdctl({"status", "--router=" + router}, dir);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("pool prefill   1 serving"));
  EXPECT_THAT(out, ::testing::HasSubstr("pool decode    1 serving"));
  EXPECT_THAT(out, ::testing::ContainsRegex("prefill-0 +prefill +SERVING"));
  EXPECT_THAT(out, ::testing::ContainsRegex("decode-0 +decode +SERVING"));

  std::tie(code, out) =
      RunPdctl({"drain", "prefill-0", "--router=" + router}, dir);
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(WaitForWorkers({"decode-0"}, absl::Seconds(10)));

  std::tie(code, out) = RunPdctl({"health", "127.0.0.1:1"}, dir);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("127.0.0.1:1"));

  std::tie(code, out) = RunPdctl({"frobnicate"}, dir);
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("unknown command"));
}

// `pdctl up` returns once the cluster is ready and leaves it running in the
// background; `pdctl generate` streams an answer through it; `pdctl down`
// stops every process.
TEST(PdctlTest, UpGenerateDown) {
  const std::string dir = MakeWorkDir("pdctl-up");
  auto [code, out] = RunPdctl(
      {"up", "--work_dir=" + dir, "--bin_dir=" + BinDir(),
       "--model=" + testing::TinyModelPath(), "--router_listen=127.0.0.1:0",
       "--http_listen=127.0.0.1:0", "--control_listen=127.0.0.1:0",
       "--worker_args=--threads=1,--kv_cache_mb=16"},
      dir);
  // Whatever fails below, the background cluster goes away with the test.
  struct Down {
    std::string dir;
    ~Down() { RunPdctl({"down", "--work_dir=" + dir}, dir); }
  } down{dir};
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("cluster ready"));
  // The state file names the endpoints and every process.
  std::ifstream state(dir + "/cluster.state");
  std::string line, grpc;
  std::vector<pid_t> pids;
  while (std::getline(state, line)) {
    std::istringstream fields(line);
    std::string key, address;
    fields >> key >> address;
    if (key == "grpc") grpc = address;
    pid_t pid = 0;
    if (key == "process" && fields >> pid) pids.push_back(pid);
  }
  ASSERT_FALSE(grpc.empty());
  EXPECT_EQ(pids.size(), 3u);  // router, prefill-0, decode-0

  std::tie(code, out) = RunPdctl(
      {"generate", "--grpc=" + grpc, "--prompt=hello", "--max_tokens=4"}, dir);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("TTFT"));
  EXPECT_THAT(out, ::testing::HasSubstr("prefill on prefill-0"));

  // A second cluster in the same folder is refused, the first one untouched.
  std::tie(code, out) =
      RunPdctl({"up", "--work_dir=" + dir, "--bin_dir=" + BinDir()}, dir);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("already up"));

  std::tie(code, out) = RunPdctl({"down", "--work_dir=" + dir}, dir);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("stopped"));
  for (pid_t pid : pids) {
    EXPECT_NE(::kill(pid, 0), 0) << "process " << pid << " still runs";
  }
  std::tie(code, out) = RunPdctl({"down", "--work_dir=" + dir}, dir);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("no local cluster"));
}

TEST(LocalClusterTest, MissingBinariesAreAClearError) {
  cli::LocalClusterOptions options;
  options.bin_dir = "/nonexistent";
  options.work_dir = MakeWorkDir("missing");
  absl::StatusOr<std::unique_ptr<cli::LocalCluster>> cluster =
      cli::LocalCluster::Start(options);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(cluster.status().message()),
              ::testing::HasSubstr("pd-router"));
}

TEST(LocalClusterTest, TakenRouterPortFailsStartWithTheRouterLog) {
  // Occupy a port with a first cluster's router, then ask a second cluster
  // for the same one.
  cli::LocalClusterOptions first;
  first.bin_dir = BinDir();
  first.num_prefill = 0;
  first.num_decode = 0;
  first.work_dir = MakeWorkDir("taken-1");
  first.model_path = testing::TinyModelPath();
  auto occupant = cli::LocalCluster::Start(first);
  ASSERT_TRUE(occupant.ok()) << occupant.status();

  cli::LocalClusterOptions second = first;
  second.router_listen = (*occupant)->router_address();
  second.work_dir = MakeWorkDir("taken-2");
  auto cluster = cli::LocalCluster::Start(second);
  ASSERT_FALSE(cluster.ok());
  EXPECT_THAT(std::string(cluster.status().message()),
              ::testing::HasSubstr("address in use"));
}

}  // namespace
}  // namespace pdserve
