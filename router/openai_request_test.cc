// Parsing of OpenAI request bodies (router/openai_request.h): what each
// field becomes in the GenerateRequest, and the 400s that name the field.
#include "router/openai_request.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Expects `body` to be refused with INVALID_ARGUMENT naming `param`.
void ExpectCompletionError(absl::string_view body, absl::string_view param) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr(absl::StrCat("'", param, "'")))
      << body;
}

void ExpectChatError(absl::string_view body, absl::string_view param) {
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr(absl::StrCat("'", param, "'")))
      << body;
}

TEST(ParseCompletionTest, MinimalRequest) {
  auto r = ParseCompletionRequest(R"({"prompt": "Hello"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, OpenAiKind::kCompletion);
  EXPECT_EQ(r->generate.text(), "Hello");
  EXPECT_EQ(r->generate.model(), "");
  EXPECT_EQ(r->generate.request_id(), "");
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->include_usage);
  EXPECT_FALSE(r->logprobs);
  EXPECT_FALSE(r->timeout.has_value());
  // Non-streaming requests always ask for usage.
  EXPECT_TRUE(r->generate.stream_options().include_usage());
  const v1::SamplingParams& s = r->generate.sampling();
  EXPECT_FALSE(s.has_temperature());
  EXPECT_FALSE(s.has_top_p());
  // OpenAI's legacy completions and vLLM default to 16 tokens.
  EXPECT_TRUE(s.has_max_tokens());
  EXPECT_EQ(s.max_tokens(), 16u);
  EXPECT_EQ(s.max_tokens(), kDefaultCompletionMaxTokens);
  EXPECT_FALSE(s.has_seed());
  EXPECT_FALSE(s.has_repetition_penalty());
  EXPECT_EQ(s.top_k(), 0u);
  EXPECT_FALSE(s.logprobs());
  EXPECT_TRUE(s.logit_bias().empty());
}

TEST(ParseChatTest, MaxTokensDefaultsToTheRestOfTheContext) {
  auto r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->generate.sampling().has_max_tokens());
  auto null = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "hi"}],
          "max_tokens": null})");
  ASSERT_TRUE(null.ok()) << null.status();
  EXPECT_FALSE(null->generate.sampling().has_max_tokens());
}

TEST(ParseCompletionTest, EveryField) {
  auto r = ParseCompletionRequest(R"({
    "model": "llama", "prompt": ["Once upon"], "max_tokens": 16,
    "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
    "seed": 1234, "stop": ["\n", "END"], "stop_token_ids": [2, 7],
    "ignore_eos": true, "disable_speculation": true, "presence_penalty": 0.25, "frequency_penalty": -0.5,
    "repetition_penalty": 1.1, "logprobs": 3, "n": 1, "best_of": 1,
    "echo": false, "stream": true, "stream_options": {"include_usage": true},
    "user": "alice", "request_id": "req-1", "timeout": 2.5, "priority": -3,
    "logit_bias": {"42": 5, "7": -100.0, "0": 100, "4294967295": -0.5},
    "unknown_field": {"nested": [1, 2]}
  })");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(g.model(), "llama");
  EXPECT_EQ(g.text(), "Once upon");
  EXPECT_EQ(g.request_id(), "req-1");
  EXPECT_EQ(g.priority(), -3);
  const v1::SamplingParams& s = g.sampling();
  EXPECT_EQ(s.max_tokens(), 16u);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 40u);
  EXPECT_FLOAT_EQ(s.min_p(), 0.05f);
  EXPECT_EQ(s.seed(), 1234u);
  EXPECT_THAT(s.stop(), ElementsAre("\n", "END"));
  EXPECT_THAT(s.stop_token_ids(), ElementsAre(2u, 7u));
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_TRUE(s.disable_speculation());
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
  EXPECT_TRUE(s.logprobs());
  EXPECT_EQ(s.top_logprobs(), 3u);
  EXPECT_EQ(s.logit_bias_size(), 4);
  EXPECT_EQ(s.logit_bias().at(42), 5.0f);
  EXPECT_EQ(s.logit_bias().at(7), -100.0f);
  EXPECT_EQ(s.logit_bias().at(0), 100.0f);
  EXPECT_EQ(s.logit_bias().at(4294967295u), -0.5f);
  EXPECT_TRUE(r->logprobs);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(g.stream_options().include_usage());
  ASSERT_TRUE(r->timeout.has_value());
  EXPECT_EQ(*r->timeout, absl::Milliseconds(2500));
}

TEST(ParseCompletionTest, PromptForms) {
  auto ids = ParseCompletionRequest(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(ids->generate.token_ids().ids(), ElementsAre(1u, 2u, 3u));

  auto nested = ParseCompletionRequest(R"({"prompt": [[5, 6]]})");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_THAT(nested->generate.token_ids().ids(), ElementsAre(5u, 6u));

  auto one = ParseCompletionRequest(R"({"prompt": ["only"]})");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->generate.text(), "only");

  auto empty_text = ParseCompletionRequest(R"({"prompt": ""})");
  ASSERT_TRUE(empty_text.ok()) << empty_text.status();
  EXPECT_EQ(empty_text->generate.prompt_case(), v1::GenerateRequest::kText);

  // A float with an integral value is accepted as an integer.
  auto floats = ParseCompletionRequest(R"({"prompt": [1.0, 2]})");
  ASSERT_TRUE(floats.ok()) << floats.status();
  EXPECT_THAT(floats->generate.token_ids().ids(), ElementsAre(1u, 2u));
}

TEST(ParseCompletionTest, BatchedPromptsAreRefused) {
  for (const char* body :
       {R"({"prompt": ["a", "b"]})", R"({"prompt": [[1], [2]]})"}) {
    auto r = ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("batched prompts are not supported; send one "
                          "request per prompt"));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("'prompt'"));
  }
}

TEST(ParseCompletionTest, BadPrompts) {
  ExpectCompletionError(R"({})", "prompt");
  ExpectCompletionError(R"({"prompt": null})", "prompt");
  ExpectCompletionError(R"({"prompt": 5})", "prompt");
  ExpectCompletionError(R"({"prompt": []})", "prompt");
  ExpectCompletionError(R"({"prompt": [1, -2]})", "prompt");
  ExpectCompletionError(R"({"prompt": [1, 4294967296]})", "prompt");
  ExpectCompletionError(R"({"prompt": [1, "a"]})", "prompt");
  ExpectCompletionError(R"({"prompt": [1.5]})", "prompt");
  ExpectCompletionError(R"({"prompt": [[]]})", "prompt");
  ExpectCompletionError(R"({"prompt": [{"a": 1}]})", "prompt");
}

TEST(ParseCompletionTest, EveryBadValueNamesItsParameter) {
  struct Case {
    const char* fields;  // Added to a valid request.
    const char* param;
  };
  const Case cases[] = {
      {R"("model": 3)", "model"},
      {R"("request_id": 3)", "request_id"},
      {R"("max_tokens": "5")", "max_tokens"},
      {R"("max_tokens": 0)", "max_tokens"},
      {R"("max_tokens": -1)", "max_tokens"},
      {R"("max_tokens": 4294967296)", "max_tokens"},
      {R"("max_tokens": 1.5)", "max_tokens"},
      {R"("max_completion_tokens": 0)", "max_completion_tokens"},
      {R"("temperature": "hot")", "temperature"},
      {R"("temperature": -0.1)", "temperature"},
      {R"("top_p": 0)", "top_p"},
      {R"("top_p": 1.5)", "top_p"},
      {R"("top_p": true)", "top_p"},
      {R"("top_k": -2)", "top_k"},
      {R"("top_k": 1.5)", "top_k"},
      {R"("min_p": 2)", "min_p"},
      {R"("min_p": -0.5)", "min_p"},
      {R"("repetition_penalty": 0)", "repetition_penalty"},
      {R"("presence_penalty": 3)", "presence_penalty"},
      {R"("frequency_penalty": -2.5)", "frequency_penalty"},
      {R"("frequency_penalty": "x")", "frequency_penalty"},
      {R"("seed": "1")", "seed"},
      {R"("seed": 1.5)", "seed"},
      {R"("stop": 5)", "stop"},
      {R"("stop": ["a", 5])", "stop"},
      {R"("stop": [""])", "stop"},
      {R"("stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13",
                   "14","15","16","17"])",
       "stop"},
      {R"("stop_token_ids": 5)", "stop_token_ids"},
      {R"("stop_token_ids": [-1])", "stop_token_ids"},
      {R"("ignore_eos": 1)", "ignore_eos"},
      {R"("disable_speculation": "yes")", "disable_speculation"},
      {R"("logprobs": 21)", "logprobs"},
      {R"("logprobs": -1)", "logprobs"},
      {R"("logprobs": true)", "logprobs"},
      {R"("n": 2)", "n"},
      {R"("n": "1")", "n"},
      {R"("best_of": 2)", "best_of"},
      {R"("echo": true)", "echo"},
      {R"("echo": "no")", "echo"},
      {R"("suffix": "tail")", "suffix"},
      {R"("stream": "yes")", "stream"},
      {R"("stream_options": true)", "stream_options"},
      {R"("stream_options": {"include_usage": 1})",
       "stream_options.include_usage"},
      {R"("timeout": 0)", "timeout"},
      {R"("timeout": -1)", "timeout"},
      {R"("timeout": "10")", "timeout"},
      {R"("priority": 101)", "priority"},
      {R"("priority": "high")", "priority"},
      // logit_bias: keys must be token ids, values in [-100, 100].
      {R"("logit_bias": {"abc": 5})", "logit_bias"},
      {R"("logit_bias": {"-1": 5})", "logit_bias"},
      {R"("logit_bias": {"1.5": 5})", "logit_bias"},
      {R"("logit_bias": {"1e3": 5})", "logit_bias"},
      {R"("logit_bias": {"": 5})", "logit_bias"},
      {R"("logit_bias": {" 1": 5})", "logit_bias"},
      {R"("logit_bias": {"+1": 5})", "logit_bias"},
      {R"("logit_bias": {"4294967296": 5})", "logit_bias"},
      {R"("logit_bias": {"99999999999999999999": 5})", "logit_bias"},
      {R"("logit_bias": {"1": 100.5})", "logit_bias"},
      {R"("logit_bias": {"1": -101})", "logit_bias"},
      {R"("logit_bias": {"1": 1e300})", "logit_bias"},
      {R"("logit_bias": {"1": "5"})", "logit_bias"},
      {R"("logit_bias": {"1": null})", "logit_bias"},
      {R"("logit_bias": {"1": true})", "logit_bias"},
      {R"("logit_bias": {"1": 2, "01": 3})", "logit_bias"},
      {R"("logit_bias": [[1, 5]])", "logit_bias"},
      {R"("logit_bias": "1:5")", "logit_bias"},
  };
  for (const Case& c : cases) {
    ExpectCompletionError(absl::StrCat(R"({"prompt": "p", )", c.fields, "}"),
                          c.param);
  }
}

TEST(ParseCompletionTest, LogitBiasMessageSaysWhatIsWrong) {
  auto key =
      ParseCompletionRequest(R"({"prompt": "x", "logit_bias": {"abc": 5}})");
  ASSERT_FALSE(key.ok());
  EXPECT_THAT(std::string(key.status().message()),
              HasSubstr("key \"abc\" is not a token id"));
  auto value =
      ParseCompletionRequest(R"({"prompt": "x", "logit_bias": {"12": -250}})");
  ASSERT_FALSE(value.ok());
  EXPECT_THAT(std::string(value.status().message()),
              HasSubstr("token id 12 must be a number in [-100, 100]"));
  // Empty and null mean no bias.
  for (const char* body : {R"({"prompt": "x", "logit_bias": {}})",
                           R"({"prompt": "x", "logit_bias": null})"}) {
    auto r = ParseCompletionRequest(body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->generate.sampling().logit_bias().empty());
  }
}

TEST(ParseCompletionTest, NullMeansDefault) {
  auto r = ParseCompletionRequest(
      R"({"prompt": "p", "max_tokens": null, "temperature": null,
          "stop": null, "logprobs": null, "n": null, "seed": null,
          "stream_options": null, "suffix": null, "echo": null,
          "logit_bias": null, "user": null})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().max_tokens(), kDefaultCompletionMaxTokens);
  EXPECT_FALSE(r->generate.sampling().has_temperature());
  EXPECT_FALSE(r->logprobs);
}

TEST(ParseCompletionTest, SpecialValues) {
  // top_k -1 means disabled (vLLM), which the proto spells 0.
  auto r = ParseCompletionRequest(
      R"({"prompt": "p", "top_k": -1, "seed": -1, "logprobs": 0,
          "max_tokens": 8, "max_completion_tokens": 4, "temperature": 0,
          "stop": "###", "stream": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::SamplingParams& s = r->generate.sampling();
  EXPECT_EQ(s.top_k(), 0u);
  EXPECT_EQ(s.seed(), 0xFFFFFFFFFFFFFFFFull);
  EXPECT_TRUE(s.logprobs());
  EXPECT_EQ(s.top_logprobs(), 0u);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(s.max_tokens(), 4u);  // max_completion_tokens wins.
  EXPECT_TRUE(s.has_temperature());
  EXPECT_EQ(s.temperature(), 0.0f);
  EXPECT_THAT(s.stop(), ElementsAre("###"));
  // Streaming without stream_options: no usage.
  EXPECT_FALSE(r->generate.stream_options().include_usage());
  EXPECT_FALSE(r->include_usage);

  auto big_seed = ParseCompletionRequest(
      R"({"prompt": "p", "seed": 18446744073709551615})");
  ASSERT_TRUE(big_seed.ok()) << big_seed.status();
  EXPECT_EQ(big_seed->generate.sampling().seed(), 0xFFFFFFFFFFFFFFFFull);
}

TEST(ParseCompletionTest, MalformedJson) {
  for (const char* body :
       {"", "{", R"({"prompt": "a",})", "nope", "{\"prompt\": \"\xff\"}"}) {
    auto r = ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()),
                StartsWith("request body is not valid JSON: "));
  }
  for (const char* body : {"[]", "5", R"("text")", "null"}) {
    auto r = ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "request body must be a JSON object");
  }
}

TEST(ParseCompletionTest, DeeplyNestedJsonDoesNotCrash) {
  std::string body = R"({"prompt": "p", "x": )" + std::string(200000, '[') +
                     std::string(200000, ']') + "}";
  auto r = ParseCompletionRequest(body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.text(), "p");
}

TEST(ParseChatTest, Messages) {
  auto r = ParseChatCompletionRequest(R"({
    "model": "llama",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "name": "bob", "content": [
        {"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null},
      {"role": "assistant", "content": "Sure,"}
    ],
    "continue_final_message": true,
    "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 2
  })");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, OpenAiKind::kChat);
  const v1::ChatMessages& chat = r->generate.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Be brief.");
  EXPECT_EQ(chat.messages(1).role(), "user");
  EXPECT_EQ(chat.messages(1).name(), "bob");
  EXPECT_EQ(chat.messages(1).content(), "Hello\nthere");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_EQ(chat.messages(3).content(), "Sure,");
  EXPECT_TRUE(chat.continue_final_message());
  EXPECT_EQ(r->generate.model(), "llama");
  EXPECT_EQ(r->generate.sampling().max_tokens(), 7u);
  EXPECT_TRUE(r->logprobs);
  EXPECT_TRUE(r->generate.sampling().logprobs());
  EXPECT_EQ(r->generate.sampling().top_logprobs(), 2u);
  EXPECT_TRUE(r->generate.stream_options().include_usage());
}

TEST(ParseChatTest, CommonFieldsApply) {
  auto r = ParseChatCompletionRequest(R"({
    "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7,
    "top_k": 5, "stop": "x", "seed": 9, "stream": true,
    "stream_options": {"include_usage": false}, "timeout": 30,
    "logprobs": false, "logit_bias": {"15043": -100}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().logit_bias().at(15043), -100.0f);
  EXPECT_FALSE(r->generate.chat().continue_final_message());
  EXPECT_FLOAT_EQ(r->generate.sampling().temperature(), 0.7f);
  EXPECT_EQ(r->generate.sampling().top_k(), 5u);
  EXPECT_EQ(r->generate.sampling().seed(), 9u);
  EXPECT_TRUE(r->stream);
  EXPECT_FALSE(r->generate.stream_options().include_usage());
  EXPECT_FALSE(r->logprobs);
  EXPECT_FALSE(r->generate.sampling().logprobs());
  EXPECT_EQ(r->timeout, absl::Seconds(30));
}

TEST(ParseChatTest, BadValuesNameTheirParameter) {
  ExpectChatError(R"({})", "messages");
  ExpectChatError(R"({"messages": []})", "messages");
  ExpectChatError(R"({"messages": "hi"})", "messages");
  ExpectChatError(R"({"messages": ["hi"]})", "messages[0]");
  ExpectChatError(R"({"messages": [{"content": "hi"}]})", "messages[0].role");
  ExpectChatError(R"({"messages": [{"role": "", "content": "hi"}]})",
                  "messages[0].role");
  ExpectChatError(R"({"messages": [{"role": "user", "content": 5}]})",
                  "messages[0].content");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"},
                       {"role": "user", "content": [{"type": "image_url",
                        "image_url": {"url": "http://x"}}]}]})",
      "messages[1].content[0].type");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
      "messages[0].content[0].text");
  ExpectChatError(R"({"messages": [{"role": "user", "content": ["a"]}]})",
                  "messages[0].content[0]");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a", "name": 1}]})",
      "messages[0].name");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}],
          "continue_final_message": true})",
      "continue_final_message");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}],
          "continue_final_message": "yes"})",
      "continue_final_message");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}], "logprobs": 3})",
      "logprobs");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})",
      "top_logprobs");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true,
          "top_logprobs": 21})",
      "top_logprobs");
  ExpectChatError(R"({"messages": [{"role": "user", "content": "a"}], "n": 3})",
                  "n");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 0})",
      "max_tokens");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}],
          "logit_bias": {"x": 1}})",
      "logit_bias");
}

TEST(ParseChatTest, EveryMessageNeedsContent) {
  ExpectChatError(R"({"messages": [{"role": "user"}]})", "messages[0].content");
  ExpectChatError(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]})",
      "messages[1].content");
  // Null content: only an assistant message may have it (taken as empty).
  for (const char* role : {"user", "system"}) {
    ExpectChatError(absl::StrCat(R"({"messages": [{"role": ")", role,
                                 R"(", "content": null}]})"),
                    "messages[0].content");
  }
  auto r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "a"},
                       {"role": "assistant", "content": null}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.chat().messages(1).content(), "");
  // The same rules for /tokenize, which renders the same conversation.
  auto tokenize = ParseTokenizeRequest(R"({"messages": [{"role": "user"}]})");
  ASSERT_FALSE(tokenize.ok());
  EXPECT_THAT(std::string(tokenize.status().message()),
              HasSubstr("'messages[0].content'"));
}

TEST(ParseChatTest, ToolCallingAudioAndRefusalsInMessagesAreRefused) {
  const char* kUser = R"({"role": "user", "content": "a"}, )";
  struct Case {
    const char* message;
    const char* param;
  };
  const Case cases[] = {
      {R"({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
          "type": "function", "function": {"name": "f", "arguments": "{}"}}]})",
       "messages[1].tool_calls"},
      {R"({"role": "assistant", "content": null,
          "function_call": {"name": "f", "arguments": "{}"}})",
       "messages[1].function_call"},
      {R"({"role": "tool", "content": "42", "tool_call_id": "c1"})",
       "messages[1].tool_call_id"},
      {R"({"role": "assistant", "content": null, "audio": {"id": "a1"}})",
       "messages[1].audio"},
      {R"({"role": "assistant", "content": null, "refusal": "No."})",
       "messages[1].refusal"},
  };
  for (const Case& c : cases) {
    ExpectChatError(absl::StrCat(R"({"messages": [)", kUser, c.message, "]}"),
                    c.param);
  }
  // Null or empty: nothing to refuse.
  auto r = ParseChatCompletionRequest(
      absl::StrCat(R"({"messages": [)", kUser,
                   R"({"role": "assistant", "content": "b", "tool_calls": [],
          "function_call": null, "tool_call_id": null, "audio": null,
          "refusal": null}]})"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.chat().messages(1).content(), "b");
}

TEST(ParseChatTest, UnsupportedFeaturesAreRefusedNamingTheField) {
  struct Case {
    const char* fields;
    const char* param;
  };
  const Case cases[] = {
      {R"("tools": [{"type": "function", "function": {"name": "f"}}])",
       "tools"},
      {R"("tools": {})", "tools"},
      {R"("functions": [{"name": "f"}])", "functions"},
      {R"("tool_choice": "auto")", "tool_choice"},
      {R"("tool_choice": "required")", "tool_choice"},
      {R"("tool_choice": {"type": "function", "function": {"name": "f"}})",
       "tool_choice"},
      {R"("function_call": "auto")", "function_call"},
      {R"("response_format": {"type": "json_object"})", "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {}})",
       "response_format"},
      {R"("response_format": "text")", "response_format"},
      {R"("response_format": {})", "response_format"},
      {R"("modalities": ["text", "audio"])", "modalities"},
      {R"("modalities": "text")", "modalities"},
      {R"("audio": {"voice": "alloy", "format": "wav"})", "audio"},
      {R"("web_search_options": {})", "web_search_options"},
      {R"("store": true)", "store"},
      {R"("store": "yes")", "store"},
  };
  for (const Case& c : cases) {
    ExpectChatError(
        absl::StrCat(R"({"messages": [{"role": "user", "content": "a"}], )",
                     c.fields, "}"),
        c.param);
  }
}

// Fields accepted and ignored (docs/openai_api.md says why): the request
// is exactly what it is without them. So are the values of the refused
// fields that ask for nothing.
TEST(ParseChatTest, IgnoredFieldsChangeNothing) {
  const std::string plain =
      R"({"messages": [{"role": "user", "content": "a"}], "seed": 3)";
  auto base = ParseChatCompletionRequest(plain + "}");
  ASSERT_TRUE(base.ok()) << base.status();
  auto with = ParseChatCompletionRequest(plain + R"(,
      "user": "alice", "safety_identifier": "u-1", "metadata": {"k": "v"},
      "service_tier": "auto", "prediction": {"type": "content", "content": "x"},
      "prompt_cache_key": "k", "reasoning_effort": "low", "verbosity": "low",
      "parallel_tool_calls": false,
      "stream_options": {"include_obfuscation": false,
                         "continuous_usage_stats": true},
      "tools": [], "functions": null, "tool_choice": "none",
      "function_call": "none", "response_format": {"type": "text"},
      "modalities": ["text"], "audio": null, "web_search_options": null,
      "store": false})");
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->generate.ShortDebugString(),
            base->generate.ShortDebugString());
  EXPECT_EQ(with->stream, base->stream);
  EXPECT_EQ(with->include_usage, base->include_usage);
  EXPECT_EQ(with->logprobs, base->logprobs);

  auto completion = ParseCompletionRequest(R"({"prompt": "a", "user": "bob"})");
  auto completion_base = ParseCompletionRequest(R"({"prompt": "a"})");
  ASSERT_TRUE(completion.ok()) << completion.status();
  ASSERT_TRUE(completion_base.ok()) << completion_base.status();
  EXPECT_EQ(completion->generate.ShortDebugString(),
            completion_base->generate.ShortDebugString());
}

TEST(ParseTokenizeTest, PromptAndMessages) {
  auto text = ParseTokenizeRequest(
      R"({"model": "m", "prompt": "abc", "add_special_tokens": false})");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->model(), "m");
  EXPECT_EQ(text->text(), "abc");
  ASSERT_TRUE(text->has_add_special_tokens());
  EXPECT_FALSE(text->add_special_tokens());

  auto chat = ParseTokenizeRequest(
      R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->chat().messages(0).content(), "hi");
  EXPECT_FALSE(chat->has_add_special_tokens());

  EXPECT_FALSE(ParseTokenizeRequest(R"({"model": "m"})").ok());
  EXPECT_FALSE(
      ParseTokenizeRequest(R"({"prompt": "a", "messages": [{"role": "user"}]})")
          .ok());
  auto bad = ParseTokenizeRequest(R"({"prompt": 5})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'prompt'"));
  EXPECT_FALSE(ParseTokenizeRequest("{").ok());
}

}  // namespace
}  // namespace pdserve::router
