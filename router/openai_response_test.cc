// Formatting of OpenAI response bodies (router/openai_response.h): streaming
// chunks, the non-streaming body, logprobs, errors, /v1/models, /tokenize.
#include "router/openai_response.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::router {
namespace {

using json = nlohmann::json;

json Parse(const std::string& text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(value.is_discarded()) << text;
  return value;
}

TEST(TokenizeBodyTest, Shape) {
  v1::TokenizeResponse response;
  response.add_token_ids(1);
  response.add_token_ids(42);
  response.set_context_length(2048);
  json body = Parse(TokenizeBody(response));
  EXPECT_EQ(body["tokens"], json({1, 42}));
  EXPECT_EQ(body["count"], 2);
  EXPECT_EQ(body["max_model_len"], 2048);
}

// ---------------------------------------------------------- formatting

v1::GenerateResponse Chunk(const std::string& text, std::vector<uint32_t> ids) {
  v1::GenerateResponse chunk;
  chunk.set_request_id("r1");
  chunk.set_text(text);
  for (uint32_t id : ids) chunk.add_token_ids(id);
  return chunk;
}

v1::GenerateResponse LastChunk(const std::string& text,
                               std::vector<uint32_t> ids,
                               v1::FinishReason reason) {
  v1::GenerateResponse chunk = Chunk(text, std::move(ids));
  chunk.set_finish_reason(reason);
  chunk.mutable_usage()->set_prompt_tokens(5);
  chunk.mutable_usage()->set_completion_tokens(3);
  chunk.mutable_usage()->set_cached_prompt_tokens(2);
  return chunk;
}

void AddLogprob(v1::GenerateResponse* chunk, uint32_t id,
                const std::string& text, float logprob,
                std::vector<std::pair<std::string, float>> top) {
  v1::TokenLogprob* lp = chunk->add_logprobs();
  lp->set_token_id(id);
  lp->set_text(text);
  lp->set_raw_bytes(text);
  lp->set_logprob(logprob);
  for (auto& [t, l] : top) {
    v1::TopLogprob* alt = lp->add_top_logprobs();
    alt->set_token_id(100);
    alt->set_text(t);
    alt->set_raw_bytes(t);
    alt->set_logprob(l);
  }
}

OpenAiResponseOptions Options(OpenAiKind kind, bool include_usage,
                              bool logprobs) {
  OpenAiResponseOptions options;
  options.kind = kind;
  options.id = ResponseId(kind, "r1");
  options.model = "llama";
  options.created_unix_s = 1700000000;
  options.include_usage = include_usage;
  options.logprobs = logprobs;
  return options;
}

TEST(ResponseIdTest, Prefixes) {
  EXPECT_EQ(ResponseId(OpenAiKind::kCompletion, "abc"), "cmpl-abc");
  EXPECT_EQ(ResponseId(OpenAiKind::kChat, "abc"), "chatcmpl-abc");
}

TEST(FormatterTest, CompletionStream) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kCompletion, true, false));
  std::vector<std::string> e1 = f.OnChunk(Chunk("Hel", {1}));
  ASSERT_EQ(e1.size(), 1u);
  json c1 = Parse(e1[0]);
  EXPECT_EQ(c1["id"], "cmpl-r1");
  EXPECT_EQ(c1["object"], "text_completion");
  EXPECT_EQ(c1["created"], 1700000000);
  EXPECT_EQ(c1["model"], "llama");
  ASSERT_EQ(c1["choices"].size(), 1u);
  EXPECT_EQ(c1["choices"][0]["index"], 0);
  EXPECT_EQ(c1["choices"][0]["text"], "Hel");
  EXPECT_TRUE(c1["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(c1["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c1.contains("usage"));
  EXPECT_TRUE(c1["usage"].is_null());

  // Tokens whose text is held back produce no event.
  EXPECT_TRUE(f.OnChunk(Chunk("", {2})).empty());

  v1::GenerateResponse last = LastChunk("lo", {3}, v1::FINISH_REASON_STOP);
  last.set_stop_string("###");
  std::vector<std::string> e2 = f.OnChunk(last);
  ASSERT_EQ(e2.size(), 2u);
  json c2 = Parse(e2[0]);
  EXPECT_EQ(c2["choices"][0]["text"], "lo");
  EXPECT_EQ(c2["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c2["choices"][0]["stop_reason"], "###");
  json usage = Parse(e2[1]);
  EXPECT_EQ(usage["object"], "text_completion");
  EXPECT_TRUE(usage["choices"].is_array());
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 2);

  json final = Parse(f.Final());
  EXPECT_EQ(final["object"], "text_completion");
  EXPECT_EQ(final["choices"][0]["text"], "Hello");
  EXPECT_EQ(final["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(final["usage"]["total_tokens"], 8);
}

TEST(FormatterTest, CompletionStreamWithoutUsage) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kCompletion, false, false));
  std::vector<std::string> events =
      f.OnChunk(LastChunk("x", {1}, v1::FINISH_REASON_LENGTH));
  ASSERT_EQ(events.size(), 1u);
  json c = Parse(events[0]);
  EXPECT_FALSE(c.contains("usage"));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(c["choices"][0]["stop_reason"].is_null());
}

TEST(FormatterTest, FinishOnlyChunkIsStillSent) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kCompletion, false, false));
  v1::GenerateResponse last = LastChunk("", {2}, v1::FINISH_REASON_STOP);
  last.set_stop_token_id(2);
  std::vector<std::string> events = f.OnChunk(last);
  ASSERT_EQ(events.size(), 1u);
  json c = Parse(events[0]);
  EXPECT_EQ(c["choices"][0]["text"], "");
  EXPECT_EQ(c["choices"][0]["stop_reason"], 2);
}

TEST(FormatterTest, CancelledIsAbort) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kChat, false, false));
  std::vector<std::string> events =
      f.OnChunk(LastChunk("", {}, v1::FINISH_REASON_CANCELLED));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(Parse(events[0])["choices"][0]["finish_reason"], "abort");
  EXPECT_EQ(Parse(f.Final())["choices"][0]["finish_reason"], "abort");
}

TEST(FormatterTest, ChatStream) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kChat, true, false));
  std::vector<std::string> e1 = f.OnChunk(Chunk("Hi", {1}));
  ASSERT_EQ(e1.size(), 1u);
  json c1 = Parse(e1[0]);
  EXPECT_EQ(c1["id"], "chatcmpl-r1");
  EXPECT_EQ(c1["object"], "chat.completion.chunk");
  EXPECT_EQ(c1["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c1["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(c1["choices"][0]["finish_reason"].is_null());

  std::vector<std::string> e2 = f.OnChunk(Chunk(" there", {2}));
  ASSERT_EQ(e2.size(), 1u);
  json c2 = Parse(e2[0]);
  EXPECT_FALSE(c2["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(c2["choices"][0]["delta"]["content"], " there");

  std::vector<std::string> e3 =
      f.OnChunk(LastChunk("", {3}, v1::FINISH_REASON_STOP));
  ASSERT_EQ(e3.size(), 2u);
  json c3 = Parse(e3[0]);
  EXPECT_TRUE(c3["choices"][0]["delta"].is_object());
  EXPECT_TRUE(c3["choices"][0]["delta"].empty());
  EXPECT_EQ(c3["choices"][0]["finish_reason"], "stop");
  json usage = Parse(e3[1]);
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);

  json final = Parse(f.Final());
  EXPECT_EQ(final["object"], "chat.completion");
  EXPECT_EQ(final["id"], "chatcmpl-r1");
  EXPECT_EQ(final["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(final["choices"][0]["message"]["content"], "Hi there");
  EXPECT_EQ(final["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(final["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(final["usage"]["prompt_tokens"], 5);
}

TEST(FormatterTest, ChatRoleGoesOnFirstEmittedChunk) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kChat, false, false));
  EXPECT_TRUE(f.OnChunk(Chunk("", {1})).empty());
  std::vector<std::string> events =
      f.OnChunk(LastChunk("", {2}, v1::FINISH_REASON_LENGTH));
  ASSERT_EQ(events.size(), 1u);
  json c = Parse(events[0]);
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "");
}

TEST(FormatterTest, CompletionLogprobs) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kCompletion, false, true));
  v1::GenerateResponse c1 = Chunk("Héllo", {1, 2});
  AddLogprob(&c1, 1, "Hé", -0.5f, {{"Hé", -0.5f}, {"Ha", -1.5f}});
  AddLogprob(&c1, 2, "llo", -0.25f, {{"lla", -0.1f}});
  std::vector<std::string> e1 = f.OnChunk(c1);
  ASSERT_EQ(e1.size(), 1u);
  json lp = Parse(e1[0])["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"Hé", "llo"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  ASSERT_EQ(lp["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][0], json({{"Hé", -0.5}, {"Ha", -1.5}}));
  // The sampled token is always in the dict.
  EXPECT_EQ(lp["top_logprobs"][1], json({{"lla", -0.1f}, {"llo", -0.25}}));
  // Offsets count characters, not bytes.
  EXPECT_EQ(lp["text_offset"], json({0, 2}));

  // A token whose text is held back still reports its logprobs.
  v1::GenerateResponse c2 = Chunk("", {3});
  AddLogprob(&c2, 3, "!", -std::numeric_limits<float>::infinity(), {});
  std::vector<std::string> e2 = f.OnChunk(c2);
  ASSERT_EQ(e2.size(), 1u);
  json lp2 = Parse(e2[0])["choices"][0]["logprobs"];
  EXPECT_EQ(lp2["tokens"], json({"!"}));
  EXPECT_EQ(lp2["token_logprobs"], json({-9999.0}));
  EXPECT_EQ(lp2["text_offset"], json({5}));

  v1::GenerateResponse c3 = LastChunk("!", {}, v1::FINISH_REASON_STOP);
  f.OnChunk(c3);
  json final = Parse(f.Final());
  json all = final["choices"][0]["logprobs"];
  EXPECT_EQ(all["tokens"], json({"Hé", "llo", "!"}));
  EXPECT_EQ(all["text_offset"], json({0, 2, 5}));
  EXPECT_EQ(final["choices"][0]["text"], "Héllo!");
}

TEST(FormatterTest, ChatLogprobs) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kChat, false, true));
  v1::GenerateResponse c1 = Chunk("A", {1});
  AddLogprob(&c1, 1, "A", -0.125f, {{"A", -0.125f}, {"B", -2.0f}});
  std::vector<std::string> events = f.OnChunk(c1);
  ASSERT_EQ(events.size(), 1u);
  json content = Parse(events[0])["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "A");
  EXPECT_EQ(content[0]["logprob"], -0.125);
  EXPECT_EQ(content[0]["bytes"], json({65}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "B");
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -2.0);
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], json({66}));

  // A partial UTF-8 token: bytes are exact, text replaced.
  v1::GenerateResponse c2 = LastChunk("", {2}, v1::FINISH_REASON_STOP);
  v1::TokenLogprob* lp = c2.add_logprobs();
  lp->set_token_id(2);
  lp->set_text("\xEF\xBF\xBD");
  lp->set_raw_bytes("\xC3");
  lp->set_logprob(-1.0f);
  f.OnChunk(c2);
  json final = Parse(f.Final());
  json all = final["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1]["bytes"], json({0xC3}));
  EXPECT_EQ(all[1]["token"], "\xEF\xBF\xBD");
  EXPECT_TRUE(all[1]["top_logprobs"].empty());
}

TEST(FormatterTest, FinalWithoutUsageCountsTokens) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kCompletion, false, false));
  f.Accumulate(Chunk("a", {1, 2}));
  v1::GenerateResponse last = Chunk("b", {3});
  last.set_finish_reason(v1::FINISH_REASON_LENGTH);
  f.Accumulate(last);
  json final = Parse(f.Final());
  EXPECT_EQ(final["choices"][0]["text"], "ab");
  EXPECT_EQ(final["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(final["usage"]["completion_tokens"], 3);
  EXPECT_EQ(final["usage"]["prompt_tokens"], 0);
}

TEST(FormatterTest, InvalidUtf8TextDoesNotThrow) {
  OpenAiStreamFormatter f(Options(OpenAiKind::kCompletion, false, false));
  std::vector<std::string> events = f.OnChunk(Chunk("a\xff", {1}));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(Parse(events[0])["choices"][0]["text"], "a\xEF\xBF\xBD");
}

// ---------------------------------------------------------------- errors

TEST(ErrorTest, HttpStatusFor) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kOutOfRange), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kFailedPrecondition), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kAlreadyExists), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kResourceExhausted), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kCancelled), 499);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnimplemented), 501);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDataLoss), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnknown), 500);
}

TEST(ErrorTest, ErrorBodyShape) {
  struct Case {
    absl::Status status;
    const char* type;
    int code;
  };
  const Case cases[] = {
      {absl::InvalidArgumentError("bad 'x'"), "invalid_request_error", 400},
      {absl::NotFoundError("no model"), "not_found_error", 404},
      {absl::AlreadyExistsError("dup"), "conflict_error", 409},
      {absl::ResourceExhaustedError("full"), "rate_limit_exceeded", 503},
      {absl::UnavailableError("none"), "service_unavailable", 503},
      {absl::DeadlineExceededError("late"), "timeout", 504},
      {absl::CancelledError("gone"), "cancelled", 499},
      {absl::UnimplementedError("no"), "not_implemented", 501},
      {absl::InternalError("boom"), "internal_error", 500},
  };
  for (const Case& c : cases) {
    json body = Parse(ErrorBody(c.status));
    ASSERT_TRUE(body["error"].is_object());
    EXPECT_EQ(body["error"]["message"], std::string(c.status.message()));
    EXPECT_EQ(body["error"]["type"], c.type) << c.status;
    EXPECT_TRUE(body["error"].contains("param"));
    EXPECT_TRUE(body["error"]["param"].is_null());
    EXPECT_EQ(body["error"]["code"], c.code) << c.status;
  }
  json custom = Parse(ErrorBody(413, "invalid_request_error", "too big"));
  EXPECT_EQ(custom["error"]["code"], 413);
  EXPECT_EQ(custom["error"]["message"], "too big");
}

TEST(ModelsBodyTest, Shape) {
  v1::ListModelsResponse response;
  v1::ModelInfo* m = response.add_models();
  m->set_id("llama");
  m->set_context_length(4096);
  m->set_created_unix_s(1700000000);
  m->set_owned_by("pdserve");
  json body = Parse(ModelsBody(response));
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], "llama");
  EXPECT_EQ(body["data"][0]["object"], "model");
  EXPECT_EQ(body["data"][0]["created"], 1700000000);
  EXPECT_EQ(body["data"][0]["owned_by"], "pdserve");
  EXPECT_EQ(body["data"][0]["max_model_len"], 4096);

  json empty = Parse(ModelsBody(v1::ListModelsResponse()));
  EXPECT_TRUE(empty["data"].is_array());
  EXPECT_TRUE(empty["data"].empty());
}

}  // namespace
}  // namespace pdserve::router
