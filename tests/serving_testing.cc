#include "tests/serving_testing.h"

#include <utility>

#include "absl/time/clock.h"
#include "cli/generate_client.h"
#include "engine/sampling_proto.h"
#include "gtest/gtest.h"

namespace pdserve::testing {

Outcome Generate(const std::string& address, const v1::GenerateRequest& request,
                 absl::Duration timeout,
                 const std::function<void(const Outcome&)>& on_chunk) {
  Outcome out;
  const absl::Time start = absl::Now();
  out.status = cli::StreamGenerate(
      address, request, timeout, [&](const v1::GenerateResponse& chunk) {
        if (chunk.generated_offset() != out.tokens.size()) {
          out.contiguous = false;
        }
        if (out.tokens.empty() && chunk.token_ids_size() > 0) {
          out.client_ttft_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
        }
        out.tokens.insert(out.tokens.end(), chunk.token_ids().begin(),
                          chunk.token_ids().end());
        out.text += chunk.text();
        for (const v1::TokenLogprob& l : chunk.logprobs()) {
          out.logprobs.emplace_back(l.token_id(), l.logprob(),
                                    l.top_logprobs_size());
        }
        ++out.chunks;
        if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
          out.finish = chunk.finish_reason();
          out.usage = chunk.usage();
        }
        if (chunk.has_timing()) out.timing = chunk.timing();
        if (on_chunk) on_chunk(out);
      });
  return out;
}

OfflineEngine::OfflineEngine(const std::string& path, v1::KvDtype kv_dtype) {
  auto model = model::Model::Open(path);
  EXPECT_TRUE(model.ok()) << model.status();
  model_ = std::move(model).value();
  engine::EngineOptions options;
  options.runner.num_threads = 1;
  options.runner.kv_dtype = kv_dtype;
  auto engine = engine::LlmEngine::Create(*model_, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  engine_ = std::move(engine).value();
}

Outcome OfflineEngine::Run(const v1::GenerateRequest& request) {
  Outcome out;
  engine::EngineRequest er;
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      er.prompt = model_->EncodePrompt(request.text());
      break;
    case v1::GenerateRequest::kChat: {
      std::vector<model::ChatMessage> messages;
      for (const auto& m : request.chat().messages()) {
        messages.push_back({m.role(), m.content()});
      }
      auto ids = model_->EncodeChat(messages);
      EXPECT_TRUE(ids.ok()) << ids.status();
      if (ids.ok()) er.prompt.assign(ids->begin(), ids->end());
      break;
    }
    default:
      er.prompt.assign(request.token_ids().ids().begin(),
                       request.token_ids().ids().end());
  }
  er.sampling = engine::FromProto(request.sampling());
  er.on_output = [&](const engine::RequestOutput& o) {
    out.tokens.insert(out.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    out.text += o.text;
    for (const engine::SampleResult& l : o.logprobs) {
      out.logprobs.emplace_back(l.token_id, l.logprob,
                                static_cast<int>(l.top_logprobs.size()));
    }
    if (o.finish == engine::RequestFinish::kStop) {
      out.finish = v1::FINISH_REASON_STOP;
    } else if (o.finish == engine::RequestFinish::kLength) {
      out.finish = v1::FINISH_REASON_LENGTH;
    }
    out.usage.set_prompt_tokens(o.prompt_tokens);
    out.usage.set_completion_tokens(o.completion_tokens);
  };
  out.status = engine_->AddRequest(std::move(er)).status();
  if (out.status.ok()) out.status = engine_->RunUntilIdle();
  return out;
}

v1::GenerateRequest TextRequest(const std::string& text, uint32_t max_tokens) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_stream_options()->set_include_usage(true);
  r.mutable_stream_options()->set_include_timing(true);
  return r;
}

v1::GenerateRequest TokenRequest(int length, int salt, uint32_t max_tokens,
                                 int32_t vocab) {
  v1::GenerateRequest r;
  for (int i = 0; i < length; ++i) {
    r.mutable_token_ids()->add_ids((i * 131 + salt * 977 + 7) % (vocab - 10) +
                                   3);
  }
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_stream_options()->set_include_usage(true);
  r.mutable_stream_options()->set_include_timing(true);
  return r;
}

void Seed(v1::GenerateRequest* r, uint64_t seed) {
  r->mutable_sampling()->set_temperature(0.9f);
  r->mutable_sampling()->set_top_p(0.95f);
  r->mutable_sampling()->set_seed(seed);
}

// A varied set: plain text, chat, seeded sampling with penalties and a stop
// string, pre-tokenized prompts spanning several KV blocks.
bool IsSameAnswer(const Outcome& cluster, const Outcome& offline) {
  return cluster.status.ok() && offline.status.ok() &&
         cluster.tokens == offline.tokens && cluster.text == offline.text &&
         cluster.finish == offline.finish &&
         cluster.logprobs == offline.logprobs && cluster.contiguous &&
         cluster.usage.completion_tokens() == offline.tokens.size() &&
         cluster.usage.prompt_tokens() == offline.usage.prompt_tokens();
}

void ExpectSameAnswer(const Outcome& cluster, const Outcome& offline,
                      const std::string& what) {
  ASSERT_TRUE(cluster.status.ok()) << what << ": " << cluster.status;
  ASSERT_TRUE(offline.status.ok()) << what << ": " << offline.status;
  EXPECT_EQ(cluster.tokens, offline.tokens) << what;
  EXPECT_EQ(cluster.text, offline.text) << what;
  EXPECT_EQ(cluster.finish, offline.finish) << what;
  EXPECT_EQ(cluster.logprobs, offline.logprobs) << what;
  EXPECT_TRUE(cluster.contiguous) << what;
  EXPECT_EQ(cluster.usage.completion_tokens(), offline.tokens.size()) << what;
  EXPECT_EQ(cluster.usage.prompt_tokens(), offline.usage.prompt_tokens())
      << what;
}

}  // namespace pdserve::testing
