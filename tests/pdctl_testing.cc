#include "tests/pdctl_testing.h"

#include <sys/wait.h>

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/cluster_state.h"
#include "cli/local_cluster.h"
#include "tests/cluster_testing.h"

namespace pdserve::testing {

void PdctlClusterTest::SetUp() {
  work_dir_ = MakeWorkDir(
      ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

void PdctlClusterTest::TearDown() {
  if (pdctl_ != nullptr && pdctl_->running()) pdctl_->Stop(absl::Seconds(30));
}

int PdctlClusterTest::Pdctl(std::vector<std::string> args, std::string* output,
                            absl::Duration timeout) {
  std::string log;
  {
    absl::MutexLock lock(&mu_);
    log = absl::StrCat(work_dir_, "/pdctl-", ++runs_, ".out");
  }
  SubprocessOptions options;
  options.argv = {absl::StrCat(BinDir(), "/cli/pdctl")};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.argv.push_back(absl::StrCat("--work_dir=", work_dir_));
  options.log_path = log;
  auto process = Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return -1;
  const absl::StatusOr<int> status = (*process)->Wait(timeout);
  if (output != nullptr) *output = cli::TailOfFile(log, 1 << 16);
  EXPECT_TRUE(status.ok()) << "pdctl " << absl::StrJoin(args, " ")
                           << " did not finish";
  return status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

void PdctlClusterTest::Up(const std::vector<std::string>& extra_args,
                          const std::string& model) {
  SubprocessOptions options;
  options.argv = {
      absl::StrCat(BinDir(), "/cli/pdctl"),
      "up",
      "--foreground",
      absl::StrCat("--work_dir=", work_dir_),
      absl::StrCat("--bin_dir=", BinDir()),
      absl::StrCat("--model=", model.empty() ? SlowTinyModelPath() : model),
      "--router_listen=127.0.0.1:0",
      "--http_listen=127.0.0.1:0",
      "--control_listen=127.0.0.1:0",
      absl::StrCat("--worker_args=", absl::StrJoin(SmallWorkerArgs(), ",")),
      "--startup_timeout_s=60",
      absl::StrCat("--ready_file=", work_dir_, "/ready")};
  options.argv.insert(options.argv.end(), extra_args.begin(), extra_args.end());
  options.log_path = absl::StrCat(work_dir_, "/supervisor.log");
  auto process = Subprocess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  pdctl_ = std::move(*process);
  const absl::Time give_up = absl::Now() + absl::Seconds(90);
  while (!std::ifstream(absl::StrCat(work_dir_, "/ready")).good()) {
    ASSERT_TRUE(pdctl_->running())
        << cli::TailOfFile(absl::StrCat(work_dir_, "/supervisor.log"));
    ASSERT_LT(absl::Now(), give_up) << "pdctl up did not become ready";
    absl::SleepFor(absl::Milliseconds(50));
  }
  ReadState();
}

std::map<std::string, ProcessState> PdctlClusterTest::ReadState() {
  std::map<std::string, ProcessState> processes;
  absl::StatusOr<cli::ClusterState> state = cli::ReadClusterState(work_dir_);
  EXPECT_TRUE(state.ok()) << state.status();
  if (!state.ok()) return processes;
  grpc_ = state->grpc;
  control_ = state->control;
  http_ = state->HttpAddress();
  for (const cli::ClusterStateProcess& p : state->processes) {
    processes[p.name] = {.pid = p.pid,
                         .state = p.state,
                         .restarts = p.restarts,
                         .last_exit = p.last_exit};
  }
  return processes;
}

}  // namespace pdserve::testing
