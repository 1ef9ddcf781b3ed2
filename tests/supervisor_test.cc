// pdctl's supervisor against real processes: a `pdctl up` cluster (2
// prefill, 2 decode workers) keeps serving when a worker is killed, starts
// the worker again, gives it work, reports a process that keeps crashing
// instead of restarting it forever, and stops cleanly on `pdctl down`.
//
// pdctl runs with --foreground as this test's child, so that nothing it
// started outlives the test (common/subprocess.h); `pdctl down` stops a
// foreground supervisor the same way as a background one.
#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/pdctl_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using testing::Outcome;
using testing::ProcessState;

class SupervisorTest : public testing::PdctlClusterTest {
 protected:
  void SetUp() override {
    PdctlClusterTest::SetUp();
    offline_ =
        std::make_unique<testing::OfflineEngine>(testing::SlowTinyModelPath());
  }

  // `pdctl up --foreground` with 2 + 2 workers and quick restarts.
  void Up() {
    PdctlClusterTest::Up({"--prefill=2", "--decode=2",
                          "--router_args=--lease_ms=1500,--heartbeat_ms=200",
                          "--restart_backoff_ms=200",
                          "--crash_loop_restarts=3"});
  }

  // Waits until `name`'s state line satisfies `done`; the last one read.
  ProcessState AwaitState(const std::string& name,
                          const std::function<bool(const ProcessState&)>& done,
                          absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    ProcessState last;
    while (absl::Now() < give_up) {
      last = ReadState()[name];
      if (done(last)) return last;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << name
                  << " never reached the state awaited; last: " << last.state
                  << " pid " << last.pid << " restarts " << last.restarts
                  << " (" << last.last_exit << ")";
    return last;
  }

  bool RouterListsServing(const std::string& name) {
    auto workers = cli::ListWorkers(control_, v1::WORKER_ROLE_UNSPECIFIED,
                                    absl::Seconds(2));
    if (!workers.ok()) return false;
    for (const v1::WorkerInfo& w : workers->workers()) {
      if (w.worker_id() == name && w.state() == v1::WORKER_STATE_SERVING) {
        return true;
      }
    }
    return false;
  }

  std::vector<v1::GenerateRequest> Requests(int n, int salt, int max_tokens) {
    std::vector<v1::GenerateRequest> requests;
    for (int i = 0; i < n; ++i) {
      requests.push_back(testing::TokenRequest(
          40 + i, salt + i, max_tokens, offline_->model().config().vocab_size));
    }
    return requests;
  }

  // Sends every request at once, each from its own thread; `tokens` counts
  // the tokens received by all of them.
  std::vector<Outcome> SendAll(const std::vector<v1::GenerateRequest>& requests,
                               std::atomic<int>* tokens = nullptr) {
    std::vector<Outcome> got(requests.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back([&, i] {
        got[i] = testing::Generate(grpc_, requests[i], absl::Seconds(120),
                                   [tokens](const Outcome&) {
                                     if (tokens != nullptr) ++*tokens;
                                   });
      });
    }
    for (std::thread& t : threads) t.join();
    return got;
  }

  // Every answer is the offline engine's.
  void ExpectAllAnswered(const std::vector<v1::GenerateRequest>& requests,
                         const std::vector<Outcome>& got,
                         const std::string& what) {
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok())
          << what << " request " << i << ": " << got[i].status;
      testing::ExpectSameAnswer(got[i], offline_->Run(requests[i]),
                                absl::StrCat(what, " request ", i));
    }
  }

  std::unique_ptr<testing::OfflineEngine> offline_;
};

TEST_F(SupervisorTest, KilledWorkerIsRestartedWhileTheClusterServes) {
  ASSERT_NO_FATAL_FAILURE(Up());
  const ProcessState before = ReadState()["decode-0"];
  ASSERT_GT(before.pid, 0);
  EXPECT_EQ(before.state, "running");

  // Streaming load; decode-0 is killed once the streams are under way.
  const std::vector<v1::GenerateRequest> requests = Requests(8, 100, 160);
  std::atomic<int> tokens{0};
  std::vector<Outcome> got;
  std::thread load([&] { got = SendAll(requests, &tokens); });
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (tokens < 16 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(::kill(before.pid, SIGKILL), 0);
  load.join();
  ASSERT_GE(tokens, 16) << "the load never got going";
  // No request fails: the router migrated the streams decode-0 held.
  ExpectAllAnswered(requests, got, "under the kill");
  int migrated = 0;
  for (const Outcome& o : got) migrated += o.timing.migrations() > 0;
  EXPECT_GT(migrated, 0) << "no stream was on decode-0 when it died";

  // The supervisor started it again, and the rest kept their processes.
  const ProcessState after = AwaitState(
      "decode-0",
      [&](const ProcessState& p) {
        return p.state == "running" && p.pid != before.pid;
      },
      absl::Seconds(30));
  EXPECT_EQ(after.restarts, 1);
  EXPECT_EQ(after.last_exit, "killed by signal 9 (Killed)");
  for (const auto& [name, p] : ReadState()) {
    if (name != "decode-0") {
      EXPECT_EQ(p.restarts, 0) << name;
    }
  }
  const absl::Time registered_by = absl::Now() + absl::Seconds(20);
  while (!RouterListsServing("decode-0") && absl::Now() < registered_by) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(RouterListsServing("decode-0"));

  // pdctl status shows the restart and why.
  std::string status;
  EXPECT_EQ(Pdctl({"status", absl::StrCat("--router=", control_)}, &status), 0)
      << status;
  bool shown = false;
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    shown |= absl::StartsWith(line, "decode-0 ") &&
             absl::StrContains(line, "running") &&
             absl::StrContains(line, " 1  killed by signal 9");
  }
  EXPECT_TRUE(shown) << status;

  // The restarted worker receives work: with both decode workers idle the
  // router's tie goes to decode-0, and concurrent requests spread.
  const std::vector<v1::GenerateRequest> more = Requests(4, 300, 40);
  const std::vector<Outcome> served = SendAll(more);
  ExpectAllAnswered(more, served, "after the restart");
  int on_restarted = 0;
  for (const Outcome& o : served) {
    on_restarted += o.timing.decode_worker_id() == "decode-0";
  }
  EXPECT_GT(on_restarted, 0);

  // pdctl down stops everything, and exits 0.
  EXPECT_EQ(Pdctl({"down"}), 0);
  const absl::StatusOr<int> supervisor = pdctl_->Wait(absl::Seconds(30));
  ASSERT_TRUE(supervisor.ok()) << "the supervisor outlived pdctl down";
  EXPECT_EQ(*supervisor, 0) << DescribeWaitStatus(*supervisor) << "\n"
                            << cli::TailOfFile(work_dir_ + "/supervisor.log");
  EXPECT_NE(::kill(after.pid, 0), 0) << "decode-0 outlived pdctl down";
}

TEST_F(SupervisorTest, CrashLoopIsReportedNotRetriedForever) {
  ASSERT_NO_FATAL_FAILURE(Up());
  // Kill prefill-1 each time it comes back: the third crash in a row
  // (--crash_loop_restarts=3) leaves it down.
  pid_t pid = ReadState()["prefill-1"].pid;
  for (int crash = 1; crash <= 3; ++crash) {
    ASSERT_EQ(::kill(pid, SIGKILL), 0) << "crash " << crash;
    if (crash == 3) break;
    const ProcessState back = AwaitState(
        "prefill-1",
        [&](const ProcessState& p) {
          return p.state == "running" && p.pid != pid;
        },
        absl::Seconds(30));
    ASSERT_EQ(back.restarts, crash);
    pid = back.pid;
  }
  const ProcessState looped = AwaitState(
      "prefill-1",
      [](const ProcessState& p) { return p.state == "crash-loop"; },
      absl::Seconds(10));
  EXPECT_EQ(looped.restarts, 2);
  // Left down: past several backoffs, still not started again.
  absl::SleepFor(absl::Seconds(2));
  const ProcessState still = ReadState()["prefill-1"];
  EXPECT_EQ(still.state, "crash-loop");
  EXPECT_EQ(still.pid, looped.pid);
  EXPECT_TRUE(absl::StrContains(cli::TailOfFile(work_dir_ + "/supervisor.log"),
                                "crash loop"));

  // A drained worker exits 0: it has left the cluster and stays down
  // without counting as a crash.
  std::string drained;
  EXPECT_EQ(Pdctl({"drain", "decode-1", absl::StrCat("--router=", control_)},
                  &drained),
            0)
      << drained;
  const ProcessState left = AwaitState(
      "decode-1", [](const ProcessState& p) { return p.state == "left"; },
      absl::Seconds(30));
  EXPECT_EQ(left.restarts, 0);

  // The rest of the cluster serves on.
  const std::vector<v1::GenerateRequest> requests = Requests(4, 500, 24);
  ExpectAllAnswered(requests, SendAll(requests), "with prefill-1 down");

  // pdctl down still stops the cluster; the supervisor's exit code says a
  // process had failed.
  EXPECT_EQ(Pdctl({"down"}), 0);
  const absl::StatusOr<int> supervisor = pdctl_->Wait(absl::Seconds(30));
  ASSERT_TRUE(supervisor.ok()) << "the supervisor outlived pdctl down";
  EXPECT_NE(*supervisor, 0);
}

}  // namespace
}  // namespace pdserve
