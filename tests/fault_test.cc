// Faults injected into real processes: a worker killed with SIGKILL while
// requests are in flight. The router retries a prefill elsewhere before the
// first token, and migrates a stream after it (prompt + the tokens already
// sent are prefilled again on another pair); either way every client gets
// exactly the answer the offline engine gives, no token lost or repeated.
#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "model/tiny_model.h"
#include "proto/client.grpc.pb.h"
#include "tests/cluster_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using testing::ExpectSameAnswer;
using testing::Generate;
using testing::OfflineEngine;
using testing::Outcome;
using testing::Seed;
using testing::TokenRequest;

// A random model big enough that requests are still running when the fault
// hits (a few ms per decode step), small enough to load at once.
std::string SlowTinyModelPath() {
  static const std::string path = [] {
    const std::string p =
        absl::StrCat(::testing::TempDir(), "/fault-model.gguf");
    model::TinyModelOptions options;
    options.num_layers = 6;
    options.hidden_size = 512;
    options.ffn_size = 1024;
    options.num_heads = 8;
    options.num_kv_heads = 4;
    options.context_length = 1024;
    EXPECT_TRUE(model::WriteTinyModel(options, p).ok());
    return p;
  }();
  return path;
}

class FaultTest : public ::testing::Test {
 protected:
  void Start(const std::string& name, int prefill, int decode,
             std::vector<std::string> extra_worker_args = {}) {
    cli::LocalClusterOptions options;
    options.bin_dir = testing::BinDir();
    options.work_dir = testing::MakeWorkDir(name);
    options.model_path = SlowTinyModelPath();
    options.num_prefill = prefill;
    options.num_decode = decode;
    options.lease = absl::Milliseconds(1500);
    options.heartbeat = absl::Milliseconds(200);
    options.startup_timeout = absl::Seconds(60);
    options.router_args = {"--routing_policy=round_robin"};
    options.worker_args = {"--threads=1", "--kv_cache_mb=64"};
    options.worker_args.insert(options.worker_args.end(),
                               extra_worker_args.begin(),
                               extra_worker_args.end());
    auto cluster = cli::LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  void TearDown() override {
    // The killed worker's exit is expected; Stop reports it.
    if (cluster_ != nullptr) (void)cluster_->Stop(absl::Seconds(20));
  }

  // Sends every request at once from its own thread; `on_progress` sees the
  // number of tokens each request has received so far.
  std::vector<Outcome> SendAll(
      const std::vector<v1::GenerateRequest>& requests,
      const std::function<void(const std::vector<int>&)>& on_progress) {
    std::vector<Outcome> got(requests.size());
    std::vector<int> received(requests.size(), 0);
    absl::Mutex mu;
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i) {
      clients.emplace_back([&, i] {
        got[i] = Generate(cluster_->router_address(), requests[i],
                          absl::Seconds(120), [&](const Outcome& so_far) {
                            absl::MutexLock lock(&mu);
                            received[i] = so_far.tokens.size();
                            on_progress(received);
                          });
      });
    }
    for (std::thread& t : clients) t.join();
    return got;
  }

  void Kill(const std::string& name) {
    cli::LocalProcess* p = cluster_->Find(name);
    ASSERT_NE(p, nullptr);
    p->process->Signal(SIGKILL);
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
};

TEST_F(FaultTest, KilledDecodeWorkerMidStreamLosesNoToken) {
  OfflineEngine offline(SlowTinyModelPath());
  const int32_t vocab = offline.model().config().vocab_size;
  Start("kill-decode", 1, 2);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 12; ++i) {
    v1::GenerateRequest r = TokenRequest(40 + i, i, 120, vocab);
    if (i % 2 == 1) Seed(&r, 500 + i);
    requests.push_back(r);
  }
  // Kill decode-0 once every stream has tokens (so every prefill is done
  // and the streams on decode-0 are cut mid-way).
  std::atomic<bool> killed{false};
  const std::vector<Outcome> got =
      SendAll(requests, [&](const std::vector<int>& received) {
        for (int n : received) {
          if (n < 2) return;
        }
        if (!killed.exchange(true)) Kill("decode-0");
      });
  ASSERT_TRUE(killed);
  int migrated = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ExpectSameAnswer(got[i], offline.Run(requests[i]),
                     absl::StrCat("request ", i));
    migrated += got[i].timing.migrations() > 0;
    if (got[i].timing.migrations() > 0) {
      // The stream ended on the surviving worker (or, when the re-prefill's
      // token ended it, on no decode worker at all).
      EXPECT_NE(got[i].timing.decode_worker_id(), "decode-0")
          << got[i].timing.DebugString() << " finish "
          << v1::FinishReason_Name(got[i].finish) << " after "
          << got[i].tokens.size() << " tokens in " << got[i].chunks
          << " chunks";
    }
  }
  EXPECT_GT(migrated, 0) << "no stream was on decode-0 when it died";
}

TEST_F(FaultTest, KilledPrefillWorkerIsRetriedElsewhere) {
  OfflineEngine offline(SlowTinyModelPath());
  const int32_t vocab = offline.model().config().vocab_size;
  Start("kill-prefill", 2, 1);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 32; ++i) {
    v1::GenerateRequest r = TokenRequest(150 + i, i, 8, vocab);
    if (i % 2 == 1) Seed(&r, 900 + i);
    requests.push_back(r);
  }
  // Kill prefill-0 as soon as the first answer starts: most prompts are
  // still queued or computing on both prefill workers.
  std::atomic<bool> killed{false};
  const std::vector<Outcome> got =
      SendAll(requests, [&](const std::vector<int>&) {
        if (!killed.exchange(true)) Kill("prefill-0");
      });
  ASSERT_TRUE(killed);
  int retried = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ExpectSameAnswer(got[i], offline.Run(requests[i]),
                     absl::StrCat("request ", i));
    retried += got[i].timing.prefill_attempts() > 1;
  }
  EXPECT_GT(retried, 0) << "no prefill was on prefill-0 when it died";
}

// A gRPC client that cancels while its request is still being prefilled
// stops the work on every worker within about a second (prefill passes are
// short, --max_batch_tokens=64, so the prefill worker sees the cancel
// between two of them).
TEST_F(FaultTest, ClientCancelDuringPrefillStopsTheWork) {
  OfflineEngine offline(SlowTinyModelPath());
  const int32_t vocab = offline.model().config().vocab_size;
  Start("cancel", 1, 1, {"--max_batch_tokens=64"});
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(
      cluster_->router_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(120));
  const v1::GenerateRequest request = TokenRequest(900, 1, 16, vocab);
  const absl::Time start = absl::Now();
  auto reader = stub->Generate(&context, request);
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(500));
    context.TryCancel();
  });
  v1::GenerateResponse chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) ++chunks;
  const grpc::Status status = reader->Finish();
  canceller.join();
  EXPECT_EQ(chunks, 0) << "the prefill finished before the cancel";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  const absl::Time cancelled = start + absl::Milliseconds(500);

  // Every worker drops the request: nothing queued or running anywhere.
  absl::Duration took = absl::InfiniteDuration();
  std::string busy;
  while (absl::Now() < cancelled + absl::Seconds(5)) {
    auto listed =
        cli::ListWorkers(cluster_->control_address(),
                         v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5));
    ASSERT_TRUE(listed.ok()) << listed.status();
    busy.clear();
    for (const v1::WorkerInfo& w : listed->workers()) {
      if (w.inflight_requests() != 0 || w.load().queued_prefill_tokens() != 0 ||
          w.load().running_sequences() != 0) {
        absl::StrAppend(&busy, w.worker_id(), " ");
      }
    }
    if (busy.empty()) {
      took = absl::Now() - cancelled;
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Heartbeats (every 200 ms) report it; the work itself stops sooner.
  EXPECT_LT(took, absl::Milliseconds(1500)) << "still busy: " << busy;

  // The cluster still serves.
  const v1::GenerateRequest next = TokenRequest(20, 2, 4, vocab);
  ExpectSameAnswer(Generate(cluster_->router_address(), next),
                   offline.Run(next), "after the cancel");
}

}  // namespace
}  // namespace pdserve
