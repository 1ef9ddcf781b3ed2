// Two routers serving the same workers (pd-router x2, pd-prefill-worker,
// pd-decode-worker as separate processes on loopback):
//   - both routers list both workers;
//   - a prefix cached through one router is seen as cached by the other
//     (prefix-cache events reach every router);
//   - kill -9 of one router under load: every request sent to the other
//     succeeds, and the workers stay registered with it;
//   - the killed router, restarted, gets the workers back, and its prefix
//     index is complete at once (the workers send it a snapshot).
// KV blocks the dead router had reserved on the decode worker for requests
// it never prefilled are freed when their admission expires
// (--admission_ttl_ms, short here), so the workers end idle with every
// block free; the requests it had in flight are lost to its own clients
// only.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/cluster_state.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/fault_testing.h"
#include "tests/pdctl_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using testing::Generate;
using testing::Outcome;
using testing::TokenRequest;

constexpr int32_t kVocab = 256;  // the tiny model's byte tokens at least
constexpr int kAdmissionTtlMs = 4000;

class TwoRoutersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.bin_dir = testing::BinDir();
    options_.work_dir = testing::MakeWorkDir("two_routers");
    options_.model_path = testing::TinyModelPath();
    options_.worker_args = testing::SmallWorkerArgs();
    options_.num_routers = 2;
    options_.num_prefill = 1;
    options_.num_decode = 1;
    // What the killed router had reserved on the decode worker and never
    // used is freed within seconds, not the default two minutes.
    options_.pool_args["decode"] = {
        absl::StrCat("--admission_ttl_ms=", kAdmissionTtlMs),
        "--kv_quarantine_ms=2000"};
    options_.lease = absl::Milliseconds(1200);
    options_.heartbeat = absl::Milliseconds(200);
    absl::StatusOr<std::unique_ptr<cli::LocalCluster>> cluster =
        cli::LocalCluster::Start(options_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
    ASSERT_EQ(cluster_->routers().size(), 2u);
  }

  // The destructor SIGKILLs whatever still runs.
  void TearDown() override { cluster_.reset(); }

  // Worker ids `control` lists as SERVING.
  std::vector<std::string> Serving(const std::string& control) {
    std::vector<std::string> ids;
    absl::StatusOr<v1::ListWorkersResponse> listed = cli::ListWorkers(
        control, v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(2));
    if (!listed.ok()) return ids;
    for (const v1::WorkerInfo& w : listed->workers()) {
      if (w.state() == v1::WORKER_STATE_SERVING) ids.push_back(w.worker_id());
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  // The router's pdserve_routed_cached_prompt_tokens_total: prompt tokens
  // it found cached on the worker it routed to (its own prefix index).
  double CachedTokens(const cli::LocalRouter& router) {
    absl::StatusOr<double> sum = testing::ScrapeSum(
        std::string(absl::StripPrefix(router.http_url, "http://")),
        "pdserve_routed_cached_prompt_tokens_total");
    EXPECT_TRUE(sum.ok()) << sum.status();
    return sum.ok() ? *sum : -1;
  }

  // Sends `prompt` through `router` after the workers' next heartbeats,
  // and returns how many more prompt tokens that router found cached.
  double CachedOnResend(const cli::LocalRouter& router,
                        const v1::GenerateRequest& prompt) {
    absl::SleepFor(5 * options_.heartbeat);
    const double before = CachedTokens(router);
    const Outcome again = Generate(router.address, prompt, absl::Seconds(60));
    EXPECT_TRUE(again.status.ok()) << again.status;
    return CachedTokens(router) - before;
  }

  cli::LocalClusterOptions options_;
  std::unique_ptr<cli::LocalCluster> cluster_;
};

TEST_F(TwoRoutersTest, EitherRouterServesAndOneDyingLosesOnlyItsOwn) {
  const cli::LocalRouter a = cluster_->routers()[0];
  const cli::LocalRouter b = cluster_->routers()[1];
  const std::vector<std::string> both = {"decode-0", "prefill-0"};
  EXPECT_EQ(Serving(a.control_address), both);
  EXPECT_EQ(Serving(b.control_address), both);

  // Prefixes computed through A are known as cached by B, and by A: every
  // router gets every worker's events (several prompts, so that events
  // reaching one router at random would show).
  constexpr int kPrompts = 4;
  std::vector<v1::GenerateRequest> warm;
  for (int p = 0; p < kPrompts; ++p) {
    warm.push_back(TokenRequest(96, 10 + p, 4, kVocab));
    const Outcome first = Generate(a.address, warm.back(), absl::Seconds(60));
    ASSERT_TRUE(first.status.ok()) << first.status;
    absl::SleepFor(2 * options_.heartbeat);
  }
  absl::SleepFor(5 * options_.heartbeat);
  for (const cli::LocalRouter& router : {b, a}) {
    const double before = CachedTokens(router);
    for (const v1::GenerateRequest& r : warm) {
      const Outcome again = Generate(router.address, r, absl::Seconds(60));
      ASSERT_TRUE(again.status.ok()) << again.status;
    }
    const double cached = CachedTokens(router) - before;
    std::cout << kPrompts << " prompts of 96 tokens computed through router "
              << "A; router " << (router.name == "router" ? "A" : "B")
              << " found " << cached << " of their tokens cached" << std::endl;
    EXPECT_GE(cached, kPrompts * 64) << router.name;
  }

  // Load through both routers; A is killed in the middle of it.
  std::atomic<bool> stop{false};
  std::atomic<int> sent_b{0}, ok_b{0}, sent_a{0}, ok_a{0};
  std::vector<std::string> b_failures;
  absl::Mutex failures_mu;
  std::vector<std::thread> clients;
  for (int c = 0; c < 5; ++c) {
    const bool to_b = c < 3;
    clients.emplace_back([&, c, to_b] {
      for (int i = 0; !stop.load(); ++i) {
        const v1::GenerateRequest r =
            TokenRequest(24 + (i % 8) * 4, 100 + c * 1000 + i, 12, kVocab);
        (to_b ? sent_b : sent_a).fetch_add(1);
        const Outcome o =
            Generate(to_b ? b.address : a.address, r, absl::Seconds(30));
        if (o.status.ok()) {
          (to_b ? ok_b : ok_a).fetch_add(1);
        } else if (to_b) {
          absl::MutexLock lock(&failures_mu);
          b_failures.push_back(o.status.ToString());
        } else {
          absl::SleepFor(absl::Milliseconds(50));  // A is gone: don't spin
        }
      }
    });
  }
  absl::SleepFor(absl::Seconds(2));
  const int a_before_kill = ok_a.load();
  cluster_->Find("router")->process->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  // Past the lease: a worker B forgot would show by now.
  absl::SleepFor(3 * options_.lease);
  const std::vector<std::string> on_b_after_kill = Serving(b.control_address);
  absl::SleepFor(absl::Seconds(1));
  stop = true;
  for (std::thread& t : clients) t.join();
  std::cout << "router A killed (kill -9) under load; " << a_before_kill
            << " requests through A had succeeded before; through B: "
            << sent_b.load() << " sent, " << ok_b.load()
            << " ok; through A: " << sent_a.load() << " sent, " << ok_a.load()
            << " ok; load ran " << absl::FormatDuration(absl::Now() - killed)
            << " after the kill" << std::endl;
  EXPECT_GT(a_before_kill, 0);
  EXPECT_GT(sent_b.load(), 10);
  EXPECT_EQ(ok_b.load(), sent_b.load());
  for (const std::string& f : b_failures) ADD_FAILURE() << "through B: " << f;
  EXPECT_EQ(on_b_after_kill, both);
  EXPECT_EQ(Serving(b.control_address), both);
  // The dead router's admissions and transfers are all released: every
  // KV block free, nothing in flight (their TTL, then the quarantine).
  const absl::Duration idle = testing::AwaitWorkersIdle(
      b.control_address, both,
      absl::Milliseconds(kAdmissionTtlMs) + absl::Seconds(20));
  std::cout << "workers idle with every KV block free "
            << absl::FormatDuration(absl::Now() - killed) << " after the kill ("
            << absl::FormatDuration(idle)
            << " after the load ended; --admission_ttl_ms=" << kAdmissionTtlMs
            << ")" << std::endl;

  // Computed through B while A is down: A learns it only from the snapshot
  // the workers send when they register with it again.
  const v1::GenerateRequest while_down = TokenRequest(96, 2, 4, kVocab);
  const Outcome computed = Generate(b.address, while_down, absl::Seconds(60));
  ASSERT_TRUE(computed.status.ok()) << computed.status;

  const absl::Time restart = absl::Now();
  const absl::Status restarted = cluster_->Restart("router", absl::Seconds(30));
  ASSERT_TRUE(restarted.ok()) << restarted;
  std::cout << "router A restarted; both workers registered with it again in "
            << absl::FormatDuration(absl::Now() - restart) << std::endl;
  EXPECT_EQ(Serving(a.control_address), both);
  EXPECT_EQ(Serving(b.control_address), both);
  const double cached_on_restarted_a = CachedOnResend(a, while_down);
  std::cout << "prefix of 96 tokens computed through B while A was down; "
               "restarted A found "
            << cached_on_restarted_a << " of them cached" << std::endl;
  EXPECT_GE(cached_on_restarted_a, 64);

  const absl::Status stopped = cluster_->Stop(absl::Seconds(20));
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// pdctl up --routers=2: the state file lists both routers, pdctl policy
// changes both, and pdctl status (no --router) answers through the first
// one that is alive.
class PdctlTwoRoutersTest : public testing::PdctlClusterTest {};

TEST_F(PdctlTwoRoutersTest, StatusUsesTheFirstLiveRouter) {
  // A killed router stays down for the test (a minute's backoff).
  Up({"--routers=2", "--restart_backoff_ms=60000"}, testing::TinyModelPath());
  absl::StatusOr<cli::ClusterState> state = cli::ReadClusterState(work_dir_);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->routers.size(), 2u);
  EXPECT_EQ(state->routers[0].control, control_);
  const std::string second = state->routers[1].control;
  EXPECT_NE(second, control_);
  std::map<std::string, testing::ProcessState> processes = ReadState();
  ASSERT_TRUE(processes.contains("router-1"));
  for (const std::string& control : {control_, second}) {
    absl::StatusOr<v1::ListWorkersResponse> listed = cli::ListWorkers(
        control, v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5));
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->workers_size(), 2) << control;
  }
  std::string output;
  EXPECT_EQ(Pdctl({"status"}, &output), 0) << output;
  EXPECT_NE(output.find("router " + control_), std::string::npos) << output;

  // A policy change reaches every router, not only the one pdctl asked.
  EXPECT_EQ(Pdctl({"policy", "round_robin"}, &output), 0) << output;
  for (const std::string& control : {control_, second}) {
    absl::StatusOr<v1::GetRoutingPolicyResponse> policy =
        cli::GetRoutingPolicy(control, absl::Seconds(5));
    ASSERT_TRUE(policy.ok()) << policy.status();
    EXPECT_EQ(policy->config().policy(), v1::ROUTING_POLICY_ROUND_ROBIN)
        << control;
  }

  ASSERT_EQ(::kill(processes.at("router").pid, SIGKILL), 0);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(Pdctl({"status"}, &output), 0) << output;
  EXPECT_NE(output.find("router " + second), std::string::npos) << output;
  EXPECT_NE(output.find("decode-0"), std::string::npos) << output;
}

}  // namespace
}  // namespace pdserve
