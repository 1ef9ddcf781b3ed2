// HttpFrontend's endpoints answered whole: completion and chat bodies, the
// request each becomes, /v1/models, /health, /tokenize, and every error as
// an HTTP status with an OpenAI error body.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/client.pb.h"
#include "router/http_frontend.h"
#include "router/testing/fake_client_api.h"
#include "router/testing/http_frontend_fixture.h"
#include "rpc/cluster_credential.h"

namespace pdserve::router {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST_F(HttpFrontendTest, NonStreamCompletion) {
  api_.SetScript(HelloScript());
  absl::Time before = absl::Now();
  httplib::Result result =
      Post("/v1/completions",
           R"({"model": "smollm2", "prompt": "Say hi", "max_tokens": 5,
          "temperature": 0, "request_id": "my-req"})");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200) << result->body;
  EXPECT_THAT(result->get_header_value("Content-Type"),
              StartsWith("application/json"));
  json body = ParseJson(result->body);
  EXPECT_EQ(body["id"], "cmpl-my-req");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "smollm2");
  EXPECT_EQ(body["choices"][0]["text"], "Hello!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 1);

  std::vector<v1::GenerateRequest> requests = api_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].request_id(), "my-req");
  EXPECT_EQ(requests[0].model(), "smollm2");
  EXPECT_EQ(requests[0].text(), "Say hi");
  EXPECT_EQ(requests[0].sampling().max_tokens(), 5u);
  EXPECT_EQ(requests[0].sampling().temperature(), 0.0f);
  EXPECT_TRUE(requests[0].stream_options().include_usage());
  // Default deadline: now + 10 minutes.
  absl::Time deadline = api_.deadlines()[0];
  EXPECT_GE(deadline, before + absl::Minutes(10));
  EXPECT_LE(deadline, absl::Now() + absl::Minutes(10));
}

TEST_F(HttpFrontendTest, NonStreamChatFillsIdAndModel) {
  api_.SetScript(HelloScript());
  httplib::Result result = Post(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "hi"}], "timeout": 3})");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200) << result->body;
  json body = ParseJson(result->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello!");
  // The only served model stands in for an empty "model".
  EXPECT_EQ(body["model"], "smollm2");

  std::vector<v1::GenerateRequest> requests = api_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].model(), "");
  EXPECT_EQ(requests[0].chat().messages(0).content(), "hi");
  // A request id was assigned and is the response id.
  EXPECT_EQ(requests[0].request_id().size(), 32u);
  EXPECT_EQ(body["id"], "chatcmpl-" + requests[0].request_id());
  // "timeout": 3 bounds the deadline.
  EXPECT_LE(api_.deadlines()[0], absl::Now() + absl::Seconds(3));
  EXPECT_GE(api_.deadlines()[0], absl::Now() + absl::Seconds(1));
}

TEST_F(HttpFrontendTest, BadJsonIs400) {
  httplib::Result result = Post("/v1/completions", R"({"prompt": )");
  ExpectErrorBody(result, 400, "invalid_request_error");
  EXPECT_THAT(ParseJson(result->body)["error"]["message"].get<std::string>(),
              StartsWith("request body is not valid JSON"));
  EXPECT_TRUE(api_.requests().empty());
}

TEST_F(HttpFrontendTest, BadParameterIs400NamingIt) {
  httplib::Result result =
      Post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "hi"}],
          "temperature": "hot", "stream": true})");
  ExpectErrorBody(result, 400, "invalid_request_error");
  EXPECT_THAT(ParseJson(result->body)["error"]["message"].get<std::string>(),
              HasSubstr("'temperature'"));
}

// The issue's cases: each was a 200 before. Nothing reaches the API.
TEST_F(HttpFrontendTest, UnsupportedOrBadFieldsAre400NamingThem) {
  api_.SetScript(HelloScript());
  struct Case {
    const char* path;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"abc": 5}})",
       "'logit_bias'"},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"5": 101}})",
       "'logit_bias'"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}]})",
       "'messages[0].content'"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}],
           "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "'tools'"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "json_object"}})",
       "'response_format'"},
  };
  for (const Case& c : cases) {
    httplib::Result result = Post(c.path, c.body);
    ExpectErrorBody(result, 400, "invalid_request_error");
    EXPECT_THAT(ParseJson(result->body)["error"]["message"].get<std::string>(),
                HasSubstr(c.param))
        << c.body;
  }
  EXPECT_TRUE(api_.requests().empty());
}

TEST_F(HttpFrontendTest, LogitBiasAndTheDefaultMaxTokensReachTheApi) {
  api_.SetScript(HelloScript());
  httplib::Result completion = Post(
      "/v1/completions", R"({"prompt": "x", "logit_bias": {"15043": 100}})");
  ASSERT_TRUE(completion) << httplib::to_string(completion.error());
  EXPECT_EQ(completion->status, 200) << completion->body;
  httplib::Result chat =
      Post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "x"}],
               "logit_bias": {"7": -100}})");
  ASSERT_TRUE(chat) << httplib::to_string(chat.error());
  EXPECT_EQ(chat->status, 200) << chat->body;

  std::vector<v1::GenerateRequest> requests = api_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].sampling().logit_bias().at(15043), 100.0f);
  // /v1/completions without max_tokens: 16, as OpenAI and vLLM.
  EXPECT_EQ(requests[0].sampling().max_tokens(), 16u);
  EXPECT_EQ(requests[1].sampling().logit_bias().at(7), -100.0f);
  // Chat: the rest of the context.
  EXPECT_FALSE(requests[1].sampling().has_max_tokens());
}

TEST_F(HttpFrontendTest, ResourceExhaustedIs503WithRetryAfter) {
  HttpFrontendOptions options;
  options.retry_after_s = 7;
  StartServer(options);
  FakeClientApi::Script script;
  script.status = absl::ResourceExhaustedError("router queue full");
  api_.SetScript(script);

  httplib::Result unary = Post("/v1/completions", R"({"prompt": "a"})");
  ExpectErrorBody(unary, 503, "rate_limit_exceeded");
  EXPECT_EQ(unary->get_header_value("Retry-After"), "7");
  EXPECT_EQ(ParseJson(unary->body)["error"]["message"], "router queue full");

  // Before the first chunk a stream fails with a real status too.
  httplib::Result stream =
      Post("/v1/completions", R"({"prompt": "a", "stream": true})");
  ExpectErrorBody(stream, 503, "rate_limit_exceeded");
  EXPECT_EQ(stream->get_header_value("Retry-After"), "7");
}

// --api_key_file: the client API behind a key, /health and /metrics open.
TEST_F(HttpFrontendTest, ApiKeysGuardEveryRouteButHealthAndMetrics) {
  HttpFrontendOptions options;
  options.api_keys =
      *rpc::ClusterCredential::FromText("key-one\nkey-two\n", "test");
  StartServer(options);
  api_.SetScript(HelloScript());

  httplib::Result missing = Post("/v1/completions", R"({"prompt": "a"})");
  ExpectErrorBody(missing, 401, "invalid_request_error");
  EXPECT_EQ(missing->get_header_value("WWW-Authenticate"), "Bearer");
  httplib::Result models = Get("/v1/models");
  ExpectErrorBody(models, 401, "invalid_request_error");
  const httplib::Headers wrong = {{"Authorization", "Bearer key-three"}};
  httplib::Result refused =
      NewClient()->Post("/v1/chat/completions", wrong,
                        R"({"messages": [{"role": "user", "content": "hi"}]})",
                        "application/json");
  ExpectErrorBody(refused, 401, "invalid_request_error");
  EXPECT_THAT(ParseJson(refused->body)["error"]["message"].get<std::string>(),
              ::testing::Not(HasSubstr("key-three")));
  EXPECT_TRUE(api_.requests().empty());

  for (const char* key : {"key-one", "key-two"}) {
    const httplib::Headers right = {
        {"Authorization", absl::StrCat("Bearer ", key)}};
    httplib::Result accepted = NewClient()->Post(
        "/v1/completions", right, R"({"prompt": "a"})", "application/json");
    ASSERT_TRUE(accepted) << httplib::to_string(accepted.error());
    EXPECT_EQ(accepted->status, 200) << accepted->body;
  }
  EXPECT_EQ(api_.requests().size(), 2u);

  httplib::Result health = Get("/health");
  ASSERT_TRUE(health);
  EXPECT_NE(health->status, 401);
}

TEST_F(HttpFrontendTest, GenerateErrorsMapToHttpStatus) {
  FakeClientApi::Script script;
  script.status = absl::NotFoundError("no model 'x'");
  api_.SetScript(script);
  httplib::Result result =
      Post("/v1/completions", R"({"prompt": "a", "model": "x"})");
  ExpectErrorBody(result, 404, "not_found_error");
  EXPECT_FALSE(result->has_header("Retry-After"));

  script.status = absl::UnavailableError("no decode worker");
  api_.SetScript(script);
  ExpectErrorBody(Post("/v1/completions", R"({"prompt": "a"})"), 503,
                  "service_unavailable");

  script.status = absl::DeadlineExceededError("too slow");
  api_.SetScript(script);
  ExpectErrorBody(Post("/v1/completions", R"({"prompt": "a", "stream": true})"),
                  504, "timeout");
}

TEST_F(HttpFrontendTest, Models) {
  httplib::Result result = Get("/v1/models");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  json body = ParseJson(result->body);
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], "smollm2");
  EXPECT_EQ(body["data"][0]["object"], "model");
  EXPECT_EQ(body["data"][0]["owned_by"], "pdserve");
  EXPECT_EQ(body["data"][0]["max_model_len"], 2048);
}

TEST_F(HttpFrontendTest, Health) {
  httplib::Result ok = Get("/health");
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ParseJson(ok->body)["status"], "ok");

  api_.SetReady(absl::UnavailableError("no decode worker registered"));
  httplib::Result down = Get("/health");
  ExpectErrorBody(down, 503, "service_unavailable");
  EXPECT_EQ(ParseJson(down->body)["error"]["message"],
            "no decode worker registered");
}

TEST_F(HttpFrontendTest, Tokenize) {
  httplib::Result result =
      Post("/tokenize", R"({"model": "smollm2", "prompt": "Hello"})");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200) << result->body;
  json body = ParseJson(result->body);
  EXPECT_EQ(body["tokens"], json({1, 15043}));
  EXPECT_EQ(body["count"], 2);
  EXPECT_EQ(body["max_model_len"], 2048);
  std::vector<v1::TokenizeRequest> requests = api_.tokenize_requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].text(), "Hello");
  EXPECT_EQ(requests[0].model(), "smollm2");

  ExpectErrorBody(Post("/tokenize", R"({"model": "smollm2"})"), 400,
                  "invalid_request_error");
}

TEST_F(HttpFrontendTest, UnknownPathWrongMethodAndLargeBody) {
  httplib::Result unknown = Get("/v1/engines");
  ExpectErrorBody(unknown, 404, "not_found_error");

  httplib::Result wrong_method = Get("/v1/completions");
  ExpectErrorBody(wrong_method, 405, "invalid_request_error");
  EXPECT_EQ(wrong_method->get_header_value("Allow"), "POST");
  ExpectErrorBody(Post("/v1/models", "{}"), 405, "invalid_request_error");

  HttpFrontendOptions options;
  options.max_body_bytes = 1024;
  StartServer(options);
  std::string big = R"({"prompt": ")" + std::string(2000, 'a') + R"("})";
  ExpectErrorBody(Post("/v1/completions", big), 413, "invalid_request_error");
  EXPECT_TRUE(api_.requests().empty());
  // A body under the limit still works.
  api_.SetScript(HelloScript());
  httplib::Result small = Post("/v1/completions", R"({"prompt": "a"})");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200);
}

}  // namespace
}  // namespace pdserve::router
