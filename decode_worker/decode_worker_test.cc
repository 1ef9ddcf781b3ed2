// The decode worker in one process with a prefill peer (what a prefill
// worker does on the wire, testing/prefill_peer.h): a tiny generated model,
// the in-process KV transport (real byte copies between the two pools) and
// a completer that calls CompleteTransfer directly instead of over gRPC.
// Whatever path a request takes (transferred KV, local prefill), its tokens and
// text are exactly the offline engine's, and every way a request ends (finish,
// cancel, release, checksum failure, expiry) gives all its KV blocks back.
#include "decode_worker/decode_worker.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "decode_worker/testing/prefill_peer.h"
#include "engine/llm_engine.h"
#include "engine/sampling_proto.h"
#include "gtest/gtest.h"
#include "kv_transfer/transport_factory.h"
#include "model/model.h"
#include "model/tiny_model.h"
#include "proto/worker.pb.h"

namespace pdserve::decode_worker {
namespace {

// Every wait in these tests is bounded by this: a bug fails the test rather
// than hanging it.
constexpr absl::Duration kWait = absl::Seconds(30);
constexpr char kAddress[] = "test-address";

// Hands completion notices straight to the decode worker (what the gRPC
// completer does over the network). With corrupt_checksum set it flips one
// bit of layer 0's checksum first, as a transfer damaged in flight would
// look to the decode worker.
class DirectCompleter {
 public:
  void set_decode(DecodeWorker* decode) { decode_ = decode; }
  void set_corrupt_checksum(bool corrupt) { corrupt_ = corrupt; }

  absl::Status Complete(const std::string& notify_address,
                        const v1::KvTransferComplete& notice) {
    EXPECT_EQ(notify_address, kAddress);
    DecodeWorker* decode = decode_.load();
    if (decode == nullptr) return absl::UnavailableError("no decode worker");
    v1::KvTransferComplete sent = notice;
    if (corrupt_ && sent.layer_checksums_size() > 0) {
      sent.set_layer_checksums(0, sent.layer_checksums(0) ^ 1);
    }
    return decode->CompleteTransfer(sent).status();
  }
  void Release(const std::string& notify_address,
               const v1::ReleaseRequest& release) {
    EXPECT_EQ(notify_address, kAddress);
    if (DecodeWorker* decode = decode_.load(); decode != nullptr) {
      decode->Release(release);
    }
  }

 private:
  std::atomic<DecodeWorker*> decode_{nullptr};
  std::atomic<bool> corrupt_{false};
};

// What a DecodeSink received. Shared with the sink's callbacks so that a
// callback arriving after a failed wait never touches a dead object.
struct Stream {
  absl::Mutex mu;
  std::vector<v1::DecodeChunk> chunks ABSL_GUARDED_BY(mu);
  absl::Status end ABSL_GUARDED_BY(mu) = absl::UnknownError("not ended");
  int ends ABSL_GUARDED_BY(mu) = 0;
  int chunks_after_end ABSL_GUARDED_BY(mu) = 0;
  absl::Notification first_chunk;
  absl::Notification ended;
  // When set, the first chunk's callback waits (bounded) for
  // release_first_chunk. Sinks must not block, but holding the engine
  // thread here is what lets a test act while the decode is surely still
  // running, instead of racing it.
  bool hold_first_chunk = false;
  absl::Notification release_first_chunk;
};

DecodeSink SinkFor(const std::shared_ptr<Stream>& stream) {
  DecodeSink sink;
  sink.on_chunk = [stream](const v1::DecodeChunk& chunk) {
    bool first = false;
    {
      absl::MutexLock lock(&stream->mu);
      if (stream->ends > 0) ++stream->chunks_after_end;
      stream->chunks.push_back(chunk);
      first = stream->chunks.size() == 1;
    }
    if (first) {
      stream->first_chunk.Notify();
      if (stream->hold_first_chunk) {
        stream->release_first_chunk.WaitForNotificationWithTimeout(kWait);
      }
    }
  };
  sink.on_end = [stream](const absl::Status& status) {
    bool first = false;
    {
      absl::MutexLock lock(&stream->mu);
      first = stream->ends++ == 0;
      if (first) stream->end = status;
    }
    if (first) stream->ended.Notify();
  };
  return sink;
}

int Distinct(const std::vector<int32_t>& tokens) {
  return std::set<int32_t>(tokens.begin(), tokens.end()).size();
}

// A request's whole output: tokens and text in order.
struct Generated {
  std::vector<int32_t> tokens;
  std::string text;
  // Offline runs only: the text of each output (one token each but a
  // cancelled last one).
  std::vector<std::string> texts;
};

class DecodeWorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("TEST_TMPDIR");
    const std::string path =
        std::string(dir != nullptr ? dir : "/tmp") + "/decode_worker_tiny.gguf";
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

  // The same runner settings on all three engines (decode, prefill,
  // offline) but the pool size, so their arithmetic is the same.
  static engine::ModelRunnerOptions Runner(int32_t num_blocks) {
    engine::ModelRunnerOptions o;
    o.block_size = 4;
    o.num_blocks = num_blocks;
    o.max_batch_tokens = 64;
    o.num_threads = 2;
    return o;
  }

  void SetUp() override { StartWorkers(absl::Seconds(30), absl::Seconds(10)); }

  void TearDown() override {
    // The prefill peer calls into the decode worker.
    prefill_.reset();
    decode_.reset();
  }

  // (Re)creates both workers; the decode pool holds 32 blocks of 4 tokens.
  void StartWorkers(absl::Duration ttl, absl::Duration quarantine) {
    prefill_.reset();
    completer_.set_decode(nullptr);
    decode_.reset();

    DecodeWorkerOptions d;
    d.worker_id = "decode-0";
    d.engine.runner = Runner(kDecodeBlocks);
    d.transport.kind = v1::TRANSPORT_KIND_IN_PROCESS;
    d.admission_ttl = ttl;
    d.quarantine = quarantine;
    auto decode = DecodeWorker::Create(*model_, d);
    ASSERT_TRUE(decode.ok()) << decode.status();
    decode_ = std::move(decode).value();
    ASSERT_TRUE(decode_->Start(kAddress).ok());
    completer_.set_decode(decode_.get());

    PrefillPeerOptions p;
    p.worker_id = "prefill-0";
    p.runner = Runner(64);
    p.transport.kind = v1::TRANSPORT_KIND_IN_PROCESS;
    p.transport.faults = prefill_faults_;
    p.complete = [this](const std::string& address,
                        const v1::KvTransferComplete& notice) {
      return completer_.Complete(address, notice);
    };
    p.release = [this](const std::string& address,
                       const v1::ReleaseRequest& release) {
      completer_.Release(address, release);
    };
    auto prefill = PrefillPeer::Create(*model_, std::move(p));
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    prefill_ = std::move(prefill).value();
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

  // Sampling with a seed and penalties (which must count the first token
  // the prefill worker sampled), with logprobs. The tiny model's random
  // weights give very peaked logits; the penalties make the output vary.
  static v1::SamplingParams Seeded(uint32_t max_tokens) {
    v1::SamplingParams s;
    s.set_temperature(1.0f);
    s.set_repetition_penalty(1.5f);
    s.set_presence_penalty(1.0f);
    s.set_seed(99);
    s.set_max_tokens(max_tokens);
    s.set_ignore_eos(true);
    s.set_logprobs(true);
    return s;
  }

  // The request run alone on a fresh offline engine.
  static Generated RunOffline(const std::vector<int32_t>& prompt,
                              const v1::SamplingParams& sampling) {
    engine::EngineOptions o;
    o.runner = Runner(64);
    auto engine = engine::LlmEngine::Create(*model_, o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    Generated g;
    if (!engine.ok()) return g;
    engine::EngineRequest r;
    r.prompt = prompt;
    r.sampling = engine::FromProto(sampling);
    r.on_output = [&g](const engine::RequestOutput& out) {
      g.tokens.insert(g.tokens.end(), out.token_ids.begin(),
                      out.token_ids.end());
      g.text += out.text;
      g.texts.push_back(out.text);
    };
    EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
    EXPECT_TRUE((*engine)->RunUntilIdle().ok());
    return g;
  }

  v1::AdmitRequest AdmitFor(const std::string& request_id,
                            const std::vector<int32_t>& prompt) {
    v1::AdmitRequest r;
    r.set_request_id(request_id);
    r.set_attempt(1);
    for (int32_t t : prompt) r.add_token_ids(t);
    r.set_num_prompt_tokens(prompt.size());
    *r.mutable_writer_layout() = prefill_->kv_layout();
    r.add_writer_transports(prefill_->transport_kind());
    r.set_prefill_worker_id("prefill-0");
    return r;
  }

  // Prefill of prompt + `generated` into `target`: the answer or the
  // error.
  absl::StatusOr<v1::PrefillResponse> Prefill(
      const std::string& request_id, const std::vector<int32_t>& prompt,
      const v1::SamplingParams& sampling, const v1::KvTransferTarget& target,
      const std::vector<int32_t>& generated = {}) {
    v1::PrefillRequest r;
    r.set_request_id(request_id);
    r.set_attempt(1);
    for (int32_t t : prompt) r.add_prompt_token_ids(t);
    for (int32_t t : generated) r.add_generated_token_ids(t);
    *r.mutable_sampling() = sampling;
    *r.mutable_target() = target;
    return prefill_->Prefill(r);
  }

  v1::StartDecodeRequest StartFor(const std::string& request_id,
                                  const std::string& transfer_id,
                                  const v1::SamplingParams& sampling,
                                  std::vector<int32_t> generated) {
    v1::StartDecodeRequest r;
    r.set_request_id(request_id);
    r.set_attempt(1);
    r.set_transfer_id(transfer_id);
    *r.mutable_sampling() = sampling;
    for (int32_t t : generated) r.add_generated_token_ids(t);
    return r;
  }

  // Admit -> prefill with KV push -> StartDecode, as the router drives it.
  // The output is the prefill's first token followed by every decode chunk.
  void RunDisaggregated(const std::string& request_id,
                        const std::vector<int32_t>& prompt,
                        const v1::SamplingParams& sampling, Generated* out,
                        v1::KvTransferTarget* target_out = nullptr,
                        v1::PrefillResponse* first_out = nullptr,
                        v1::DecodeChunk* last_out = nullptr) {
    absl::StatusOr<v1::AdmitResponse> admitted =
        decode_->Admit(AdmitFor(request_id, prompt));
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    const v1::KvTransferTarget& target = admitted->target();
    EXPECT_EQ(target.num_tokens(), prompt.size());
    EXPECT_EQ(target.notify_address(), kAddress);
    if (target_out != nullptr) *target_out = target;

    absl::StatusOr<v1::PrefillResponse> first =
        Prefill(request_id, prompt, sampling, target);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_GT(first->kv_bytes_sent(), 0u);
    if (first_out != nullptr) *first_out = *first;

    auto stream = std::make_shared<Stream>();
    ASSERT_TRUE(
        decode_
            ->StartDecode(
                StartFor(request_id, target.transfer_id(), sampling,
                         {static_cast<int32_t>(first->first_token_id())}),
                SinkFor(stream))
            .ok());
    ASSERT_TRUE(stream->ended.WaitForNotificationWithTimeout(kWait))
        << "the decode stream never ended";
    absl::MutexLock lock(&stream->mu);
    EXPECT_TRUE(stream->end.ok()) << stream->end;
    EXPECT_EQ(stream->ends, 1);
    EXPECT_EQ(stream->chunks_after_end, 0);
    ASSERT_FALSE(stream->chunks.empty());
    out->tokens = {static_cast<int32_t>(first->first_token_id())};
    out->text = first->text();
    for (size_t i = 0; i < stream->chunks.size(); ++i) {
      const v1::DecodeChunk& c = stream->chunks[i];
      EXPECT_EQ(c.request_id(), request_id);
      // Offsets count the prefill's token: decoding continues at 1.
      EXPECT_EQ(c.generated_offset(), out->tokens.size());
      if (sampling.logprobs()) {
        EXPECT_EQ(c.logprobs_size(), c.token_ids_size());
      }
      if (i + 1 < stream->chunks.size()) {
        EXPECT_EQ(c.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
      }
      out->tokens.insert(out->tokens.end(), c.token_ids().begin(),
                         c.token_ids().end());
      out->text += c.text();
    }
    if (last_out != nullptr) *last_out = stream->chunks.back();
  }

  // Polls `done` until it holds (true) or kWait passes (false).
  template <typename F>
  static bool Eventually(F done) {
    const absl::Time until = absl::Now() + kWait;
    while (!done()) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  // No block held by anything: no sequence, admission or quarantine.
  void ExpectAllBlocksFree() {
    EXPECT_EQ(decode_->blocks().num_used_blocks(), 0);
    EXPECT_TRUE(decode_->blocks().CheckInvariants().ok());
    const v1::WorkerLoad load = decode_->Load();
    EXPECT_EQ(load.reserved_kv_blocks(), 0);
    EXPECT_EQ(load.inflight_transfers(), 0);
    EXPECT_EQ(load.running_sequences(), 0);
    EXPECT_EQ(load.free_kv_blocks(), load.total_kv_blocks());
    EXPECT_EQ(decode_->inflight(), 0u);
    // The prefill side gives its source blocks back with its answer.
    EXPECT_EQ(prefill_->blocks().num_used_blocks(), 0);
  }

  static constexpr int32_t kDecodeBlocks = 32;
  static model::Model* model_;
  // Destroyed bottom up: the prefill peer (which calls the completer,
  // which calls the decode worker) goes first.
  std::optional<kv_transfer::TransportFaults> prefill_faults_;
  DirectCompleter completer_;
  std::unique_ptr<DecodeWorker> decode_;
  std::unique_ptr<PrefillPeer> prefill_;
};

model::Model* DecodeWorkerTest::model_ = nullptr;

TEST_F(DecodeWorkerTest, DisaggregatedRequestsMatchTheOfflineEngine) {
  const std::vector<int32_t> prompt = Prompt(23, 0);
  struct Case {
    std::string name;
    v1::SamplingParams sampling;
  };
  // The third run repeats the first: both workers now hold the prompt's
  // full blocks in their prefix caches, so only the tail moves.
  const std::vector<Case> cases = {{"greedy", Greedy(16)},
                                   {"seeded", Seeded(16)},
                                   {"greedy-cached", Greedy(16)}};
  // The comparisons below mean something only if the outputs vary.
  const Generated greedy = RunOffline(prompt, Greedy(16));
  const Generated seeded = RunOffline(prompt, Seeded(16));
  EXPECT_NE(greedy.tokens, seeded.tokens);
  EXPECT_GE(Distinct(greedy.tokens), 2);
  EXPECT_GE(Distinct(seeded.tokens), 6);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const Generated offline = RunOffline(prompt, cases[i].sampling);
    ASSERT_EQ(offline.tokens.size(), 16u);
    Generated served;
    v1::KvTransferTarget target;
    v1::PrefillResponse first;
    v1::DecodeChunk last;
    ASSERT_NO_FATAL_FAILURE(RunDisaggregated(absl::StrCat("req-", i), prompt,
                                             cases[i].sampling, &served,
                                             &target, &first, &last));
    EXPECT_EQ(served.tokens, offline.tokens);
    EXPECT_EQ(served.text, offline.text);
    EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
    ASSERT_TRUE(last.has_usage());
    EXPECT_EQ(last.usage().prompt_tokens(), prompt.size());
    EXPECT_EQ(last.usage().completion_tokens(), 16u);
    ASSERT_TRUE(last.has_timing());
    EXPECT_EQ(last.timing().decode_worker_id(), "decode-0");
    EXPECT_GT(last.timing().decode_ms(), 0);
    EXPECT_GT(last.timing().tpot_ms(), 0);
    if (i == 0) {
      EXPECT_EQ(target.first_token_position(), 0u);
      EXPECT_EQ(first.cached_prefix_tokens(), 0u);
    } else {
      EXPECT_EQ(target.first_token_position(), 20u);  // five 4-token blocks
      EXPECT_GT(first.cached_prefix_tokens(), 0u);
    }
    ExpectAllBlocksFree();
  }
}

TEST_F(DecodeWorkerTest, LocalPrefillMatchesTheOfflineEngine) {
  const std::vector<int32_t> prompt = Prompt(19, 0);
  const std::vector<v1::SamplingParams> samplings = {Greedy(12), Seeded(12),
                                                     Greedy(12)};
  for (size_t i = 0; i < samplings.size(); ++i) {
    SCOPED_TRACE(i);
    const Generated offline = RunOffline(prompt, samplings[i]);
    v1::StartDecodeRequest r;
    r.set_request_id(absl::StrCat("local-", i));
    r.set_attempt(1);
    for (int32_t t : prompt) r.mutable_local_prefill()->add_prompt_token_ids(t);
    *r.mutable_sampling() = samplings[i];
    auto stream = std::make_shared<Stream>();
    ASSERT_TRUE(decode_->StartDecode(r, SinkFor(stream)).ok());
    ASSERT_TRUE(stream->ended.WaitForNotificationWithTimeout(kWait));
    Generated served;
    absl::MutexLock lock(&stream->mu);
    EXPECT_TRUE(stream->end.ok()) << stream->end;
    ASSERT_FALSE(stream->chunks.empty());
    for (const v1::DecodeChunk& c : stream->chunks) {
      EXPECT_EQ(c.generated_offset(), served.tokens.size());
      served.tokens.insert(served.tokens.end(), c.token_ids().begin(),
                           c.token_ids().end());
      served.text += c.text();
    }
    EXPECT_EQ(served.tokens, offline.tokens);
    EXPECT_EQ(served.text, offline.text);
    const v1::DecodeChunk& last = stream->chunks.back();
    EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(last.usage().prompt_tokens(), prompt.size());
    EXPECT_EQ(last.usage().completion_tokens(), 12u);
    // The repeats find the prompt's full blocks in the prefix cache.
    EXPECT_EQ(last.usage().cached_prompt_tokens(), i == 0 ? 0u : 16u);
    EXPECT_EQ(last.timing().local_cached_tokens(), i == 0 ? 0u : 16u);
    EXPECT_GT(last.timing().local_prefill_ms(), 0);
    ExpectAllBlocksFree();
  }
}

// A completion notice whose checksum does not match the bytes that landed is
// an error on both sides, never a decode over bad KV, and its blocks are
// freed at once (the writer has finished: nothing can still land).
TEST_F(DecodeWorkerTest, CorruptedTransferIsDataLossAndFreesItsBlocks) {
  struct Case {
    std::string name;
    bool corrupt_checksum;
    std::optional<kv_transfer::TransportFaults> faults;
  };
  kv_transfer::TransportFaults corrupt_bytes;
  corrupt_bytes.corrupt_writes = true;
  const std::vector<Case> cases = {
      {"wrong checksum in the notice", true, std::nullopt},
      {"bytes damaged by the transport", false, corrupt_bytes}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    prefill_faults_ = c.faults;
    ASSERT_NO_FATAL_FAILURE(StartWorkers(absl::Seconds(30), absl::Seconds(10)));
    completer_.set_corrupt_checksum(c.corrupt_checksum);
    const std::vector<int32_t> prompt = Prompt(17, 3);
    absl::StatusOr<v1::AdmitResponse> admitted =
        decode_->Admit(AdmitFor("bad", prompt));
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    EXPECT_GT(decode_->blocks().num_used_blocks(), 0);

    absl::StatusOr<v1::PrefillResponse> first =
        Prefill("bad", prompt, Greedy(8), admitted->target());
    EXPECT_EQ(first.status().code(), absl::StatusCode::kDataLoss)
        << first.status();
    auto stream = std::make_shared<Stream>();
    EXPECT_EQ(
        decode_
            ->StartDecode(StartFor("bad", admitted->target().transfer_id(),
                                   Greedy(8), {1}),
                          SinkFor(stream))
            .code(),
        absl::StatusCode::kNotFound);
    ExpectAllBlocksFree();
    EXPECT_FALSE(stream->first_chunk.HasBeenNotified());
    EXPECT_FALSE(stream->ended.HasBeenNotified());
    completer_.set_corrupt_checksum(false);
  }
}

TEST_F(DecodeWorkerTest, ReleaseOfAnAdmissionFreesItsBlocksAtOnce) {
  absl::StatusOr<v1::AdmitResponse> admitted =
      decode_->Admit(AdmitFor("rel", Prompt(30, 4)));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(decode_->blocks().num_used_blocks(), 8);  // 30 tokens / 4
  EXPECT_EQ(decode_->Load().reserved_kv_blocks(), 8);
  EXPECT_EQ(decode_->inflight(), 1u);

  v1::ReleaseRequest release;
  release.set_transfer_id(admitted->target().transfer_id());
  release.set_request_id("rel");
  release.set_writes_quiesced(true);
  EXPECT_TRUE(decode_->Release(release).found());
  ExpectAllBlocksFree();
  // Released means gone: a late notice or StartDecode finds nothing.
  EXPECT_FALSE(decode_->Release(release).found());
  v1::KvTransferComplete late;
  late.set_transfer_id(admitted->target().transfer_id());
  EXPECT_EQ(decode_->CompleteTransfer(late).status().code(),
            absl::StatusCode::kNotFound);
}

// A verified transfer released before StartDecode (e.g. the request
// finished at its first token) frees its blocks too.
TEST_F(DecodeWorkerTest, ReleaseOfAVerifiedTransferFreesItsBlocks) {
  const std::vector<int32_t> prompt = Prompt(13, 5);
  absl::StatusOr<v1::AdmitResponse> admitted =
      decode_->Admit(AdmitFor("done-early", prompt));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_TRUE(
      Prefill("done-early", prompt, Greedy(1), admitted->target()).ok());
  EXPECT_GT(decode_->blocks().num_used_blocks(), 0);
  v1::ReleaseRequest release;
  release.set_transfer_id(admitted->target().transfer_id());
  release.set_writes_quiesced(true);
  EXPECT_TRUE(decode_->Release(release).found());
  ExpectAllBlocksFree();
}

TEST_F(DecodeWorkerTest, CancelEndsARunningDecodeAndFreesItsBlocks) {
  const std::vector<int32_t> prompt = Prompt(11, 6);
  absl::StatusOr<v1::AdmitResponse> admitted =
      decode_->Admit(AdmitFor("cancel-me", prompt));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  // Far more tokens than it will produce before the cancel (and still
  // within the 128-token pool).
  const v1::SamplingParams sampling = Greedy(100);
  absl::StatusOr<v1::PrefillResponse> first =
      Prefill("cancel-me", prompt, sampling, admitted->target());
  ASSERT_TRUE(first.ok()) << first.status();

  auto stream = std::make_shared<Stream>();
  stream->hold_first_chunk = true;
  ASSERT_TRUE(
      decode_
          ->StartDecode(
              StartFor("cancel-me", admitted->target().transfer_id(), sampling,
                       {static_cast<int32_t>(first->first_token_id())}),
              SinkFor(stream))
          .ok());
  ASSERT_TRUE(stream->first_chunk.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(decode_->Load().running_sequences(), 1);
  v1::CancelRequest cancel;
  cancel.set_request_id("cancel-me");
  cancel.set_reason(v1::CANCEL_REASON_CLIENT);
  const v1::CancelResponse response = decode_->Cancel(cancel);
  stream->release_first_chunk.Notify();
  EXPECT_TRUE(response.found());

  ASSERT_TRUE(stream->ended.WaitForNotificationWithTimeout(kWait));
  {
    absl::MutexLock lock(&stream->mu);
    EXPECT_TRUE(stream->end.ok()) << stream->end;
    ASSERT_GE(stream->chunks.size(), 2u);
    const v1::DecodeChunk& last = stream->chunks.back();
    EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_CANCELLED);
    EXPECT_LT(last.usage().completion_tokens(), 100u);
    EXPECT_EQ(stream->chunks_after_end, 0);
  }
  ExpectAllBlocksFree();
  // Nothing left to cancel.
  EXPECT_FALSE(decode_->Cancel(cancel).found());
}

// Past the drain deadline, a running stream is handed back: it ends with
// UNAVAILABLE (which the router migrates), never with a final chunk (which
// the router would forward as the answer's end); an admission nobody
// decodes yet is given back; later StartDecodes are refused; no block stays
// used but the admission's quarantined ones.
TEST_F(DecodeWorkerTest, HandBackEndsStreamsWithUnavailable) {
  // Admitted, its KV never written. Admitted first: while the held first
  // chunk below keeps the engine thread inside its step, Admit (which
  // reserves blocks under the runner's lock) would wait for the hold to
  // time out, and the stream could then finish before HandBack.
  ASSERT_TRUE(decode_->Admit(AdmitFor("waiting", Prompt(8, 2))).ok());
  const std::vector<int32_t> prompt = Prompt(11, 6);
  absl::StatusOr<v1::AdmitResponse> admitted =
      decode_->Admit(AdmitFor("running", prompt));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const v1::SamplingParams sampling = Greedy(100);
  absl::StatusOr<v1::PrefillResponse> first =
      Prefill("running", prompt, sampling, admitted->target());
  ASSERT_TRUE(first.ok()) << first.status();
  auto stream = std::make_shared<Stream>();
  stream->hold_first_chunk = true;
  ASSERT_TRUE(
      decode_
          ->StartDecode(
              StartFor("running", admitted->target().transfer_id(), sampling,
                       {static_cast<int32_t>(first->first_token_id())}),
              SinkFor(stream))
          .ok());
  ASSERT_TRUE(stream->first_chunk.WaitForNotificationWithTimeout(kWait));
  decode_->BeginDrain();
  EXPECT_EQ(decode_->HandBack(), 2u);
  stream->release_first_chunk.Notify();

  ASSERT_TRUE(stream->ended.WaitForNotificationWithTimeout(kWait));
  {
    absl::MutexLock lock(&stream->mu);
    EXPECT_EQ(stream->end.code(), absl::StatusCode::kUnavailable)
        << stream->end;
    EXPECT_EQ(stream->ends, 1);
    for (const v1::DecodeChunk& chunk : stream->chunks) {
      EXPECT_EQ(chunk.finish_reason(), v1::FINISH_REASON_UNSPECIFIED)
          << "a handed-back stream must not end as an answer";
    }
  }
  EXPECT_EQ(decode_->inflight(), 0u);
  v1::StartDecodeRequest local;
  local.set_request_id("late");
  for (int32_t t : Prompt(8, 1)) {
    local.mutable_local_prefill()->add_prompt_token_ids(t);
  }
  *local.mutable_sampling() = Greedy(4);
  auto late = std::make_shared<Stream>();
  EXPECT_EQ(decode_->StartDecode(local, SinkFor(late)).code(),
            absl::StatusCode::kUnavailable);
  // Only the unwritten admission's 2 blocks wait out their quarantine (a
  // writer may still be running).
  EXPECT_EQ(decode_->blocks().num_used_blocks(), 2);
}

TEST_F(DecodeWorkerTest, AdmitRefusals) {
  // 24 of the 32 blocks are taken; 40 more tokens need 10 blocks: not now
  // (but they would fit an empty pool, so not INVALID_ARGUMENT).
  absl::StatusOr<v1::AdmitResponse> big =
      decode_->Admit(AdmitFor("big", Prompt(96, 7)));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(decode_->Admit(AdmitFor("more", Prompt(40, 8))).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A refusal reserves nothing.
  EXPECT_EQ(decode_->Load().reserved_kv_blocks(), 24);
  EXPECT_EQ(decode_->inflight(), 1u);
  // More than the whole pool can never fit.
  EXPECT_EQ(decode_->Admit(AdmitFor("huge", Prompt(200, 9))).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::ReleaseRequest release;
  release.set_transfer_id(big->target().transfer_id());
  release.set_writes_quiesced(true);
  ASSERT_TRUE(decode_->Release(release).found());
  EXPECT_TRUE(decode_->Admit(AdmitFor("more", Prompt(40, 8))).ok());
  v1::CancelRequest cancel;
  cancel.set_request_id("more");
  EXPECT_TRUE(decode_->Cancel(cancel).found());

  // KV of another model is refused before anything is reserved.
  v1::AdmitRequest other_model = AdmitFor("other", Prompt(8, 1));
  other_model.mutable_writer_layout()->set_model_fingerprint("another-model");
  EXPECT_EQ(decode_->Admit(other_model).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // So is a writer with no transport in common.
  v1::AdmitRequest no_transport = AdmitFor("ucx-only", Prompt(8, 1));
  no_transport.clear_writer_transports();
  no_transport.add_writer_transports(v1::TRANSPORT_KIND_UCX);
  EXPECT_EQ(decode_->Admit(no_transport).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Malformed: no tokens, or a prompt longer than the tokens.
  v1::AdmitRequest empty = AdmitFor("empty", {});
  EXPECT_EQ(decode_->Admit(empty).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::AdmitRequest long_prompt = AdmitFor("long", Prompt(4, 1));
  long_prompt.set_num_prompt_tokens(5);
  EXPECT_EQ(decode_->Admit(long_prompt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode_->inflight(), 0u);

  decode_->BeginDrain();
  EXPECT_EQ(decode_->Admit(AdmitFor("late", Prompt(8, 1))).status().code(),
            absl::StatusCode::kUnavailable);
  v1::StartDecodeRequest local;
  local.set_request_id("late");
  for (int32_t t : Prompt(8, 1)) {
    local.mutable_local_prefill()->add_prompt_token_ids(t);
  }
  *local.mutable_sampling() = Greedy(4);
  auto stream = std::make_shared<Stream>();
  EXPECT_EQ(decode_->StartDecode(local, SinkFor(stream)).code(),
            absl::StatusCode::kUnavailable);
  // All that is left: the blocks of the cancelled "more", quarantined (its
  // writer might still be running).
  EXPECT_EQ(decode_->inflight(), 0u);
  EXPECT_EQ(decode_->Load().reserved_kv_blocks(), 10);
  EXPECT_EQ(decode_->blocks().num_used_blocks(), 10);
  EXPECT_FALSE(stream->ended.HasBeenNotified());
}

TEST_F(DecodeWorkerTest, StartDecodeRefusals) {
  const std::vector<int32_t> prompt = Prompt(14, 10);
  const v1::SamplingParams sampling = Greedy(6);
  auto stream = std::make_shared<Stream>();
  EXPECT_EQ(decode_
                ->StartDecode(StartFor("x", "decode-0/999", sampling, {1}),
                              SinkFor(stream))
                .code(),
            absl::StatusCode::kNotFound);

  absl::StatusOr<v1::AdmitResponse> admitted =
      decode_->Admit(AdmitFor("req", prompt));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const std::string transfer = admitted->target().transfer_id();
  // Admitted, but no KV has been verified yet.
  EXPECT_EQ(decode_
                ->StartDecode(StartFor("req", transfer, sampling, {1}),
                              SinkFor(stream))
                .code(),
            absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<v1::PrefillResponse> first =
      Prefill("req", prompt, sampling, admitted->target());
  ASSERT_TRUE(first.ok()) << first.status();
  const int32_t token = first->first_token_id();
  // The admitted tokens are the prompt alone: exactly one generated token
  // continues them; none, or two, do not.
  EXPECT_EQ(decode_
                ->StartDecode(StartFor("req", transfer, sampling, {}),
                              SinkFor(stream))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      decode_
          ->StartDecode(StartFor("req", transfer, sampling, {token, token}),
                        SinkFor(stream))
          .code(),
      absl::StatusCode::kInvalidArgument);
  // Another request's transfer.
  EXPECT_EQ(decode_
                ->StartDecode(StartFor("other", transfer, sampling, {token}),
                              SinkFor(stream))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Neither a transfer nor a local prefill.
  v1::StartDecodeRequest no_source =
      StartFor("req", transfer, sampling, {token});
  no_source.clear_kv_source();
  EXPECT_EQ(decode_->StartDecode(no_source, SinkFor(stream)).code(),
            absl::StatusCode::kInvalidArgument);
  // Refusals start nothing and call no sink.
  EXPECT_FALSE(stream->first_chunk.HasBeenNotified());
  EXPECT_FALSE(stream->ended.HasBeenNotified());

  // ... and leave the transfer in place: the right StartDecode still runs,
  // and matches the offline engine.
  auto good = std::make_shared<Stream>();
  ASSERT_TRUE(decode_
                  ->StartDecode(StartFor("req", transfer, sampling, {token}),
                                SinkFor(good))
                  .ok());
  ASSERT_TRUE(good->ended.WaitForNotificationWithTimeout(kWait));
  Generated served;
  served.tokens = {token};
  served.text = first->text();
  {
    absl::MutexLock lock(&good->mu);
    EXPECT_TRUE(good->end.ok()) << good->end;
    for (const v1::DecodeChunk& c : good->chunks) {
      served.tokens.insert(served.tokens.end(), c.token_ids().begin(),
                           c.token_ids().end());
      served.text += c.text();
    }
  }
  const Generated offline = RunOffline(prompt, sampling);
  EXPECT_EQ(served.tokens, offline.tokens);
  EXPECT_EQ(served.text, offline.text);
  // Consumed: a second StartDecode finds nothing.
  EXPECT_EQ(decode_
                ->StartDecode(StartFor("req", transfer, sampling, {token}),
                              SinkFor(stream))
                .code(),
            absl::StatusCode::kNotFound);
  ExpectAllBlocksFree();

  // Sampling the engine refuses, on a verified transfer: refused, and
  // whether or not the transfer survives the refusal, the router's Release
  // that follows leaves no block behind.
  absl::StatusOr<v1::AdmitResponse> again =
      decode_->Admit(AdmitFor("req2", prompt));
  ASSERT_TRUE(again.ok()) << again.status();
  first = Prefill("req2", prompt, sampling, again->target());
  ASSERT_TRUE(first.ok()) << first.status();
  v1::SamplingParams bad = sampling;
  bad.set_temperature(-1);
  EXPECT_EQ(decode_
                ->StartDecode(
                    StartFor("req2", again->target().transfer_id(), bad,
                             {static_cast<int32_t>(first->first_token_id())}),
                    SinkFor(stream))
                .code(),
            absl::StatusCode::kInvalidArgument);
  v1::ReleaseRequest release;
  release.set_transfer_id(again->target().transfer_id());
  release.set_writes_quiesced(true);
  decode_->Release(release);
  ExpectAllBlocksFree();
  EXPECT_FALSE(stream->first_chunk.HasBeenNotified());
  EXPECT_FALSE(stream->ended.HasBeenNotified());
}

// A request that moves after the client has seen some tokens (its decode
// worker died) continues exactly where the offline run would: through a
// transfer of prompt + sent tokens, or through a local prefill of them.
TEST_F(DecodeWorkerTest, MigratedRequestContinuesTheOfflineStream) {
  const std::vector<int32_t> prompt = Prompt(23, 0);
  const v1::SamplingParams sampling = Seeded(14);
  const Generated offline = RunOffline(prompt, sampling);
  ASSERT_EQ(offline.tokens.size(), 14u);
  ASSERT_EQ(offline.texts.size(), 14u);
  constexpr int kSent = 3;
  const std::vector<int32_t> sent(offline.tokens.begin(),
                                  offline.tokens.begin() + kSent);
  auto rest_of_text = [&](int from) {
    std::string text;
    for (size_t i = from; i < offline.texts.size(); ++i) {
      text += offline.texts[i];
    }
    return text;
  };
  // The chunks' tokens and text; the first chunk's offset is `offset`.
  auto collect = [&](Stream& stream, size_t offset, Generated* out) {
    absl::MutexLock lock(&stream.mu);
    EXPECT_TRUE(stream.end.ok()) << stream.end;
    for (const v1::DecodeChunk& c : stream.chunks) {
      EXPECT_EQ(c.generated_offset(), offset + out->tokens.size());
      out->tokens.insert(out->tokens.end(), c.token_ids().begin(),
                         c.token_ids().end());
      out->text += c.text();
    }
    ASSERT_FALSE(stream.chunks.empty());
    EXPECT_EQ(stream.chunks.back().usage().completion_tokens(), 14u);
  };

  {
    SCOPED_TRACE("transferred");
    v1::AdmitRequest admit = AdmitFor("moved", prompt);
    for (int32_t t : sent) admit.add_token_ids(t);
    absl::StatusOr<v1::AdmitResponse> admitted = decode_->Admit(admit);
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    EXPECT_EQ(admitted->target().num_tokens(), prompt.size() + kSent);
    absl::StatusOr<v1::PrefillResponse> answer =
        Prefill("moved", prompt, sampling, admitted->target(), sent);
    ASSERT_TRUE(answer.ok()) << answer.status();
    const v1::PrefillResponse& first = *answer;
    EXPECT_EQ(first.first_token_id(), offline.tokens[kSent]);
    std::vector<int32_t> generated = sent;
    generated.push_back(first.first_token_id());
    auto stream = std::make_shared<Stream>();
    ASSERT_TRUE(
        decode_
            ->StartDecode(StartFor("moved", admitted->target().transfer_id(),
                                   sampling, generated),
                          SinkFor(stream))
            .ok());
    ASSERT_TRUE(stream->ended.WaitForNotificationWithTimeout(kWait));
    // Decoding continues after the sent tokens and the prefill's one.
    Generated decoded;
    ASSERT_NO_FATAL_FAILURE(collect(*stream, kSent + 1, &decoded));
    Generated served;
    served.tokens = generated;
    served.tokens.insert(served.tokens.end(), decoded.tokens.begin(),
                         decoded.tokens.end());
    served.text = first.text() + decoded.text;
    EXPECT_EQ(served.tokens, offline.tokens);
    EXPECT_EQ(served.text, rest_of_text(kSent));
    ExpectAllBlocksFree();
  }
  {
    SCOPED_TRACE("local prefill");
    v1::StartDecodeRequest r;
    r.set_request_id("moved-local");
    r.set_attempt(1);
    for (int32_t t : prompt) r.mutable_local_prefill()->add_prompt_token_ids(t);
    for (int32_t t : sent) r.add_generated_token_ids(t);
    *r.mutable_sampling() = sampling;
    auto stream = std::make_shared<Stream>();
    ASSERT_TRUE(decode_->StartDecode(r, SinkFor(stream)).ok());
    ASSERT_TRUE(stream->ended.WaitForNotificationWithTimeout(kWait));
    Generated decoded;
    ASSERT_NO_FATAL_FAILURE(collect(*stream, kSent, &decoded));
    std::vector<int32_t> served = sent;
    served.insert(served.end(), decoded.tokens.begin(), decoded.tokens.end());
    EXPECT_EQ(served, offline.tokens);
    EXPECT_EQ(decoded.text, rest_of_text(kSent));
    ExpectAllBlocksFree();
  }
}

// An admission whose writer never completes, and one cancelled while its
// writer might still run, hold their blocks through time to live plus
// quarantine (a late write must not land in reused blocks), then give them
// back.
TEST_F(DecodeWorkerTest, AbandonedAdmissionsExpireAndTheirBlocksComeBack) {
  const absl::Duration ttl = absl::Milliseconds(300);
  const absl::Duration quarantine = absl::Milliseconds(100);
  ASSERT_NO_FATAL_FAILURE(StartWorkers(ttl, quarantine));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::AdmitResponse> abandoned =
      decode_->Admit(AdmitFor("abandoned", Prompt(20, 11)));
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  EXPECT_EQ(abandoned->target().expires_in_ms(), 300u);
  absl::StatusOr<v1::AdmitResponse> cancelled =
      decode_->Admit(AdmitFor("cancelled", Prompt(12, 12)));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(decode_->blocks().num_used_blocks(), 5 + 3);

  v1::CancelRequest cancel;
  cancel.set_request_id("cancelled");
  EXPECT_TRUE(decode_->Cancel(cancel).found());
  // Gone from the ledger, but its blocks stay quarantined.
  EXPECT_EQ(decode_->inflight(), 1u);
  EXPECT_EQ(decode_->blocks().num_used_blocks(), 8);

  ASSERT_TRUE(Eventually([&] {
    return decode_->blocks().num_used_blocks() == 0 &&
           decode_->Load().reserved_kv_blocks() == 0;
  })) << decode_->blocks().num_used_blocks()
      << " blocks still used";
  EXPECT_GE(absl::Now() - start, ttl + quarantine);
  ExpectAllBlocksFree();
  // An expired transfer is unknown: its notice and StartDecode are refused.
  v1::KvTransferComplete late;
  late.set_transfer_id(abandoned->target().transfer_id());
  EXPECT_EQ(decode_->CompleteTransfer(late).status().code(),
            absl::StatusCode::kNotFound);
}

// A transfer that was verified but never started (the router died between
// the first token and StartDecode) is freed after the time to live too.
TEST_F(DecodeWorkerTest, VerifiedTransferNobodyDecodesIsFreed) {
  // Long enough for the prefill to finish well within the admission's life.
  const absl::Duration ttl = absl::Seconds(2);
  ASSERT_NO_FATAL_FAILURE(StartWorkers(ttl, absl::Milliseconds(100)));
  const std::vector<int32_t> prompt = Prompt(9, 13);
  absl::StatusOr<v1::AdmitResponse> admitted =
      decode_->Admit(AdmitFor("orphan", prompt));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  // The transfer is verified after this, so freed no sooner than ttl later.
  const absl::Time before_prefill = absl::Now();
  ASSERT_TRUE(Prefill("orphan", prompt, Greedy(4), admitted->target()).ok());
  EXPECT_EQ(decode_->blocks().num_used_blocks(), 3);
  EXPECT_EQ(decode_->inflight(), 1u);
  ASSERT_TRUE(Eventually([&] { return decode_->inflight() == 0; }));
  EXPECT_GE(absl::Now() - before_prefill, ttl);
  ExpectAllBlocksFree();
}

// A worker's gRPC service is up before Start (which needs the address it
// serves at), so calls can arrive before it: they are refused, never a
// crash, and nothing is reserved.
TEST_F(DecodeWorkerTest, CallsBeforeStartAreRefused) {
  DecodeWorkerOptions d;
  d.worker_id = "decode-1";
  d.engine.runner = Runner(kDecodeBlocks);
  d.transport.kind = v1::TRANSPORT_KIND_IN_PROCESS;
  auto created = DecodeWorker::Create(*model_, d);
  ASSERT_TRUE(created.ok()) << created.status();
  DecodeWorker& early = **created;
  EXPECT_EQ(early.Admit(AdmitFor("early", Prompt(8, 1))).status().code(),
            absl::StatusCode::kUnavailable);
  v1::KvTransferComplete notice;
  notice.set_transfer_id("decode-1/1");
  EXPECT_EQ(early.CompleteTransfer(notice).status().code(),
            absl::StatusCode::kNotFound);
  auto stream = std::make_shared<Stream>();
  EXPECT_EQ(early
                .StartDecode(StartFor("early", "decode-1/1", Greedy(4), {1}),
                             SinkFor(stream))
                .code(),
            absl::StatusCode::kNotFound);
  v1::ReleaseRequest release;
  release.set_transfer_id("decode-1/1");
  EXPECT_FALSE(early.Release(release).found());
  v1::CancelRequest cancel;
  cancel.set_request_id("early");
  EXPECT_FALSE(early.Cancel(cancel).found());
  const v1::WorkerLoad load = early.Load();
  EXPECT_EQ(load.reserved_kv_blocks(), 0);
  EXPECT_EQ(load.free_kv_blocks(), kDecodeBlocks);
  EXPECT_EQ(early.inflight(), 0u);
  EXPECT_EQ(early.blocks().num_used_blocks(), 0);
}

}  // namespace
}  // namespace pdserve::decode_worker
