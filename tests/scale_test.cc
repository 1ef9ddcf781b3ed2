// Resizing pools with no request dropped, against real processes.
//
// ScaleTest: a `pdctl up` cluster (1 prefill, 1 decode) under streaming
// load is scaled up (both pools at once, so the two commands are
// serialized), refused a scale that would leave nothing to decode, and
// scaled back down with a short drain deadline. Every request completes
// with the offline engine's answer, the new workers get work, the removed
// ones exit 0, and afterwards no KV block is in use anywhere.
//
// HandOverTest: a worker whose requests outlive its drain deadline (SIGTERM
// with a short --drain_timeout_ms) hands them back instead of cancelling
// them: the decode worker's streams are migrated (Timing.migrations, and
// the router's pdserve_request_migrations_total moves by exactly as many),
// the prefill worker's queued prompts are prefilled elsewhere, and no
// request fails.
//
// pdctl runs with --foreground as this test's child, so that nothing it
// started outlives the test (common/subprocess.h).
#include <signal.h>

#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/fault_testing.h"
#include "tests/pdctl_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using testing::FaultRow;
using testing::FaultTest;
using testing::OfflineEngine;
using testing::Outcome;
using testing::SlowTinyModelPath;
using testing::TokenRequest;

class ScaleTest : public testing::PdctlClusterTest {
 protected:
  // `pdctl up --foreground` with round-robin routing, so that new workers
  // get their share at once.
  void Up(int prefill, int decode) {
    PdctlClusterTest::Up({absl::StrCat("--prefill=", prefill),
                          absl::StrCat("--decode=", decode),
                          "--router_args=--lease_ms=1500,--heartbeat_ms=200,"
                          "--routing_policy=round_robin"});
  }
};

TEST_F(ScaleTest, ScaleUpAndDownUnderStreamingLoadDropsNothing) {
  OfflineEngine offline(SlowTinyModelPath());
  const int32_t vocab = offline.model().config().vocab_size;
  ASSERT_NO_FATAL_FAILURE(Up(1, 1));

  // Closed-loop streaming load: 8 clients, each sending the next request
  // as soon as its previous one ends, until told to stop.
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 400; ++i) {
    // Streams long enough to outlive a 300 ms drain deadline.
    v1::GenerateRequest r =
        TokenRequest(30 + i % 40, 1000 + i, 250 + i % 100, vocab);
    if (i % 2 == 1) testing::Seed(&r, 7 + i);
    requests.push_back(r);
  }
  std::vector<Outcome> got(requests.size());
  std::atomic<int> next{0};
  std::atomic<int> tokens{0};
  std::atomic<bool> stop{false};
  absl::Mutex seen_mu;
  std::set<std::string> seen;  // Workers that prefilled or decoded a request.
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&] {
      while (!stop) {
        const int i = next++;
        if (i >= static_cast<int>(requests.size())) return;
        got[i] = testing::Generate(grpc_, requests[i], absl::Seconds(120),
                                   [&](const Outcome&) { ++tokens; });
        absl::MutexLock lock(&seen_mu);
        seen.insert(got[i].timing.prefill_worker_id());
        seen.insert(got[i].timing.decode_worker_id());
      }
    });
  }
  auto await_seen = [&](const std::string& worker) {
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (absl::Now() < give_up) {
      {
        absl::MutexLock lock(&seen_mu);
        if (seen.contains(worker)) return;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << worker << " finished no request within 60 s";
  };
  auto await_tokens = [&](int more) {
    const int target = tokens + more;
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (tokens < target && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_GE(tokens, target) << "the load stalled";
  };
  await_tokens(30);

  // Up, both pools at once: the two commands take turns.
  std::string up_decode, up_prefill;
  int up_decode_code = -1, up_prefill_code = -1;
  std::thread scale_decode([&] {
    up_decode_code = Pdctl({"scale", "decode", "2"}, &up_decode);
  });
  absl::SleepFor(absl::Milliseconds(200));
  std::thread scale_prefill([&] {
    up_prefill_code = Pdctl({"scale", "prefill", "2"}, &up_prefill);
  });
  scale_decode.join();
  scale_prefill.join();
  EXPECT_EQ(up_decode_code, 0) << up_decode;
  EXPECT_EQ(up_prefill_code, 0) << up_prefill;
  EXPECT_TRUE(absl::StrContains(up_decode, "started decode-1")) << up_decode;
  EXPECT_TRUE(absl::StrContains(up_prefill, "started prefill-1")) << up_prefill;
  std::map<std::string, testing::ProcessState> state = ReadState();
  EXPECT_EQ(state["decode-1"].state, "running");
  EXPECT_EQ(state["prefill-1"].state, "running");
  // The new workers take their share: each completes requests.
  await_seen("decode-1");
  await_seen("prefill-1");

  // Nothing left to decode: refused, nothing changed.
  std::string refused;
  EXPECT_EQ(Pdctl({"scale", "decode", "0"}, &refused), 1) << refused;
  EXPECT_TRUE(absl::StrContains(refused, "no decode or colocated worker"))
      << refused;
  std::string bad;
  EXPECT_EQ(Pdctl({"scale", "gpu", "1"}, &bad), 2) << bad;
  EXPECT_EQ(Pdctl({"scale", "decode", "many"}, &bad), 2) << bad;
  EXPECT_EQ(ReadState().size(), 5u);

  // Down, under load, with a drain deadline short enough that streams
  // still run on the removed workers when it passes.
  std::string down_decode, down_prefill;
  EXPECT_EQ(Pdctl({"scale", "decode", "1", "--deadline_ms=300"}, &down_decode),
            0)
      << down_decode;
  EXPECT_TRUE(absl::StrContains(down_decode, "removed decode-")) << down_decode;
  EXPECT_TRUE(absl::StrContains(down_decode, "exited with code 0"))
      << down_decode;
  await_tokens(100);
  EXPECT_EQ(
      Pdctl({"scale", "prefill", "1", "--deadline_ms=300"}, &down_prefill), 0)
      << down_prefill;
  EXPECT_TRUE(absl::StrContains(down_prefill, "removed prefill-"))
      << down_prefill;
  EXPECT_TRUE(absl::StrContains(down_prefill, "exited with code 0"))
      << down_prefill;
  await_tokens(100);
  stop = true;
  for (std::thread& t : clients) t.join();

  // One worker per pool is left, running.
  state = ReadState();
  std::vector<std::string> left;
  for (const auto& [name, s] : state) {
    if (name == "router") continue;
    EXPECT_EQ(s.state, "running") << name;
    left.push_back(name);
  }
  ASSERT_EQ(left.size(), 2u) << absl::StrJoin(left, ", ");

  // Every request sent completed with the undisturbed answer.
  int sent = 0, migrated = 0;
  std::set<std::string> prefilled_on, decoded_on;
  for (int i = 0; i < std::min<int>(next, requests.size()); ++i) {
    ++sent;
    ASSERT_TRUE(got[i].status.ok()) << "request " << i << ": " << got[i].status;
    testing::ExpectSameAnswer(got[i], offline.Run(requests[i]),
                              absl::StrCat("request ", i));
    migrated += got[i].timing.migrations();
    prefilled_on.insert(got[i].timing.prefill_worker_id());
    decoded_on.insert(got[i].timing.decode_worker_id());
  }
  std::printf(
      "scale test: %d requests, %d migrations, prefilled on %s, "
      "decoded on %s\n",
      sent, migrated, absl::StrJoin(prefilled_on, ",").c_str(),
      absl::StrJoin(decoded_on, ",").c_str());
  EXPECT_TRUE(prefilled_on.contains("prefill-1"))
      << "the added prefill worker got no work";
  EXPECT_TRUE(decoded_on.contains("decode-1"))
      << "the added decode worker got no work";
  // No KV block left in use, nothing queued or in transfer, anywhere.
  testing::AwaitWorkersIdle(control_, left, absl::Seconds(25));

  std::string down;
  EXPECT_EQ(Pdctl({"down"}, &down), 0) << down;
  const absl::StatusOr<int> exited = pdctl_->Wait(absl::Seconds(60));
  ASSERT_TRUE(exited.ok());
  EXPECT_EQ(*exited, 0) << cli::TailOfFile(
      absl::StrCat(work_dir_, "/supervisor.log"));
}

// The router's count of mid-stream migrations (0 before the first).
double Migrations(cli::LocalCluster& cluster) {
  absl::StatusOr<double> n =
      testing::ScrapeSum(cluster.Find("router")->metrics_address,
                         "pdserve_request_migrations_total");
  if (n.status().code() == absl::StatusCode::kNotFound) return 0;
  EXPECT_TRUE(n.ok()) << n.status();
  return n.value_or(-1);
}

using HandOverTest = FaultTest;

TEST_F(HandOverTest, DecodeStreamsOutlivingTheDrainDeadlineAreMigrated) {
  OfflineEngine offline(SlowTinyModelPath());
  const int32_t vocab = offline.model().config().vocab_size;
  constexpr int kDrainMs = 200;
  Start("handover-decode", 1, 2, {}, {},
        {{"decode-0", {absl::StrCat("--drain_timeout_ms=", kDrainMs)}}});
  // Streams far longer than the drain deadline plus the second a worker's
  // gRPC server gives calls when it shuts down (which alone let shorter
  // streams finish when the worker simply cancelled them).
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    v1::GenerateRequest r = TokenRequest(40 + i, 300 + i, 900, vocab);
    if (i % 2 == 1) testing::Seed(&r, 90 + i);
    requests.push_back(r);
  }
  const double before = Migrations(*cluster_);
  const FaultedLoad load =
      SendAllWithFault(requests, EveryStreamHas(8), {"decode-0"}, SIGTERM);
  ASSERT_TRUE(load.fired());
  // It exits 0 having handed its streams over.
  cli::LocalProcess* drained = cluster_->Find("decode-0");
  const absl::StatusOr<int> status = drained->process->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << "decode-0 did not exit after its hand-over";
  EXPECT_EQ(*status, 0) << DescribeWaitStatus(*status);
  // The load ends when the last migrated or retried request does.
  const absl::Duration answered_after = absl::Now() - load.fault_at;
  FaultRow row =
      Score(absl::StrCat("SIGTERM a decode worker whose streams outlive its ",
                         kDrainMs, " ms drain deadline"),
            requests, load.got, offline);
  EXPECT_EQ(row.completed, row.sent) << "a hand-over must fail no request";
  int migrated = 0;
  for (const Outcome& o : load.got) {
    migrated += o.timing.migrations();
    // A stream ends on the worker that stayed.
    if (o.timing.migrations() > 0) {
      EXPECT_EQ(o.timing.decode_worker_id(), "decode-1");
    }
  }
  EXPECT_GT(migrated, 0) << "no stream was running on decode-0 at its "
                            "deadline: the test proves nothing";
  // The router counts each migration once, and nothing else as one.
  EXPECT_EQ(Migrations(*cluster_), before + migrated);

  // Handed back by the worker itself at its deadline. (Before it did, the
  // streams happened to migrate anyway: the gRPC server's shutdown, a second
  // later, ended the calls it cancelled with UNAVAILABLE; the worker's log
  // is what tells the two apart.)
  const std::string log = cli::TailOfFile(drained->log_path, 1 << 20);
  EXPECT_TRUE(absl::StrContains(log, "back to the router")) << log;
  EXPECT_FALSE(absl::StrContains(log, "cancelling them")) << log;
  row.recovery = answered_after;
  row.recovery_what =
      absl::StrCat("SIGTERM -> every answer complete, worker exited 0; ",
                   migrated, " streams migrated to decode-1");
  Report(row);
  // The rest must be idle (TearDown), every block free.
  ASSERT_TRUE(cluster_->Remove("decode-0").ok());
}

TEST_F(HandOverTest, PromptsQueuedAtThePrefillDrainDeadlineGoElsewhere) {
  OfflineEngine offline(SlowTinyModelPath());
  const int32_t vocab = offline.model().config().vocab_size;
  // The decode worker holds every prompt's KV at once.
  Start("handover-prefill", 2, 1, {}, {},
        {{"prefill-0", {"--drain_timeout_ms=50"}},
         {"decode-0", {"--kv_cache_mb=256"}}});
  // Long prompts, so that each prefill worker has a queue when the first
  // answer comes; few enough that prefill-1 computes them all within the
  // decode worker's 20 s reservations even under AddressSanitizer.
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 12; ++i) {
    requests.push_back(TokenRequest(500 + i * 10, 500 + i, 2, vocab));
  }
  const FaultedLoad load =
      SendAllWithFault(requests, AnyAnswer(), {"prefill-0"}, SIGTERM);
  ASSERT_TRUE(load.fired());
  cli::LocalProcess* drained = cluster_->Find("prefill-0");
  const absl::StatusOr<int> status = drained->process->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << "prefill-0 did not exit after its hand-over";
  EXPECT_EQ(*status, 0) << DescribeWaitStatus(*status);
  // The load ends when the last migrated or retried request does.
  const absl::Duration answered_after = absl::Now() - load.fault_at;
  FaultRow row =
      Score("SIGTERM a prefill worker with a queue and a 50 ms drain deadline",
            requests, load.got, offline);
  EXPECT_EQ(row.completed, row.sent) << "a hand-over must fail no request";
  int retried = 0;
  for (const Outcome& o : load.got) {
    retried += o.timing.prefill_attempts() > 1;
    if (o.timing.prefill_attempts() > 1) {
      EXPECT_EQ(o.timing.prefill_worker_id(), "prefill-1");
    }
  }
  EXPECT_GT(retried, 0) << "prefill-0 had nothing queued at its deadline: "
                           "the test proves nothing";
  row.recovery = answered_after;
  row.recovery_what =
      absl::StrCat("SIGTERM -> every answer complete, worker exited 0; ",
                   retried, " prompts handed back and prefilled on prefill-1");
  Report(row);
  ASSERT_TRUE(cluster_->Remove("prefill-0").ok());
}

}  // namespace
}  // namespace pdserve
