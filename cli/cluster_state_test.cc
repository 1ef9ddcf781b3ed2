#include "cli/cluster_state.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace pdserve::cli {
namespace {

TEST(ClusterStateTest, RoundTripsAndCountsPoolMembers) {
  ClusterState state;
  state.supervisor_pid = 4242;
  state.grpc = "127.0.0.1:50050";
  state.http = "http://127.0.0.1:8000/v1";
  state.control = "127.0.0.1:50051";
  auto process = [](std::string name, std::string s) {
    return ClusterStateProcess{.name = name,
                               .address = "127.0.0.1:1",
                               .pid = 7,
                               .log_path = "/tmp/" + name + ".log",
                               .state = s,
                               .restarts = 0,
                               .last_exit = "-"};
  };
  state.routers = {{.name = "router",
                    .grpc = state.grpc,
                    .http = state.http,
                    .control = state.control},
                   {.name = "router-1",
                    .grpc = "127.0.0.1:3",
                    .http = "http://127.0.0.1:4/v1",
                    .control = "127.0.0.1:5"}};
  state.processes = {
      process("router", "running"),       process("router-1", "running"),
      process("prefill-0", "running"),    process("decode-0", "running"),
      process("decode-1", "backing-off"), process("decode-2", "leaving"),
      process("prefill-1", "left")};
  state.processes[4].last_exit = "killed by signal 9 (Killed)";
  absl::StatusOr<ClusterState> parsed =
      ParseClusterState(FormatClusterState(state));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->supervisor_pid, 4242);
  EXPECT_EQ(parsed->HttpAddress(), "127.0.0.1:8000");
  EXPECT_EQ(parsed->control, "127.0.0.1:50051");
  ASSERT_EQ(parsed->routers.size(), 2u);
  EXPECT_EQ(parsed->routers[1].name, "router-1");
  EXPECT_EQ(parsed->routers[1].grpc, "127.0.0.1:3");
  EXPECT_EQ(parsed->routers[1].http, "http://127.0.0.1:4/v1");
  EXPECT_EQ(parsed->routers[1].control, "127.0.0.1:5");
  ASSERT_EQ(parsed->processes.size(), 7u);
  EXPECT_EQ(parsed->processes[4].last_exit, "killed by signal 9 (Killed)");
  EXPECT_EQ(parsed->processes[4].state, "backing-off");
  // Backing off still counts; leaving and left do not; the routers are no
  // pool's.
  const std::map<std::string, int> want = {
      {"prefill", 1}, {"decode", 2}, {"colocated", 0}};
  EXPECT_EQ(parsed->PoolSizes(), want);
}

TEST(ClusterStateTest, RecordsTheTokenFileOnlyWhenSet) {
  ClusterState state;
  state.supervisor_pid = 42;
  state.control = "127.0.0.1:50051";
  EXPECT_EQ(FormatClusterState(state).find("token_file"), std::string::npos);
  state.cluster_token_file = "/secrets/pdserve/token";
  absl::StatusOr<ClusterState> parsed =
      ParseClusterState(FormatClusterState(state));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->cluster_token_file, "/secrets/pdserve/token");
  EXPECT_EQ(parsed->control, "127.0.0.1:50051");
}

TEST(ClusterStateTest, FirstLiveRouterControlSkipsDeadRouters) {
  ClusterState state;
  state.routers = {
      {.name = "router", .grpc = "", .http = "", .control = "a:1"},
      {.name = "router-1", .grpc = "", .http = "", .control = "b:2"},
      {.name = "router-2", .grpc = "", .http = "", .control = "c:3"}};
  EXPECT_EQ(
      FirstLiveRouterControl(state, [](const std::string&) { return true; }),
      "a:1");
  EXPECT_EQ(FirstLiveRouterControl(
                state, [](const std::string& c) { return c != "a:1"; }),
            "b:2");
  EXPECT_EQ(
      FirstLiveRouterControl(state, [](const std::string&) { return false; }),
      "");
}

TEST(ClusterStateTest, RefusesMalformedLinesAndMissingFiles) {
  EXPECT_FALSE(ParseClusterState("pid x\n").ok());
  EXPECT_FALSE(ParseClusterState("process a b c\n").ok());
  EXPECT_FALSE(ParseClusterState("router a b c\n").ok());
  absl::StatusOr<ClusterState> bad = ParseClusterState(
      "pid 1\nprocess decode-0 addr NOTPID log running 0 -\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos)
      << bad.status();
  // Unknown keys are skipped.
  EXPECT_TRUE(ParseClusterState("pid 1\nfuture thing\n").ok());
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<ClusterState> missing =
      ReadClusterState(dir + "/no-such-cluster");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(LiveSupervisor(dir + "/no-such-cluster").has_value());
}

TEST(ClusterStateTest, LiveSupervisorRefusesAPidThatIsNotPdctl) {
  // This test binary is alive but is not a pdctl: a stale state file whose
  // pid was reused must not be taken for the supervisor.
  const std::string dir = ::testing::TempDir();
  ClusterState state;
  state.supervisor_pid = ::getpid();
  ASSERT_TRUE(WriteClusterState(dir, state).ok());
  EXPECT_FALSE(LiveSupervisor(dir).has_value());
}

}  // namespace
}  // namespace pdserve::cli
