#include "common/subprocess.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::unique_ptr<Subprocess> StartShell(const std::string& script,
                                       const std::string& log_path = "") {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.extra_env = {"PD_SUBPROCESS_TEST=hello", "HOME=/pd-test-home"};
  options.log_path = log_path;
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  return std::move(process).value();
}

TEST(SubprocessTest, ReportsExitCode) {
  auto process = StartShell("exit 3");
  absl::StatusOr<int> status = process->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
  EXPECT_EQ(DescribeWaitStatus(*status), "exited with code 3");
  EXPECT_FALSE(process->running());
}

TEST(SubprocessTest, WaitTimesOutWhileRunningThenStopTerminates) {
  auto process = StartShell("exec sleep 30");
  EXPECT_EQ(process->Wait(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(process->running());
  const int status = process->Stop(absl::Seconds(5));
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

TEST(SubprocessTest, StopEscalatesToKillWhenTermIsIgnored) {
  const std::string log = ::testing::TempDir() + "/ignore_term.log";
  auto process =
      StartShell("trap '' TERM; echo ready; while :; do sleep 0.05; done", log);
  // Wait until the trap is installed before signalling.
  for (int i = 0; i < 200; ++i) {
    std::ifstream in(log);
    std::string line;
    if (std::getline(in, line) && line == "ready") break;
    usleep(10000);
  }
  const int status = process->Stop(absl::Milliseconds(200));
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST(SubprocessTest, PinsTheChildToTheGivenCpus) {
  cpu_set_t mine;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(mine), &mine), 0);
  int last = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mine)) last = cpu;
  }
  ASSERT_GE(last, 0);
  const std::string log = ::testing::TempDir() + "/affinity.log";
  std::remove(log.c_str());
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"};
  options.log_path = log;
  options.cpus = {last};
  auto process = Subprocess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->Wait(absl::Seconds(10)).ok());
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "Cpus_allowed_list:\t" + std::to_string(last));

  options.cpus = {-1};
  EXPECT_EQ(Subprocess::Start(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, KillsTheWholeProcessGroupOnDestruction) {
  const std::string log = ::testing::TempDir() + "/grandchild.log";
  std::remove(log.c_str());
  pid_t grandchild = 0;
  {
    auto process = StartShell("sleep 30 & echo $!; wait", log);
    for (int i = 0; i < 200 && grandchild == 0; ++i) {
      std::ifstream in(log);
      in >> grandchild;
      if (grandchild == 0) usleep(10000);
    }
    ASSERT_GT(grandchild, 0);
    EXPECT_EQ(::kill(grandchild, 0), 0);
  }
  // The grandchild was reparented and may linger as a zombie until init
  // reaps it; it must at least no longer be running.
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string content((std::istreambuf_iterator<char>(stat)), {});
    gone = content.empty() || content.find(") Z ") != std::string::npos;
    if (!gone) usleep(10000);
  }
  EXPECT_TRUE(gone) << "grandchild " << grandchild << " survived";
}

TEST(SubprocessTest, PassesEnvironmentAndCapturesOutput) {
  const std::string log = ::testing::TempDir() + "/env.log";
  std::remove(log.c_str());
  auto process =
      StartShell("echo out=$PD_SUBPROCESS_TEST home=$HOME; echo err >&2", log);
  ASSERT_TRUE(process->Wait(absl::Seconds(10)).ok());
  std::ifstream in(log);
  std::stringstream content;
  content << in.rdbuf();
  // HOME is inherited too, but extra_env replaces it.
  EXPECT_EQ(content.str(), "out=hello home=/pd-test-home\nerr\n");
}

TEST(SubprocessTest, MissingProgramIsAClearError) {
  SubprocessOptions options;
  options.argv = {"/nonexistent/pd-router"};
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Start(options);
  EXPECT_EQ(process.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(process.status().message().find("/nonexistent/pd-router"),
            std::string::npos);
}

}  // namespace
}  // namespace pdserve
