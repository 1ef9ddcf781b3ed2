// Workers that die or hang while requests are in flight, and clients that
// cancel. The router retries a prefill elsewhere before the first token, and
// migrates a stream after it (prompt + the tokens already sent are prefilled
// again on another pair); either way every client gets exactly the answer
// the offline engine gives, no token lost or repeated. A hung worker is
// found by its missed lease, and the calls waiting on it are cut.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/client.grpc.pb.h"
#include "tests/fault_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using testing::ExpectSameAnswer;
using testing::FaultRow;
using testing::FaultTest;
using testing::Generate;
using testing::HeavyTinyModelPath;
using testing::OfflineEngine;
using testing::Outcome;
using testing::Seed;
using testing::SlowTinyModelPath;
using testing::TokenRequest;

// Greedy and seeded requests alternately.
std::vector<v1::GenerateRequest> Requests(int n, int prompt, int max_tokens,
                                          int32_t vocab, uint64_t seed_base) {
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < n; ++i) {
    v1::GenerateRequest r = TokenRequest(prompt + i, i, max_tokens, vocab);
    if (i % 2 == 1) Seed(&r, seed_base + i);
    requests.push_back(r);
  }
  return requests;
}

class WorkerFaultTest : public FaultTest {
 protected:
  absl::Duration RecoveredSince(absl::Time fault) {
    if (AwaitIdle(absl::Seconds(25)) == absl::InfiniteDuration()) {
      return absl::InfiniteDuration();
    }
    return absl::Now() - fault;
  }
};

TEST_F(WorkerFaultTest, KilledDecodeWorkerMidStreamLosesNoToken) {
  OfflineEngine offline(SlowTinyModelPath());
  Start("kill-decode", 1, 2);
  const std::vector<v1::GenerateRequest> requests =
      Requests(12, 40, 600, offline.model().config().vocab_size, 500);
  // Kill decode-0 once every stream has tokens (so every prefill is done
  // and the streams on decode-0 are cut mid-way). The streams are long so
  // that the first ones are still running when the last one starts, even
  // on a slow (sanitizer) build, or with prefill twice as slow and decode
  // twice as fast as on AMD Zen 4.
  const FaultedLoad load =
      SendAllWithFault(requests, EveryStreamHas(2), {"decode-0"}, SIGKILL);
  ASSERT_TRUE(load.fired());
  const std::vector<Outcome>& got = load.got;
  const absl::Time fault = load.fault_at;
  int migrated = 0;
  int migrations = 0;
  for (const Outcome& o : got) {
    migrated += o.timing.migrations() > 0;
    migrations += o.timing.migrations();
    if (o.timing.migrations() > 0) {
      // The stream ended on the surviving worker (or, when the re-prefill's
      // token ended it, on no decode worker at all).
      EXPECT_NE(o.timing.decode_worker_id(), "decode-0")
          << o.timing.DebugString();
    }
  }
  EXPECT_GT(migrated, 0) << "no stream was on decode-0 when it died";
  // The router counts each migration once, as the streams' timing does.
  EXPECT_EQ(Metric("router", "pdserve_request_migrations_total"), migrations);
  EXPECT_EQ(Metric("router", "pdserve_request_retries_total"), 0);
  FaultRow row = Score("kill -9 decode worker mid-stream (greedy + seeded)",
                       requests, got, offline);
  row.recovery = RecoveredSince(fault);
  row.recovery_what = "kill -> every KV block free";
  Report(row);
}

TEST_F(WorkerFaultTest, KilledPrefillWorkerIsRetriedElsewhere) {
  OfflineEngine offline(SlowTinyModelPath());
  // Passes of at most 64 prompt tokens (one or two prompts): prefill-0
  // still holds queued prompts when the first answer starts, however the
  // arrivals fall into passes and however fast the CPU.
  Start("kill-prefill", 2, 1, {"--max_batch_tokens=64"});
  const std::vector<v1::GenerateRequest> requests =
      Requests(32, 40, 8, offline.model().config().vocab_size, 900);
  // Kill prefill-0 as soon as the first answer starts: most prompts are
  // still queued or computing on both prefill workers.
  const FaultedLoad load =
      SendAllWithFault(requests, AnyAnswer(), {"prefill-0"}, SIGKILL);
  ASSERT_TRUE(load.fired());
  const std::vector<Outcome>& got = load.got;
  const absl::Time fault = load.fault_at;
  int retried = 0;
  int retries = 0;
  for (const Outcome& o : got) {
    retried += o.timing.prefill_attempts() > 1;
    retries += std::max<int>(0, o.timing.prefill_attempts() - 1);
  }
  EXPECT_GT(retried, 0) << "no prefill was on prefill-0 when it died";
  // Each try after the first is one retry for the router's counter.
  EXPECT_EQ(Metric("router", "pdserve_request_retries_total"), retries);
  EXPECT_EQ(Metric("router", "pdserve_request_migrations_total"), 0);
  FaultRow row = Score("kill -9 prefill worker, 32 requests in flight",
                       requests, got, offline);
  // The decode worker gets the blocks reserved for the dead worker's
  // transfers back when their reservation (20 s here) runs out.
  row.recovery = RecoveredSince(fault);
  row.recovery_what = "kill -> every KV block free (reservation 20 s)";
  Report(row);
}

// Migrations are bounded: with --max_migrations=0 the streams cut by the
// dead worker end with a clear INTERNAL error (after the tokens they
// already had), and the others complete untouched.
TEST_F(WorkerFaultTest, StreamsFailClearlyPastTheMigrationLimit) {
  OfflineEngine offline(SlowTinyModelPath());
  Start("no-migration", 1, 2, {}, {"--max_migrations=0"});
  // Long enough that streams on decode-0 still run when the last one
  // starts, with prefill twice as slow and decode twice as fast as on AMD
  // Zen 4.
  const std::vector<v1::GenerateRequest> requests =
      Requests(8, 40, 480, offline.model().config().vocab_size, 600);
  const FaultedLoad load =
      SendAllWithFault(requests, EveryStreamHas(2), {"decode-0"}, SIGKILL);
  ASSERT_TRUE(load.fired());
  const std::vector<Outcome>& got = load.got;
  const absl::Time fault = load.fault_at;
  int failed = 0;
  for (const Outcome& o : got) {
    if (o.status.ok()) continue;
    ++failed;
    EXPECT_EQ(o.status.code(), absl::StatusCode::kInternal) << o.status;
    EXPECT_GT(o.tokens.size(), 0u) << "it failed before streaming";
  }
  EXPECT_GT(failed, 0) << "no stream was on decode-0 when it died";
  FaultRow row = Score("kill -9 decode worker, --max_migrations=0", requests,
                       got, offline, {absl::StatusCode::kInternal});
  row.recovery = RecoveredSince(fault);
  row.recovery_what = "kill -> every KV block free";
  Report(row);
}

// A hung prefill worker (SIGSTOP) keeps its connections open and answers
// nothing: its missed lease (1.5 s) gets it dropped and the calls waiting
// on it cut, and the prompts are prefilled on the other worker. Let go
// again, it registers anew and gets work.
TEST_F(WorkerFaultTest, HungPrefillWorkerIsRetriedElsewhere) {
  OfflineEngine offline(SlowTinyModelPath());
  // Passes of at most 64 prompt tokens, as for the kill above.
  Start("hang-prefill", 2, 1, {"--max_batch_tokens=64"});
  const std::vector<v1::GenerateRequest> requests =
      Requests(16, 40, 8, offline.model().config().vocab_size, 300);
  const FaultedLoad load =
      SendAllWithFault(requests, AnyAnswer(), {"prefill-0"}, SIGSTOP);
  ASSERT_TRUE(load.fired());
  const std::vector<Outcome>& got = load.got;
  const absl::Time fault = load.fault_at;
  int retried = 0;
  for (const Outcome& o : got) retried += o.timing.prefill_attempts() > 1;
  EXPECT_GT(retried, 0) << "no prefill was on prefill-0 when it hung";
  FaultRow row = Score("SIGSTOP (hang) prefill worker, 16 requests in flight",
                       requests, got, offline);
  row.recovery = RecoveredSince(fault);
  row.recovery_what =
      "hang -> every KV block free (its transfers' reservations: 20 s)";
  Report(row);

  // Resumed, it finds its lease gone, registers again, winds up the
  // transfers it held when it stopped (long overdue: they fail), and serves.
  Signal("prefill-0", SIGCONT);
  disturbed_.erase("prefill-0");
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (Workers()["prefill-0"].state() != v1::WORKER_STATE_SERVING) {
    ASSERT_LT(absl::Now(), give_up) << "prefill-0 did not come back";
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Its first transfers may still meet the connection it closed on its
  // overdue ones (reconnects wait 1 s): those are retried elsewhere.
  bool served_by_it = false;
  for (int i = 0; i < 20 && !served_by_it; ++i) {
    const v1::GenerateRequest r =
        TokenRequest(30, 700 + i, 4, offline.model().config().vocab_size);
    const Outcome o = Generate(cluster_->router_address(), r);
    ASSERT_TRUE(o.status.ok()) << o.status;
    served_by_it = o.timing.prefill_worker_id() == "prefill-0" &&
                   o.timing.prefill_attempts() == 1;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(served_by_it) << "prefill-0 got no work after it came back";
}

// A decode worker that hangs mid-stream: its streams migrate once its lease
// runs out, and every client still gets exactly the undisturbed answer.
TEST_F(WorkerFaultTest, HungDecodeWorkerMidStreamLosesNoToken) {
  OfflineEngine offline(SlowTinyModelPath());
  Start("hang-decode", 1, 2);
  // As long as the no-migration test's streams, for the same reason.
  const std::vector<v1::GenerateRequest> requests =
      Requests(8, 40, 480, offline.model().config().vocab_size, 100);
  const FaultedLoad load =
      SendAllWithFault(requests, EveryStreamHas(2), {"decode-0"}, SIGSTOP);
  ASSERT_TRUE(load.fired());
  const std::vector<Outcome>& got = load.got;
  const absl::Time fault = load.fault_at;
  int migrated = 0;
  for (const Outcome& o : got) migrated += o.timing.migrations() > 0;
  EXPECT_GT(migrated, 0) << "no stream was on decode-0 when it hung";
  FaultRow row =
      Score("SIGSTOP (hang) decode worker mid-stream", requests, got, offline);
  // Resumed, it sees its streams cancelled and frees their blocks.
  Signal("decode-0", SIGCONT);
  disturbed_.erase("decode-0");
  row.recovery = RecoveredSince(fault);
  row.recovery_what = "hang -> every KV block free (lease 1.5 s)";
  Report(row);
}

// The router dies with streams in flight and comes back on its addresses.
// Its clients get a clear UNAVAILABLE (their connection was to the dead
// router); the workers drop the orphaned work, register with the new router
// on their own, without a restart, and serve again.
TEST_F(WorkerFaultTest, WorkersRegisterWithARestartedRouterAndServe) {
  OfflineEngine offline(SlowTinyModelPath());
  Start("router-restart", 1, 1);
  const std::vector<v1::GenerateRequest> requests =
      Requests(8, 40, 200, offline.model().config().vocab_size, 50);
  const FaultedLoad load =
      SendAllWithFault(requests, EveryStreamHas(2), {"router"}, SIGKILL);
  ASSERT_TRUE(load.fired());
  const std::vector<Outcome>& got = load.got;
  const absl::Time fault = load.fault_at;
  FaultRow row = Score("kill -9 router mid-stream, restarted", requests, got,
                       offline, {absl::StatusCode::kUnavailable});
  const absl::Status restarted = cluster_->Restart("router", absl::Seconds(30));
  ASSERT_TRUE(restarted.ok()) << restarted;
  disturbed_.erase("router");
  ASSERT_NE(AwaitIdle(absl::Seconds(25)), absl::InfiniteDuration());
  row.recovery = absl::Now() - fault;
  row.recovery_what = "kill -> new router up, workers registered and idle";
  Report(row);
  const v1::GenerateRequest next =
      TokenRequest(20, 9, 4, offline.model().config().vocab_size);
  ExpectSameAnswer(Generate(cluster_->router_address(), next),
                   offline.Run(next), "through the restarted router");
}

// A gRPC client that cancels while its request is still being prefilled
// stops the work on every worker at once (prefill passes are short,
// --max_batch_tokens=32, so the prefill worker sees the cancel between two
// of them). The prompt's prefill is timed offline in the same run (a lower
// bound for the cluster's, which runs in 32-token passes): the cancel comes
// a quarter of the way in, and every worker must be idle within half that
// prefill's time, while a worker that ignored the cancel would still have
// three quarters of it to compute. On the slow tiny model a fixed 150 ms
// cancel against a prefill of about 0.5 s passed with or without the
// cancel, and a CPU twice as fast would finish the prefill first.
TEST_F(WorkerFaultTest, ClientCancelDuringPrefillStopsTheWork) {
  model_path_ = HeavyTinyModelPath();
  OfflineEngine offline(model_path_);
  const int32_t vocab = offline.model().config().vocab_size;
  const int prompt = 3500;
  const absl::Time probe_start = absl::Now();
  const Outcome probe = offline.Run(TokenRequest(prompt, 3, 1, vocab));
  ASSERT_TRUE(probe.status.ok()) << probe.status;
  const absl::Duration prefill = absl::Now() - probe_start;
  const absl::Duration cancel_after = prefill / 4;
  const absl::Duration idle_within = prefill / 2;
  // Heartbeats every 200 ms report idle about 300 ms after the cancel.
  ASSERT_GE(idle_within, absl::Milliseconds(500))
      << "this model prefills too fast (" << prefill
      << ") to tell a cancelled prefill from a finished one";
  Start("cancel", 1, 1, {"--max_batch_tokens=32"});
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(
      cluster_->router_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(120));
  const v1::GenerateRequest request = TokenRequest(prompt, 1, 16, vocab);
  const absl::Time start = absl::Now();
  auto reader = stub->Generate(&context, request);
  std::thread canceller([&] {
    absl::SleepFor(cancel_after);
    context.TryCancel();
  });
  v1::GenerateResponse chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) ++chunks;
  const grpc::Status status = reader->Finish();
  canceller.join();
  EXPECT_EQ(chunks, 0) << "the prefill finished before the cancel";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  const absl::Time cancelled = start + cancel_after;

  // Every worker drops the request and frees its blocks (the decode
  // worker's reservation included: the prefill worker tells it that no
  // write can land any more). Heartbeats (every 200 ms) report it; the
  // work itself stops sooner.
  ASSERT_NE(AwaitIdle(idle_within), absl::InfiniteDuration())
      << "the workers kept prefilling after the cancel (prefill alone "
      << prefill << ")";
  const absl::Duration took = absl::Now() - cancelled;
  // One cancellation, counted once, and the request ended as cancelled.
  EXPECT_EQ(AwaitMetric("router", "pdserve_request_cancellations_total", {}, 1),
            1);
  EXPECT_EQ(Metric("router", "pdserve_requests_total",
                   {{"endpoint", "generate"}, {"status", "cancelled"}}),
            1);
  FaultRow row;
  row.fault = absl::StrFormat(
      "gRPC client cancel during prefill (%d-token prompt, %d ms in of ~%d ms)",
      prompt, absl::ToInt64Milliseconds(cancel_after),
      absl::ToInt64Milliseconds(prefill));
  row.sent = 1;
  row.rejected = status.error_code() == grpc::StatusCode::CANCELLED;
  row.lost = 1 - row.rejected;
  row.recovery = took;
  row.recovery_what = "cancel -> every KV block free";
  Report(row);

  // The cluster still serves.
  const v1::GenerateRequest next = TokenRequest(20, 2, 4, vocab);
  ExpectSameAnswer(Generate(cluster_->router_address(), next),
                   offline.Run(next), "after the cancel");
}

}  // namespace
}  // namespace pdserve
