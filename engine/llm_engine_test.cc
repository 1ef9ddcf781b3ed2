// The continuous-batching scheduler on a tiny model: whatever the mix of
// requests, the token budget, the KV cache size (preemption) or the prefix
// cache, each request gets the tokens it gets when it runs alone.
#include "engine/llm_engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"
#include "model/tiny_model.h"

namespace pdserve::engine {
namespace {

class LlmEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("TEST_TMPDIR");
    const std::string path =
        std::string(dir != nullptr ? dir : "/tmp") + "/engine_tiny.gguf";
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

  static std::unique_ptr<LlmEngine> MakeEngine(int32_t num_blocks,
                                               int32_t batch_tokens,
                                               bool prefix_cache = true) {
    EngineOptions o;
    o.runner.block_size = 4;
    o.runner.num_blocks = num_blocks;
    o.runner.max_batch_tokens = batch_tokens;
    o.runner.enable_prefix_cache = prefix_cache;
    auto e = LlmEngine::Create(*model_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p(n);
    const int vocab = model_->config().vocab_size;
    for (int i = 0; i < n; ++i) p[i] = (i * 31 + salt * 97 + 3) % (vocab - 2);
    return p;
  }

  struct Result {
    std::vector<int32_t> tokens;
    std::string text;
    RequestFinish finish = RequestFinish::kNone;
    int32_t cached = 0;
    int outputs = 0;
  };

  // Runs the requests together through one engine.
  static std::vector<Result> RunAll(LlmEngine& engine,
                                    std::vector<EngineRequest> requests) {
    std::vector<Result> results(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].on_output = [&results, i](const RequestOutput& out) {
        Result& r = results[i];
        EXPECT_EQ(r.finish, RequestFinish::kNone) << "output after the end";
        r.tokens.insert(r.tokens.end(), out.token_ids.begin(),
                        out.token_ids.end());
        r.text += out.text;
        r.finish = out.finish;
        r.cached = out.cached_tokens;
        ++r.outputs;
      };
      EXPECT_TRUE(engine.AddRequest(std::move(requests[i])).ok());
    }
    EXPECT_TRUE(engine.RunUntilIdle().ok());
    return results;
  }

  static EngineRequest Greedy(std::vector<int32_t> prompt, uint32_t n) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = n;
    r.sampling.ignore_eos = true;
    return r;
  }

  static model::Model* model_;
};

model::Model* LlmEngineTest::model_ = nullptr;

TEST_F(LlmEngineTest, ConcurrentRequestsMatchSoloRunsEvenWithPreemption) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(Greedy(Prompt(5 + 7 * i, i), 12 + i));
  }
  std::vector<Result> solo;
  for (const EngineRequest& r : requests) {
    auto engine = MakeEngine(64, 512);
    solo.push_back(RunAll(*engine, {r})[0]);
  }
  // 24 blocks of 4 tokens cannot hold all eight sequences (up to 68 tokens
  // each) at once, and 16 tokens per step forces chunked prefill.
  auto engine = MakeEngine(24, 16);
  std::vector<Result> together = RunAll(*engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(together[i].tokens, solo[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].text, solo[i].text) << "request " << i;
    EXPECT_EQ(together[i].finish, RequestFinish::kLength);
    EXPECT_EQ(together[i].tokens.size(), 12 + i);
  }
  EXPECT_GT(engine->stats().preemptions, 0);
  EXPECT_EQ(engine->runner().blocks().num_used_blocks(), 0);
  EXPECT_TRUE(engine->runner().blocks().CheckInvariants().ok());
}

TEST_F(LlmEngineTest, SeededSamplingIsReproducibleAndBatchIndependent) {
  auto make = [&](uint64_t seed) {
    EngineRequest r;
    r.prompt = Prompt(10, 9);
    r.sampling.temperature = 1.0f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = seed;
    r.sampling.max_tokens = 20;
    r.sampling.ignore_eos = true;
    return r;
  };
  auto alone = RunAll(*MakeEngine(64, 512), {make(7)})[0];
  auto batched = RunAll(*MakeEngine(64, 8),
                        {make(1), make(7), Greedy(Prompt(30, 2), 5)})[1];
  auto other_seed = RunAll(*MakeEngine(64, 512), {make(8)})[0];
  EXPECT_EQ(alone.tokens, batched.tokens);
  EXPECT_NE(alone.tokens, other_seed.tokens);
}

TEST_F(LlmEngineTest, PrefixCacheHitsGiveTheSameTokensAsMisses) {
  std::vector<int32_t> prompt = Prompt(37, 4);
  auto cold = RunAll(*MakeEngine(64, 512, /*prefix_cache=*/false),
                     {Greedy(prompt, 10)})[0];
  auto engine = MakeEngine(64, 512);
  auto first = RunAll(*engine, {Greedy(prompt, 10)})[0];
  auto second = RunAll(*engine, {Greedy(prompt, 10)})[0];
  EXPECT_EQ(first.cached, 0);
  EXPECT_EQ(second.cached, 36);  // nine full 4-token blocks
  EXPECT_EQ(first.tokens, cold.tokens);
  EXPECT_EQ(second.tokens, cold.tokens);
}

TEST_F(LlmEngineTest, StopsOnStopTokenAndStopStringAndCancel) {
  auto base = RunAll(*MakeEngine(64, 512), {Greedy(Prompt(6, 1), 16)})[0];
  ASSERT_EQ(base.tokens.size(), 16u);
  // Stop token: the fifth generated token ends generation, is returned and
  // contributes no text.
  {
    EngineRequest r = Greedy(Prompt(6, 1), 16);
    r.sampling.stop_token_ids = {static_cast<uint32_t>(base.tokens[4])};
    auto res = RunAll(*MakeEngine(64, 512), {r})[0];
    const auto first =
        std::find(base.tokens.begin(), base.tokens.end(), base.tokens[4]) -
        base.tokens.begin();
    EXPECT_EQ(res.tokens.size(), static_cast<size_t>(first + 1));
    EXPECT_EQ(res.finish, RequestFinish::kStop);
  }
  // Stop string: text ends right before it.
  if (base.text.size() > 6) {
    EngineRequest r = Greedy(Prompt(6, 1), 16);
    const std::string stop = base.text.substr(3, 2);
    r.sampling.stop = {stop};
    auto res = RunAll(*MakeEngine(64, 512), {r})[0];
    EXPECT_EQ(res.text, base.text.substr(0, base.text.find(stop)));
    EXPECT_EQ(res.finish, RequestFinish::kStop);
  }
  // Cancel from another thread while it runs.
  {
    auto engine = MakeEngine(64, 512);
    RequestFinish finish = RequestFinish::kNone;
    EngineRequest r = Greedy(Prompt(6, 1), 10000);
    r.sampling.max_tokens = 400;
    r.on_output = [&](const RequestOutput& out) { finish = out.finish; };
    auto id = engine->AddRequest(std::move(r));
    ASSERT_TRUE(id.ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine->Step().ok());
    std::thread([&] { engine->Cancel(*id); }).join();
    ASSERT_TRUE(engine->RunUntilIdle().ok());
    EXPECT_EQ(finish, RequestFinish::kCancelled);
    EXPECT_EQ(engine->runner().blocks().num_used_blocks(), 0);
  }
}

TEST_F(LlmEngineTest, RefusesBadRequests) {
  auto engine = MakeEngine(64, 512);
  EngineRequest empty = Greedy({}, 4);
  EXPECT_EQ(engine->AddRequest(empty).status().code(),
            absl::StatusCode::kInvalidArgument);
  EngineRequest bad_token = Greedy({1, model_->config().vocab_size + 3}, 4);
  EXPECT_EQ(engine->AddRequest(bad_token).status().code(),
            absl::StatusCode::kInvalidArgument);
  EngineRequest too_long =
      Greedy(std::vector<int32_t>(model_->config().context_length, 5), 4);
  EXPECT_EQ(engine->AddRequest(too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
  EngineRequest bad_temp = Greedy({1, 2}, 4);
  bad_temp.sampling.temperature = -1;
  EXPECT_EQ(engine->AddRequest(bad_temp).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(engine->HasWork());
  // A request larger than the whole cache fails alone; the engine goes on.
  auto small = MakeEngine(3, 512);
  std::vector<Result> res =
      RunAll(*small, {Greedy(Prompt(20, 1), 4), Greedy(Prompt(5, 2), 3)});
  EXPECT_EQ(res[0].finish, RequestFinish::kError);
  EXPECT_EQ(res[1].finish, RequestFinish::kLength);
  EXPECT_EQ(res[1].tokens.size(), 3u);
}

// A request whose first token was sampled elsewhere and whose prompt KV was
// written into reserved blocks (the decode worker's path) continues exactly
// as if one engine had done everything: same tokens, same text.
TEST_F(LlmEngineTest, TransferredRequestContinuesLikeALocalOne) {
  EngineRequest request;
  request.prompt = Prompt(13, 4);
  request.sampling.temperature = 0.9f;
  request.sampling.seed = 42;
  request.sampling.max_tokens = 16;
  request.sampling.ignore_eos = true;
  const Result local = RunAll(*MakeEngine(64, 512), {request})[0];
  ASSERT_EQ(local.tokens.size(), 16u);

  // The prefill side: compute the prompt and sample its first token.
  auto prefill = MakeEngine(64, 512);
  ModelRunner& source = prefill->runner();
  auto computed = source.Prefill({{1, request.prompt}});
  ASSERT_TRUE(computed.ok()) << computed.status();
  TokenStreamOptions stream_options;
  stream_options.tokenizer = &model_->tokenizer();
  stream_options.sampling = request.sampling;
  stream_options.context_length = model_->config().context_length;
  stream_options.vocab_size = model_->config().vocab_size;
  auto stream = TokenStream::Create(stream_options, request.prompt);
  ASSERT_TRUE(stream.ok());
  auto first = (*stream)->Next((*computed)[0].logits);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->token, local.tokens[0]);

  // The decode side reserves, receives the bytes, and decodes.
  auto decode = MakeEngine(64, 512);
  auto reservation = decode->ReserveTransfer(request.prompt);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  const std::vector<BlockId> from_blocks = source.blocks().CopyBlockTable(1);
  KvCachePool& from = source.backend().kv_pool();
  KvCachePool& to = decode->runner().backend().kv_pool();
  const uint32_t bs = from.layout().block_size_tokens();
  for (uint32_t layer = 0; layer < from.layout().num_layers(); ++layer) {
    for (int32_t p = reservation->cached_tokens;
         p < static_cast<int32_t>(request.prompt.size()); ++p) {
      for (auto half : {kv_layout::KvHalf::kKey, kv_layout::KvHalf::kValue}) {
        std::memcpy(to.Slot(layer, reservation->blocks[p / bs], half, p % bs),
                    from.Slot(layer, from_blocks[p / bs], half, p % bs),
                    from.geometry().token_bytes());
      }
    }
  }
  EngineRequest rest = request;
  rest.generated = {first->token};
  rest.transferred = reservation->id;
  const Result continued = RunAll(*decode, {rest})[0];
  std::vector<int32_t> tokens = {first->token};
  tokens.insert(tokens.end(), continued.tokens.begin(), continued.tokens.end());
  EXPECT_EQ(tokens, local.tokens);
  EXPECT_EQ(first->text + continued.text, local.text);
  EXPECT_EQ(continued.finish, RequestFinish::kLength);
  EXPECT_EQ(decode->runner().blocks().num_used_blocks(), 0);

  // A reservation nobody decodes is freed; a second use is refused.
  auto unused = decode->ReserveTransfer(request.prompt);
  ASSERT_TRUE(unused.ok());
  EXPECT_GT(decode->runner().blocks().num_used_blocks(), 0);
  decode->ReleaseTransfer(unused->id);
  EXPECT_EQ(decode->runner().blocks().num_used_blocks(), 0);
  EXPECT_EQ(decode->AddRequest(rest).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(decode->runner().blocks().CheckInvariants().ok());
}

// A request replayed with tokens it already produced (a migration) goes on
// with the same tokens and releases exactly the text not yet released.
TEST_F(LlmEngineTest, ReplayedRequestContinuesWhereItStopped) {
  EngineRequest request;
  request.prompt = Prompt(9, 6);
  request.sampling.temperature = 0.8f;
  request.sampling.seed = 5;
  request.sampling.presence_penalty = 0.5f;
  request.sampling.max_tokens = 12;
  request.sampling.ignore_eos = true;
  std::vector<RequestOutput> outputs;
  request.on_output = [&](const RequestOutput& out) { outputs.push_back(out); };
  auto engine = MakeEngine(64, 512);
  ASSERT_TRUE(engine->AddRequest(request).ok());
  ASSERT_TRUE(engine->RunUntilIdle().ok());
  ASSERT_EQ(outputs.size(), 12u);
  std::vector<int32_t> all;
  std::string later_text;
  for (const RequestOutput& out : outputs) {
    EXPECT_EQ(out.generated_offset, static_cast<int32_t>(all.size()));
    all.insert(all.end(), out.token_ids.begin(), out.token_ids.end());
    if (out.generated_offset >= 5) later_text += out.text;
  }
  EngineRequest replay = request;
  replay.on_output = nullptr;
  replay.generated.assign(all.begin(), all.begin() + 5);
  const Result rest = RunAll(*MakeEngine(64, 512), {replay})[0];
  EXPECT_EQ(rest.tokens, std::vector<int32_t>(all.begin() + 5, all.end()));
  EXPECT_EQ(rest.text, later_text);
}

TEST_F(LlmEngineTest, ReplayThatAlreadyEndedTheRequestIsRefused) {
  auto engine = MakeEngine(64, 512);
  EngineRequest done = Greedy(Prompt(6, 1), 3);
  done.generated = {5, 6, 7};  // max_tokens counts replayed tokens
  EXPECT_EQ(engine->AddRequest(done).status().code(),
            absl::StatusCode::kInvalidArgument);
  EngineRequest stopped = Greedy(Prompt(6, 1), 10);
  stopped.sampling.stop_token_ids = {6};
  stopped.generated = {5, 6, 7};
  EXPECT_EQ(engine->AddRequest(stopped).status().code(),
            absl::StatusCode::kInvalidArgument);
  EngineRequest fine = Greedy(Prompt(6, 1), 4);
  fine.generated = {5, 6, 7};
  const Result rest = RunAll(*engine, {fine})[0];
  EXPECT_EQ(rest.tokens.size(), 1u);
  EXPECT_EQ(rest.finish, RequestFinish::kLength);
}

}  // namespace
}  // namespace pdserve::engine
