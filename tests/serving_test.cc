// Disaggregated serving end to end: a router, prefill and decode workers as
// real processes on loopback, KV moving over UCX, answering gRPC and OpenAI
// HTTP clients. Every answer is checked against the offline engine run on
// the same model in this process: the cluster must not change a single
// token, greedy or seeded.
//
// Tests that need the real default model (KV-aware routing's latency, the
// official clients) use the default model (model::FindDefaultModel) and skip,
// saying so, without it; the rest
// run on a tiny generated model.
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/generate_client.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "engine/llm_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "model/default_model.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using ::testing::HasSubstr;

using testing::ExpectSameAnswer;
using testing::Generate;
using testing::OfflineEngine;
using testing::Outcome;
using testing::Seed;
using testing::TextRequest;
using testing::TokenRequest;

// A varied set: plain text, chat, seeded sampling with penalties and a stop
// string, pre-tokenized prompts spanning several KV blocks.
std::vector<v1::GenerateRequest> MixedRequests(int32_t vocab) {
  std::vector<v1::GenerateRequest> requests;
  requests.push_back(TextRequest("The capital of France is", 16));
  v1::GenerateRequest chat;
  v1::ChatMessage* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Name three colors.");
  chat.mutable_sampling()->set_temperature(0);
  chat.mutable_sampling()->set_max_tokens(20);
  chat.mutable_stream_options()->set_include_usage(true);
  chat.mutable_stream_options()->set_include_timing(true);
  requests.push_back(chat);
  v1::GenerateRequest seeded = TextRequest("Once upon a time", 16);
  Seed(&seeded, 7);
  requests.push_back(seeded);
  v1::GenerateRequest penalised = TextRequest("My favourite food is", 24);
  Seed(&penalised, 11);
  penalised.mutable_sampling()->set_presence_penalty(0.5f);
  penalised.mutable_sampling()->set_frequency_penalty(0.3f);
  penalised.mutable_sampling()->add_stop(".");
  requests.push_back(penalised);
  v1::GenerateRequest with_logprobs = TokenRequest(70, 1, 12, vocab);
  with_logprobs.mutable_sampling()->set_logprobs(true);
  with_logprobs.mutable_sampling()->set_top_logprobs(3);
  requests.push_back(with_logprobs);
  v1::GenerateRequest long_seeded = TokenRequest(45, 2, 10, vocab);
  Seed(&long_seeded, 3);
  requests.push_back(long_seeded);
  return requests;
}

struct ClusterShape {
  int prefill = 1;
  int decode = 1;
  int colocated = 0;
};

class ServingTest : public ::testing::Test {
 protected:
  void Start(const std::string& name, const std::string& model_path,
             ClusterShape shape, std::vector<std::string> router_args = {},
             std::vector<std::string> worker_args = {}) {
    cli::LocalClusterOptions options;
    options.bin_dir = testing::BinDir();
    options.work_dir = testing::MakeWorkDir(name);
    options.model_path = model_path;
    options.num_prefill = shape.prefill;
    options.num_decode = shape.decode;
    options.num_colocated = shape.colocated;
    options.heartbeat = absl::Milliseconds(200);
    options.startup_timeout = absl::Seconds(60);
    options.router_args = std::move(router_args);
    options.worker_args = {"--threads=1"};
    options.worker_args.insert(options.worker_args.end(), worker_args.begin(),
                               worker_args.end());
    auto cluster = cli::LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop(absl::Seconds(20)).ok());
    }
  }

  // Waits until every worker reports (by heartbeat) all its KV blocks free
  // and nothing reserved or in flight.
  void ExpectKvIdle(absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time give_up = absl::Now() + timeout;
    std::string busy;
    while (absl::Now() < give_up) {
      auto listed =
          cli::ListWorkers(cluster_->control_address(),
                           v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5));
      ASSERT_TRUE(listed.ok()) << listed.status();
      busy.clear();
      for (const v1::WorkerInfo& w : listed->workers()) {
        const v1::WorkerLoad& l = w.load();
        if (l.total_kv_blocks() == 0 ||
            l.free_kv_blocks() != l.total_kv_blocks() ||
            l.reserved_kv_blocks() != 0 || w.inflight_requests() != 0) {
          absl::StrAppend(&busy, w.worker_id(), " free ", l.free_kv_blocks(),
                          "/", l.total_kv_blocks(), " reserved ",
                          l.reserved_kv_blocks(), " in flight ",
                          w.inflight_requests(), "; ");
        }
      }
      if (busy.empty()) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "KV blocks still in use: " << busy;
  }

  // The workers' KV block size, in tokens.
  int32_t BlockSize() {
    auto listed =
        cli::ListWorkers(cluster_->control_address(),
                         v1::WORKER_ROLE_UNSPECIFIED, absl::Seconds(5));
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok() || listed->workers().empty()) return 1;
    return listed->workers(0).model().kv_layout().block_size_tokens();
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
};

TEST_F(ServingTest, DisaggregatedOutputsMatchTheOfflineEngine) {
  const std::string model = testing::TinyModelPath();
  OfflineEngine offline(model);
  const std::vector<v1::GenerateRequest> requests =
      MixedRequests(offline.model().config().vocab_size);
  for (const ClusterShape shape :
       {ClusterShape{1, 1, 0}, ClusterShape{2, 2, 0}, ClusterShape{0, 0, 1}}) {
    const std::string name = absl::StrCat(
        "match-", shape.prefill, "p", shape.decode, "d", shape.colocated, "c");
    Start(name, model, shape);
    const int32_t block_size = BlockSize();
    for (size_t i = 0; i < requests.size(); ++i) {
      // Twice each: the second run hits the prefix caches.
      for (int round = 0; round < 2; ++round) {
        const Outcome got = Generate(cluster_->router_address(), requests[i]);
        const Outcome expected = offline.Run(requests[i]);
        const std::string what =
            absl::StrCat(name, " request ", i, " round ", round);
        ExpectSameAnswer(got, expected, what);
        if (round == 0) {
          // A load report from the middle of round 0 would steer round 1
          // away from the worker holding its prompt.
          ExpectKvIdle();
        } else {
          // Every whole block of the prompt but one holding its last token
          // (which is always computed) comes from the cache.
          const uint32_t prompt = expected.usage.prompt_tokens();
          EXPECT_EQ(got.usage.cached_prompt_tokens(),
                    (prompt - 1) / block_size * block_size)
              << what << ", a " << prompt << "-token prompt";
        }
        if (shape.colocated == 0) {
          EXPECT_THAT(got.timing.prefill_worker_id(), HasSubstr("prefill-"));
          EXPECT_THAT(got.timing.decode_worker_id(), HasSubstr("decode-"));
        } else {
          EXPECT_EQ(got.timing.decode_worker_id(), "colocated-0");
        }
      }
    }
    ExpectKvIdle();
    ASSERT_TRUE(cluster_->Stop(absl::Seconds(20)).ok());
    cluster_.reset();
  }
}

TEST_F(ServingTest, DefaultModelThroughTheClusterMatchesTheOfflineEngine) {
  const std::string model = testing::DefaultModelPathOrEmpty();
  if (model.empty()) GTEST_SKIP() << model::kNoDefaultModel;
  OfflineEngine offline(model);
  Start("default-model", model, {1, 1, 0}, {}, {"--kv_cache_mb=64"});
  std::vector<v1::GenerateRequest> requests =
      MixedRequests(offline.model().config().vocab_size);
  requests.resize(4);  // the text and chat ones: real text through real UCX
  for (size_t i = 0; i < requests.size(); ++i) {
    ExpectSameAnswer(Generate(cluster_->router_address(), requests[i]),
                     offline.Run(requests[i]), absl::StrCat("request ", i));
  }
  ExpectKvIdle();
}

// An FP8 KV cache on both workers: the KV moves between them in that
// layout (half the bytes) and the answers are the offline engine's with the
// same cache, token for token.
TEST_F(ServingTest, Fp8KvCacheThroughTheClusterMatchesTheOfflineEngine) {
  const std::string model = testing::TinyModelPath();
  OfflineEngine offline(model, v1::KV_DTYPE_FP8_E4M3);
  OfflineEngine offline_fp16(model);
  const std::vector<v1::GenerateRequest> requests =
      MixedRequests(offline.model().config().vocab_size);
  Start("fp8-kv", model, {1, 1, 0}, {}, {"--kv_cache_dtype=fp8_e4m3"});
  int differs_from_fp16 = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome got = Generate(cluster_->router_address(), requests[i]);
    ExpectSameAnswer(got, offline.Run(requests[i]),
                     absl::StrCat("request ", i));
    differs_from_fp16 += !IsSameAnswer(got, offline_fp16.Run(requests[i]));
  }
  // The workers did keep fp8: some answer (logprobs at least) differs from
  // the fp16 cache's.
  EXPECT_GT(differs_from_fp16, 0);
  ExpectKvIdle();
}

TEST_F(ServingTest, SixtyFourConcurrentStreamsAllCompleteCorrectly) {
  const std::string model = testing::TinyModelPath();
  OfflineEngine offline(model);
  const int32_t vocab = offline.model().config().vocab_size;
  Start("concurrent", model, {1, 1, 0}, {}, {"--kv_cache_mb=16"});
  constexpr int kRequests = 64;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    v1::GenerateRequest r =
        TokenRequest(3 + (i * 37) % 180, i, 1 + (i * 7) % 40, vocab);
    if (i % 2 == 1) Seed(&r, 1000 + i);
    requests.push_back(r);
  }
  std::vector<Outcome> got(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back(
        [&, i] { got[i] = Generate(cluster_->router_address(), requests[i]); });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ExpectSameAnswer(got[i], offline.Run(requests[i]),
                     absl::StrCat("request ", i));
  }
  ExpectKvIdle();
}

TEST_F(ServingTest, ConditionalDisaggregationPrefillsShortPromptsLocally) {
  const std::string model = testing::TinyModelPath();
  OfflineEngine offline(model);
  const int32_t vocab = offline.model().config().vocab_size;
  Start("conditional", model, {1, 1, 0},
        {"--local_prefill_max_uncached_tokens=32"});
  const v1::GenerateRequest short_prompt = TokenRequest(20, 5, 8, vocab);
  const v1::GenerateRequest long_prompt = TokenRequest(100, 6, 8, vocab);
  Outcome got = Generate(cluster_->router_address(), short_prompt);
  ExpectSameAnswer(got, offline.Run(short_prompt), "short");
  EXPECT_EQ(got.timing.prefill_worker_id(), "");
  got = Generate(cluster_->router_address(), long_prompt);
  ExpectSameAnswer(got, offline.Run(long_prompt), "long");
  EXPECT_EQ(got.timing.prefill_worker_id(), "prefill-0");

  // The threshold changes at run time through the admin API.
  v1::RoutingConfig config;
  config.set_policy(v1::ROUTING_POLICY_LEAST_LOADED);
  config.set_local_prefill_max_uncached_tokens(0);
  auto set = cli::SetRoutingPolicy(cluster_->control_address(), config,
                                   absl::Seconds(5));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->previous().policy(), v1::ROUTING_POLICY_KV_AWARE);
  got = Generate(cluster_->router_address(), short_prompt);
  ExpectSameAnswer(got, offline.Run(short_prompt), "short, after");
  EXPECT_EQ(got.timing.prefill_worker_id(), "prefill-0");
  ExpectKvIdle();
}

// KV-aware routing sends a prompt to the prefill worker that holds its
// prefix. Idle workers tie, and a tie goes to the first by id (prefill-0),
// so the prefix is placed on prefill-1: its first prompt arrives while
// prefill-0 computes a long one. With both idle again, only the router's
// prefix index (worker cache events -> heartbeats -> index) can send the
// repeats to prefill-1 rather than prefill-0.
TEST_F(ServingTest, KvAwareRoutingSendsASharedPrefixToTheWorkerHoldingIt) {
  const std::string model = testing::DefaultModelPathOrEmpty();
  if (model.empty()) GTEST_SKIP() << model::kNoDefaultModel;
  Start("kv-aware", model, {2, 1, 0}, {"--routing_policy=kv_aware"},
        {"--kv_cache_mb=64"});
  constexpr int32_t kVocab = 49152;
  // 256 shared tokens (16 blocks), then a distinct tail.
  auto prompt = [&](int prefix_salt, int tail_salt) {
    v1::GenerateRequest r = TokenRequest(256, prefix_salt, 4, kVocab);
    v1::GenerateRequest tail = TokenRequest(24, tail_salt, 4, kVocab);
    r.mutable_token_ids()->mutable_ids()->MergeFrom(tail.token_ids().ids());
    return r;
  };

  // Occupy prefill-0 with a long prompt: seconds of prefill on one thread,
  // while the first prefix prompt is sent within a heartbeat (200 ms) of
  // prefill-0 reporting it. Its length comes from this machine's speed,
  // measured first on a 256-token prompt (which goes to prefill-0, where
  // ties go): about 3 s of prefill, up to 1024 tokens (about 2 s on AMD
  // Zen 4 with AVX-512; without AVX-512 attention runs the portable kernels
  // and a 1024-token prompt takes minutes in a fastbuild).
  const Outcome calibration =
      Generate(cluster_->router_address(), TokenRequest(256, 98, 1, kVocab));
  ASSERT_TRUE(calibration.status.ok()) << calibration.status;
  ASSERT_EQ(calibration.timing.prefill_worker_id(), "prefill-0");
  ExpectKvIdle();
  const double ms_per_token =
      std::max(calibration.timing.prefill_compute_ms(), 1.0) / 256;
  const int32_t long_tokens =
      static_cast<int32_t>(std::clamp(3000.0 / ms_per_token, 256.0, 1024.0));
  const v1::GenerateRequest long_prompt =
      TokenRequest(long_tokens, 99, 1, kVocab);
  Outcome occupied;
  std::atomic<bool> occupied_done{false};
  std::thread occupier([&] {
    occupied = Generate(cluster_->router_address(), long_prompt);
    occupied_done = true;
  });
  bool busy = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!busy && !occupied_done && absl::Now() < give_up) {
    auto listed = cli::ListWorkers(cluster_->control_address(),
                                   v1::WORKER_ROLE_PREFILL, absl::Seconds(5));
    if (!listed.ok()) {
      ADD_FAILURE() << listed.status();
      break;
    }
    for (const v1::WorkerInfo& w : listed->workers()) {
      busy |=
          w.worker_id() == "prefill-0" &&
          (w.inflight_requests() > 0 || w.load().queued_prefill_tokens() > 0);
    }
    if (!busy) absl::SleepFor(absl::Milliseconds(10));
  }
  const Outcome first = Generate(cluster_->router_address(), prompt(1, 10));
  occupier.join();
  ASSERT_TRUE(busy) << "prefill-0 never reported the long prompt";
  ASSERT_TRUE(occupied.status.ok()) << occupied.status;
  ASSERT_EQ(occupied.timing.prefill_worker_id(), "prefill-0");
  ASSERT_TRUE(first.status.ok()) << first.status;
  ASSERT_EQ(first.timing.prefill_worker_id(), "prefill-1")
      << "prefill-0 was done with the long prompt (prefill "
      << occupied.timing.prefill_compute_ms()
      << " ms) before the first prefix prompt was routed";
  EXPECT_EQ(first.usage.cached_prompt_tokens(), 0u);

  // Idle again (a busy worker's load would steer the choice), and
  // prefill-1's heartbeats have carried its prefix-cache events.
  ExpectKvIdle();
  absl::SleepFor(absl::Milliseconds(800));
  Outcome warm;
  for (int tail = 11; tail <= 13; ++tail) {
    warm = Generate(cluster_->router_address(), prompt(1, tail));
    ASSERT_TRUE(warm.status.ok()) << warm.status;
    EXPECT_EQ(warm.timing.prefill_worker_id(), "prefill-1") << "tail " << tail;
    EXPECT_GE(warm.usage.cached_prompt_tokens(), 256u) << "tail " << tail;
    ExpectKvIdle();
  }
  // A prompt nobody holds goes where ties go, and is computed in full.
  const Outcome cold = Generate(cluster_->router_address(), prompt(2, 14));
  ASSERT_TRUE(cold.status.ok()) << cold.status;
  EXPECT_EQ(cold.timing.prefill_worker_id(), "prefill-0");
  EXPECT_EQ(cold.usage.cached_prompt_tokens(), 0u);
  // 24 tokens computed instead of 280.
  EXPECT_LT(warm.timing.ttft_ms(), cold.timing.ttft_ms());
  EXPECT_LT(warm.timing.prefill_compute_ms(),
            cold.timing.prefill_compute_ms() / 2);
  ExpectKvIdle();
}

// Bad input gets its error over both APIs, and the router keeps serving.
TEST_F(ServingTest, BadInputsGetClearErrorsAndTheRouterKeepsServing) {
  const std::string model = testing::TinyModelPath();
  OfflineEngine offline(model);
  const int32_t vocab = offline.model().config().vocab_size;
  const int32_t context = offline.model().config().context_length;
  Start("bad-input", model, {1, 1, 0});
  const std::string grpc = cluster_->router_address();
  struct Case {
    std::string what;
    v1::GenerateRequest request;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"empty text", TextRequest("", 4),
                   absl::StatusCode::kInvalidArgument, "empty"});
  v1::GenerateRequest none;
  cases.push_back({"no prompt", none, absl::StatusCode::kInvalidArgument,
                   "prompt is required"});
  cases.push_back({"over-long prompt", TokenRequest(context, 1, 4, vocab),
                   absl::StatusCode::kInvalidArgument, "context"});
  v1::GenerateRequest bad_token = TokenRequest(5, 1, 4, vocab);
  bad_token.mutable_token_ids()->add_ids(vocab + 5);
  cases.push_back({"token outside the vocabulary", bad_token,
                   absl::StatusCode::kInvalidArgument, "vocabulary"});
  v1::GenerateRequest bad_temperature = TextRequest("hi", 4);
  bad_temperature.mutable_sampling()->set_temperature(-1);
  cases.push_back({"negative temperature", bad_temperature,
                   absl::StatusCode::kInvalidArgument, "temperature"});
  v1::GenerateRequest bad_top_p = TextRequest("hi", 4);
  bad_top_p.mutable_sampling()->set_top_p(1.5f);
  cases.push_back({"top_p above 1", bad_top_p,
                   absl::StatusCode::kInvalidArgument, "top_p"});
  v1::GenerateRequest bad_bias = TextRequest("hi", 4);
  (*bad_bias.mutable_sampling()->mutable_logit_bias())[vocab] = 1.0f;
  cases.push_back({"logit_bias outside the vocabulary", bad_bias,
                   absl::StatusCode::kInvalidArgument, "logit_bias"});
  v1::GenerateRequest unknown_model = TextRequest("hi", 4);
  unknown_model.set_model("no-such-model");
  cases.push_back({"unknown model", unknown_model, absl::StatusCode::kNotFound,
                   "no-such-model"});
  for (const Case& c : cases) {
    const Outcome got = Generate(grpc, c.request);
    EXPECT_EQ(got.status.code(), c.code) << c.what << ": " << got.status;
    EXPECT_THAT(std::string(got.status.message()), HasSubstr(c.message))
        << c.what;
    EXPECT_EQ(got.chunks, 0) << c.what;
  }

  httplib::Client http(cluster_->http_url());
  http.set_read_timeout(60, 0);
  struct HttpCase {
    std::string what;
    std::string path;
    std::string body;
    int status;
    std::string message;
  };
  const std::vector<HttpCase> http_cases = {
      {"malformed JSON", "/v1/completions", "{\"prompt\": ", 400, "JSON"},
      {"negative temperature", "/v1/completions",
       R"({"prompt": "hi", "temperature": -1})", 400, "temperature"},
      {"no messages", "/v1/chat/completions", R"({"max_tokens": 4})", 400,
       "messages"},
      {"empty prompt", "/v1/completions", R"({"prompt": ""})", 400, "empty"},
      {"unknown model", "/v1/completions",
       R"({"model": "no-such-model", "prompt": "hi"})", 404, "no-such-model"},
      {"unknown path", "/v1/nothing", "{}", 404, ""},
      {"logit_bias outside the vocabulary", "/v1/completions",
       absl::StrCat(R"({"prompt": "hi", "logit_bias": {")", vocab, R"(": 1}})"),
       400, "logit_bias"},
      {"chat message without content", "/v1/chat/completions",
       R"({"messages": [{"role": "user"}]})", 400, "messages[0].content"},
  };
  for (const HttpCase& c : http_cases) {
    auto res = http.Post(c.path, c.body, "application/json");
    ASSERT_TRUE(res) << c.what << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, c.status) << c.what << ": " << res->body;
    EXPECT_THAT(res->body, HasSubstr("\"error\"")) << c.what;
    EXPECT_THAT(res->body, HasSubstr(c.message)) << c.what;
  }

  // Still serving, over both APIs.
  const v1::GenerateRequest good = TokenRequest(10, 3, 6, vocab);
  ExpectSameAnswer(Generate(grpc, good), offline.Run(good), "after errors");
  auto ok =
      http.Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 4})",
                "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;

  // logit_bias takes effect end to end: +100 on a token greedy decoding
  // does not pick makes it the first token, over both APIs. The token is
  // one whose text is plain ASCII, so the HTTP answer can be matched.
  v1::GenerateRequest biased = TokenRequest(10, 4, 4, vocab);
  const Outcome plain = offline.Run(biased);
  ASSERT_TRUE(plain.status.ok()) << plain.status;
  ASSERT_FALSE(plain.tokens.empty());
  uint32_t forced = 0;
  std::string forced_text;
  for (uint32_t id = 3; id < static_cast<uint32_t>(vocab); ++id) {
    if (std::find(plain.tokens.begin(), plain.tokens.end(),
                  static_cast<int32_t>(id)) != plain.tokens.end()) {
      continue;
    }
    auto piece = offline.model().tokenizer().TokenToPiece(
        static_cast<int32_t>(id), /*render_special=*/false);
    if (piece.ok() && !piece->empty() &&
        std::all_of(piece->begin(), piece->end(),
                    [](char c) { return absl::ascii_isalnum(c); })) {
      forced = id;
      forced_text = *piece;
      break;
    }
  }
  ASSERT_FALSE(forced_text.empty()) << "no plain-text token to force";
  (*biased.mutable_sampling()->mutable_logit_bias())[forced] = 100.0f;
  const Outcome expected = offline.Run(biased);
  ASSERT_FALSE(expected.tokens.empty());
  EXPECT_EQ(expected.tokens[0], static_cast<int32_t>(forced));
  const Outcome got = Generate(grpc, biased);
  ExpectSameAnswer(got, expected, "logit_bias over gRPC");
  std::string ids;
  for (uint32_t id : biased.token_ids().ids()) {
    absl::StrAppend(&ids, ids.empty() ? "" : ",", id);
  }
  auto biased_http = http.Post(
      "/v1/completions",
      absl::StrCat(R"({"prompt": [)", ids,
                   R"(], "max_tokens": 1, "temperature": 0, "logit_bias": {")",
                   forced, R"(": 100}})"),
      "application/json");
  ASSERT_TRUE(biased_http);
  EXPECT_EQ(biased_http->status, 200) << biased_http->body;
  EXPECT_THAT(biased_http->body,
              HasSubstr(absl::StrCat(R"("text":")", forced_text, R"(")")));
  ExpectKvIdle();
}

// Runs a Python client check (tests/clients/) against the cluster.
struct ScriptResult {
  int exit_code = -1;
  std::string output;
};

ScriptResult RunScript(const std::string& script, std::vector<std::string> args,
                       const std::string& work_dir) {
  SubprocessOptions options;
  options.argv = {std::getenv("PDSERVE_PYTHON"),
                  absl::StrCat(testing::BinDir(), "/tests/clients/", script)};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.log_path = absl::StrCat(work_dir, "/", script, ".log");
  auto process = Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return {};
  absl::StatusOr<int> status = (*process)->Wait(absl::Seconds(300));
  EXPECT_TRUE(status.ok()) << script << " did not finish: " << status.status();
  ScriptResult result;
  result.output = cli::TailOfFile(options.log_path, 100000);
  if (status.ok() && WIFEXITED(*status))
    result.exit_code = WEXITSTATUS(*status);
  return result;
}

// The token ids of the line with `"mode": "greedy"` in a script's output.
std::vector<int32_t> GreedyTokens(const std::string& output) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::StrContains(line, "\"mode\": \"greedy\"")) continue;
    const size_t start = line.find("\"token_ids\": [");
    if (start == absl::string_view::npos) continue;
    const size_t end = line.find(']', start);
    std::vector<int32_t> ids;
    for (absl::string_view field :
         absl::StrSplit(line.substr(start + 14, end - start - 14), ',',
                        absl::SkipWhitespace())) {
      int32_t id = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(field), &id)) {
        ids.push_back(id);
      }
    }
    return ids;
  }
  return {};
}

// The JSON objects among a script's output lines.
std::vector<nlohmann::json> JsonLines(const std::string& output) {
  std::vector<nlohmann::json> objects;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::StartsWith(line, "{")) continue;
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
    if (parsed.is_object()) objects.push_back(std::move(parsed));
  }
  return objects;
}

TEST_F(ServingTest, OfficialOpenAiAndGrpcioClientsStreamFromTheRouter) {
  if (std::getenv("PDSERVE_PYTHON") == nullptr) {
    GTEST_SKIP() << "PDSERVE_PYTHON is not set (scripts/python_env.sh)";
  }
  std::string model = testing::DefaultModelPathOrEmpty();
  if (model.empty()) model = testing::TinyModelPath();
  Start("clients", model, {1, 1, 0}, {}, {"--kv_cache_mb=64"});
  const std::string dir = testing::MakeWorkDir("clients");
  const std::string proto_root = absl::StrCat(testing::BinDir());
  ScriptResult grpc = RunScript(
      "grpc_generate_check.py",
      {"--grpc", cluster_->router_address(), "--seed", "7", "--proto_root",
       proto_root, "--prompt", "The capital of France is"},
      dir);
  EXPECT_EQ(grpc.exit_code, 0) << grpc.output;
  // The greedy answer the Python client got is the offline engine's.
  OfflineEngine offline(model);
  const Outcome expected =
      offline.Run(TextRequest("The capital of France is", 16));
  EXPECT_EQ(GreedyTokens(grpc.output), expected.tokens) << grpc.output;

  ScriptResult openai =
      RunScript("openai_check.py",
                {"--base_url", absl::StrCat(cluster_->http_url(), "/v1"),
                 "--prompt", "The capital of France is"},
                dir);
  EXPECT_EQ(openai.exit_code, 0) << openai.output;
  // Each answer the official client got (completions and chat, streamed
  // and not) is the offline engine's.
  v1::GenerateRequest chat;
  v1::ChatMessage* message = chat.mutable_chat()->add_messages();
  message->set_role("user");
  message->set_content("The capital of France is");
  chat.mutable_sampling()->set_temperature(0);
  chat.mutable_sampling()->set_max_tokens(16);
  const Outcome expected_chat = offline.Run(chat);
  ASSERT_TRUE(expected_chat.status.ok()) << expected_chat.status;
  int compared = 0;
  for (const nlohmann::json& record : JsonLines(openai.output)) {
    const std::string api = record.value("api", "");
    const Outcome* want = api == "openai-completions" ? &expected
                          : api == "openai-chat"      ? &expected_chat
                                                      : nullptr;
    if (want == nullptr) continue;
    ++compared;
    const std::string what = record.dump();
    EXPECT_EQ(record.value("text", ""), want->text) << what;
    EXPECT_EQ(record.value("finish_reason", ""),
              want->finish == v1::FINISH_REASON_LENGTH ? "length" : "stop")
        << what;
    const nlohmann::json usage = record.value("usage", nlohmann::json());
    EXPECT_EQ(usage.is_object() ? usage.value("completion_tokens", 0u) : 0u,
              want->tokens.size())
        << what;
  }
  EXPECT_EQ(compared, 4) << openai.output;
  ExpectKvIdle();
}

}  // namespace
}  // namespace pdserve
