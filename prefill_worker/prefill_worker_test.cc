// The prefill worker on a tiny generated model, in process, without a decode
// worker: its first token is the offline engine's, its prefix cache serves
// repeats, and its queue, cancels, refusals and drain behave as promised.
// The transfer path (a target in a decode worker's pool) is covered end to
// end, across processes, by the cluster tests in tests/ (serving_test and
// the fault tests): the two workers meet only over the wire.
#include "prefill_worker/prefill_worker.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/llm_engine.h"
#include "engine/sampling_proto.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/tiny_model.h"
#include "proto/worker.pb.h"

namespace pdserve::prefill_worker {
namespace {

// Every wait in these tests is bounded by this: a bug fails the test rather
// than hanging it.
constexpr absl::Duration kWait = absl::Seconds(30);

// No request here has a target, so nothing may ever be completed.
class NoCompleter : public TransferCompleter {
 public:
  absl::Status Complete(const std::string& notify_address,
                        const v1::KvTransferComplete& notice,
                        absl::Time deadline) override {
    ++calls;
    return absl::InternalError("no decode worker in this test");
  }
  void Release(const std::string& notify_address,
               const v1::ReleaseRequest& release) override {
    ++releases;
    quiesced_releases += release.writes_quiesced();
  }
  std::atomic<int> calls{0};
  std::atomic<int> releases{0};
  std::atomic<int> quiesced_releases{0};
};

// One Prefill's answer. Shared with the callback so that an answer arriving
// after a failed wait never touches a dead object.
struct Answer {
  absl::Notification done;
  absl::StatusOr<v1::PrefillResponse> result =
      absl::UnknownError("not answered");
  std::atomic<int> calls{0};
};

class PrefillWorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("TEST_TMPDIR");
    const std::string path = std::string(dir != nullptr ? dir : "/tmp") +
                             "/prefill_worker_tiny.gguf";
    model::TinyModelOptions o;
    o.num_layers = 2;
    ASSERT_TRUE(model::WriteTinyModel(o, path).ok());
    auto m = model::Model::Open(path);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  // The same runner settings for the worker and the offline engine, so
  // their arithmetic is the same.
  static engine::ModelRunnerOptions Runner() {
    engine::ModelRunnerOptions o;
    o.block_size = 4;
    o.num_blocks = 64;
    o.max_batch_tokens = 64;
    o.num_threads = 2;
    return o;
  }

  // A worker that is not started yet: requests queue but nothing runs, so a
  // test can arrange its queue deterministically.
  std::unique_ptr<PrefillWorker> MakeWorker(int32_t max_queued = 256) {
    PrefillWorkerOptions o;
    o.worker_id = "prefill-0";
    o.runner = Runner();
    o.transport.kind = v1::TRANSPORT_KIND_IN_PROCESS;
    o.max_queued_requests = max_queued;
    auto w = PrefillWorker::Create(*model_, o, &completer_);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(w).value() : nullptr;
  }

  static std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p(n);
    const int vocab = model_->config().vocab_size;
    for (int i = 0; i < n; ++i) p[i] = (i * 31 + salt * 97 + 3) % (vocab - 2);
    return p;
  }

  static v1::SamplingParams Greedy(uint32_t max_tokens) {
    v1::SamplingParams s;
    s.set_temperature(0);
    s.set_max_tokens(max_tokens);
    s.set_ignore_eos(true);
    return s;
  }

  // The tiny model's random weights give very peaked logits; the
  // penalties make the output vary (and must count replayed tokens).
  static v1::SamplingParams Seeded(uint32_t max_tokens) {
    v1::SamplingParams s;
    s.set_temperature(1.0f);
    s.set_repetition_penalty(1.5f);
    s.set_presence_penalty(1.0f);
    s.set_seed(99);
    s.set_max_tokens(max_tokens);
    s.set_ignore_eos(true);
    return s;
  }

  static v1::PrefillRequest Request(
      const std::string& id, const std::vector<int32_t>& prompt,
      const v1::SamplingParams& sampling,
      const std::vector<int32_t>& generated = {}) {
    v1::PrefillRequest r;
    r.set_request_id(id);
    r.set_attempt(1);
    for (int32_t t : prompt) r.add_prompt_token_ids(t);
    for (int32_t t : generated) r.add_generated_token_ids(t);
    *r.mutable_sampling() = sampling;
    return r;
  }

  // Queues `request`; the refusal, or OK with `answer` to wait on.
  static absl::Status Submit(PrefillWorker& worker,
                             const v1::PrefillRequest& request,
                             const std::shared_ptr<Answer>& answer) {
    return worker.Prefill(request, absl::Now() + kWait,
                          [answer](absl::StatusOr<v1::PrefillResponse> result) {
                            if (answer->calls++ == 0) {
                              answer->result = std::move(result);
                              answer->done.Notify();
                            }
                          });
  }

  // Submits and waits: the refusal, the answer, or DEADLINE_EXCEEDED when
  // none comes within kWait.
  static absl::StatusOr<v1::PrefillResponse> PrefillAndWait(
      PrefillWorker& worker, const v1::PrefillRequest& request) {
    auto answer = std::make_shared<Answer>();
    if (absl::Status queued = Submit(worker, request, answer); !queued.ok()) {
      return queued;
    }
    return Wait(*answer);
  }

  static absl::StatusOr<v1::PrefillResponse> Wait(Answer& answer) {
    if (!answer.done.WaitForNotificationWithTimeout(kWait)) {
      return absl::DeadlineExceededError("the prefill worker never answered");
    }
    return answer.result;
  }

  // The offline engine's tokens and per-output text for the request alone.
  struct Offline {
    std::vector<int32_t> tokens;
    std::vector<std::string> texts;
  };
  static Offline RunOffline(const std::vector<int32_t>& prompt,
                            const v1::SamplingParams& sampling) {
    engine::EngineOptions o;
    o.runner = Runner();
    auto engine = engine::LlmEngine::Create(*model_, o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    Offline result;
    if (!engine.ok()) return result;
    engine::EngineRequest r;
    r.prompt = prompt;
    r.sampling = engine::FromProto(sampling);
    r.on_output = [&result](const engine::RequestOutput& out) {
      result.tokens.insert(result.tokens.end(), out.token_ids.begin(),
                           out.token_ids.end());
      result.texts.push_back(out.text);
    };
    EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
    EXPECT_TRUE((*engine)->RunUntilIdle().ok());
    return result;
  }

  // Waits until the worker holds no request and no block.
  static bool Idle(PrefillWorker& worker) {
    const absl::Time until = absl::Now() + kWait;
    while (worker.inflight() != 0 || worker.blocks().num_used_blocks() != 0) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return worker.blocks().CheckInvariants().ok();
  }

  static model::Model* model_;
  NoCompleter completer_;
};

model::Model* PrefillWorkerTest::model_ = nullptr;

TEST_F(PrefillWorkerTest,
       FirstTokenMatchesTheOfflineEngineAndRepeatsHitTheCache) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  worker->Start();
  const std::vector<int32_t> prompt = Prompt(37, 1);
  int runs = 0;
  for (const v1::SamplingParams& sampling : {Greedy(8), Seeded(8)}) {
    SCOPED_TRACE(sampling.DebugString());
    const Offline offline = RunOffline(prompt, sampling);
    ASSERT_EQ(offline.tokens.size(), 8u);
    for (int repeat = 0; repeat < 2; ++repeat, ++runs) {
      SCOPED_TRACE(repeat);
      absl::StatusOr<v1::PrefillResponse> r =
          PrefillAndWait(*worker, Request("warm", prompt, sampling));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->request_id(), "warm");
      EXPECT_EQ(r->prefill_worker_id(), "prefill-0");
      EXPECT_EQ(r->first_token_id(), offline.tokens[0]);
      EXPECT_EQ(r->text(), offline.texts[0]);
      EXPECT_EQ(r->finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
      // No target: prefix warming moves no KV.
      EXPECT_EQ(r->kv_bytes_sent(), 0u);
      // The very first run computes everything; every later one reuses the
      // prompt's nine full 4-token blocks, whatever the sampling.
      EXPECT_EQ(r->cached_prefix_tokens(), runs == 0 ? 0u : 36u);
      EXPECT_EQ(r->computed_tokens(), runs == 0 ? 37u : 1u);
      ASSERT_TRUE(Idle(*worker));
    }
  }
  EXPECT_EQ(completer_.calls, 0);
}

// A request continuing after tokens it already produced elsewhere (a
// migration) samples the token the offline run produced next, seeded
// sampling and penalties included.
TEST_F(PrefillWorkerTest, ReplayedTokensContinueTheOfflineStream) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  worker->Start();
  const std::vector<int32_t> prompt = Prompt(23, 0);
  for (const v1::SamplingParams& sampling : {Greedy(8), Seeded(8)}) {
    SCOPED_TRACE(sampling.DebugString());
    const Offline offline = RunOffline(prompt, sampling);
    ASSERT_EQ(offline.tokens.size(), 8u);
    const std::vector<int32_t> replayed(offline.tokens.begin(),
                                        offline.tokens.begin() + 3);
    // Else the next token would be no evidence of a correct replay.
    EXPECT_NE(offline.tokens[3], offline.tokens[2]);
    absl::StatusOr<v1::PrefillResponse> r = PrefillAndWait(
        *worker, Request("migrated", prompt, sampling, replayed));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->first_token_id(), offline.tokens[3]);
    EXPECT_EQ(r->text(), offline.texts[3]);
  }
  // The last token max_tokens allows ends the request at the prefill.
  const Offline offline = RunOffline(prompt, Greedy(1));
  absl::StatusOr<v1::PrefillResponse> last =
      PrefillAndWait(*worker, Request("one", prompt, Greedy(1)));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->first_token_id(), offline.tokens[0]);
  EXPECT_EQ(last->finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(Idle(*worker));
}

TEST_F(PrefillWorkerTest, QueueLimitRefusesWithResourceExhausted) {
  auto worker = MakeWorker(/*max_queued=*/1);
  ASSERT_NE(worker, nullptr);
  // Not started: the first request stays queued, so the second surely finds
  // the queue full.
  auto first = std::make_shared<Answer>();
  auto second = std::make_shared<Answer>();
  ASSERT_TRUE(
      Submit(*worker, Request("first", Prompt(9, 4), Greedy(2)), first).ok());
  EXPECT_EQ(Submit(*worker, Request("second", Prompt(9, 5), Greedy(2)), second)
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(worker->inflight(), 1u);
  EXPECT_EQ(worker->Load().queued_prefill_requests(), 1);
  EXPECT_EQ(worker->Load().queued_prefill_tokens(), 9u);

  worker->Start();
  EXPECT_TRUE(Wait(*first).ok()) << first->result.status();
  ASSERT_TRUE(Idle(*worker));
  // A refused request is never answered; once there is room again, a new
  // one is taken.
  EXPECT_EQ(second->calls, 0);
  EXPECT_TRUE(
      PrefillAndWait(*worker, Request("third", Prompt(9, 6), Greedy(2))).ok());
  EXPECT_EQ(first->calls, 1);
}

TEST_F(PrefillWorkerTest, CancelOfAQueuedRequestAnswersCancelled) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  // Not started: both requests are still queued when the cancel arrives,
  // and the scheduler handles cancels before admitting anything.
  auto doomed = std::make_shared<Answer>();
  auto kept = std::make_shared<Answer>();
  ASSERT_TRUE(
      Submit(*worker, Request("doomed", Prompt(12, 7), Greedy(2)), doomed)
          .ok());
  ASSERT_TRUE(
      Submit(*worker, Request("kept", Prompt(12, 8), Greedy(2)), kept).ok());
  v1::CancelRequest cancel;
  cancel.set_request_id("doomed");
  cancel.set_reason(v1::CANCEL_REASON_CLIENT);
  EXPECT_TRUE(worker->Cancel(cancel).found());
  v1::CancelRequest unknown;
  unknown.set_request_id("nobody");
  EXPECT_FALSE(worker->Cancel(unknown).found());

  worker->Start();
  EXPECT_EQ(Wait(*doomed).status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(Wait(*kept).ok()) << kept->result.status();
  EXPECT_TRUE(Idle(*worker));
  EXPECT_EQ(worker->Load().queued_prefill_tokens(), 0u);
  EXPECT_EQ(doomed->calls, 1);
  EXPECT_EQ(kept->calls, 1);
}

TEST_F(PrefillWorkerTest, BadRequestsAreInvalidArgument) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  worker->Start();
  const int32_t vocab = model_->config().vocab_size;
  const int32_t context = model_->config().context_length;
  auto answer = std::make_shared<Answer>();
  auto refused = [&](const v1::PrefillRequest& r) {
    return Submit(*worker, r, answer).code();
  };
  EXPECT_EQ(refused(Request("empty", {}, Greedy(2))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(Request("vocab", {1, 2, vocab}, Greedy(2))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(Request("generated-vocab", {1, 2}, Greedy(2), {vocab})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(Request("too-long", Prompt(context, 1), Greedy(2))),
            absl::StatusCode::kInvalidArgument);
  v1::SamplingParams bad_sampling = Greedy(2);
  bad_sampling.set_temperature(-1);
  EXPECT_EQ(refused(Request("sampling", {1, 2}, bad_sampling)),
            absl::StatusCode::kInvalidArgument);
  // A target must hold exactly the request's tokens (prompt + replayed).
  v1::PrefillRequest mismatch = Request("target", Prompt(10, 2), Greedy(2));
  mismatch.mutable_target()->set_num_tokens(11);
  EXPECT_EQ(refused(mismatch), absl::StatusCode::kInvalidArgument);
  v1::PrefillRequest replay_mismatch =
      Request("target", Prompt(10, 2), Greedy(2), {5});
  replay_mismatch.mutable_target()->set_num_tokens(10);
  EXPECT_EQ(refused(replay_mismatch), absl::StatusCode::kInvalidArgument);
  // Refusals queue nothing and answer nothing.
  EXPECT_EQ(worker->inflight(), 0u);
  EXPECT_EQ(answer->calls, 0);
}

// A target in a decode worker that is gone fails the request (never a
// hang, never a success) and gives the prefill blocks back.
TEST_F(PrefillWorkerTest, TargetInAGonePeerFailsAndFreesBlocks) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  worker->Start();
  const std::vector<int32_t> prompt = Prompt(10, 9);
  v1::PrefillRequest r = Request("orphan", prompt, Greedy(2));
  v1::KvTransferTarget* target = r.mutable_target();
  target->set_transfer_id("decode-x/1");
  target->set_request_id("orphan");
  target->set_num_tokens(prompt.size());
  *target->mutable_layout() = worker->model_info().kv_layout();
  target->mutable_layout()->set_num_blocks(8);
  for (uint32_t b = 0; b < 3; ++b) target->add_block_ids(b);
  v1::MemoryRegionDescriptor* region = target->mutable_region();
  region->set_transport(v1::TRANSPORT_KIND_IN_PROCESS);
  // An in-process instance name of this process that was never created.
  const std::string peer = absl::StrCat(::getpid(), "/999999");
  region->set_peer_address(peer);
  region->set_region_id(absl::StrCat(peer, "#1"));
  region->set_base_address(4096);
  region->set_length_bytes(1 << 20);
  region->set_memory_kind(v1::MEMORY_KIND_HOST);
  absl::StatusOr<v1::PrefillResponse> result = PrefillAndWait(*worker, r);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kDeadlineExceeded)
      << result.status();
  EXPECT_TRUE(Idle(*worker));
  EXPECT_EQ(completer_.calls, 0);
  // No write can land after the failure, so the decode worker is told at
  // once that the blocks are free again (no quarantine).
  EXPECT_EQ(completer_.releases, 1);
  EXPECT_EQ(completer_.quiesced_releases, 1);
}

// A cancel of an attempt the worker never saw answers "not found" (so the
// router may free its blocks at once), and the worker keeps its word: the
// attempt's Prefill, arriving late, is refused and its target given back.
TEST_F(PrefillWorkerTest, AnAttemptCancelledBeforeItArrivesIsRefused) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  worker->Start();
  v1::CancelRequest cancel;
  cancel.set_request_id("late");
  cancel.set_attempt(1);
  EXPECT_FALSE(worker->Cancel(cancel).found());
  v1::PrefillRequest r = Request("late", Prompt(8, 3), Greedy(2));
  r.mutable_target()->set_transfer_id("decode-x/7");
  r.mutable_target()->set_notify_address("decode-x");
  r.mutable_target()->set_num_tokens(8);
  auto answer = std::make_shared<Answer>();
  EXPECT_EQ(Submit(*worker, r, answer).code(), absl::StatusCode::kCancelled);
  // Given back by a finisher thread, not the caller's.
  const absl::Time give_up = absl::Now() + kWait;
  while (completer_.quiesced_releases == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(completer_.quiesced_releases, 1);
  // Another attempt of the same request is not affected.
  r.set_attempt(2);
  r.clear_target();
  EXPECT_TRUE(PrefillAndWait(*worker, r).ok());
  // A cancel of a queued or running attempt is found.
  r.set_attempt(3);
  ASSERT_TRUE(Submit(*worker, r, answer = std::make_shared<Answer>()).ok());
  cancel.set_attempt(3);
  const bool found = worker->Cancel(cancel).found();
  ASSERT_TRUE(answer->done.WaitForNotificationWithTimeout(kWait));
  // Unless it had already been answered (then nothing of it can land).
  EXPECT_TRUE(found || answer->result.ok());
  EXPECT_TRUE(Idle(*worker));
}

TEST_F(PrefillWorkerTest, DrainRefusesNewWork) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  worker->Start();
  worker->BeginDrain();
  auto answer = std::make_shared<Answer>();
  EXPECT_EQ(
      Submit(*worker, Request("late", Prompt(8, 1), Greedy(2)), answer).code(),
      absl::StatusCode::kUnavailable);
  EXPECT_EQ(worker->inflight(), 0u);
  EXPECT_EQ(answer->calls, 0);
}

// Destroying a worker answers what it still had queued, so no caller waits
// forever.
TEST_F(PrefillWorkerTest, ShutdownAnswersQueuedRequests) {
  auto worker = MakeWorker();
  ASSERT_NE(worker, nullptr);
  auto queued = std::make_shared<Answer>();
  ASSERT_TRUE(
      Submit(*worker, Request("queued", Prompt(8, 2), Greedy(2)), queued).ok());
  worker.reset();
  EXPECT_EQ(Wait(*queued).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(queued->calls, 1);
}

}  // namespace
}  // namespace pdserve::prefill_worker
