#include "router/http_frontend.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/client.pb.h"
#include "router/client_api.h"

namespace pdserve::router {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Bounds every wait in these tests, so a bug fails a test instead of hanging.
constexpr absl::Duration kWait = absl::Seconds(10);

// A scripted ClientApi: Generate sends `chunks`, then returns `status`;
// everything it was asked is recorded. A stalled Generate returns CANCELLED
// once the request's CancelToken fires, as the core does.
class FakeClientApi : public ClientApi {
 public:
  struct Script {
    std::vector<v1::GenerateResponse> chunks;
    absl::Status status;
    // After the scripted chunks, keep sending empty-text token chunks every
    // 10 ms until the sink refuses one (or kWait passes).
    bool endless = false;
    // Before sending anything, wait until this many Generate calls are in
    // flight at once (or kWait passes).
    int wait_for_concurrent = 0;
    // Before sending anything, wait this long (a long prefill), or until
    // the CancelToken fires: then Generate returns CANCELLED at once.
    absl::Duration stall = absl::ZeroDuration();
  };

  void SetScript(Script script) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(script);
  }
  void SetModels(v1::ListModelsResponse models) {
    absl::MutexLock lock(&mu_);
    models_ = std::move(models);
  }
  void SetReady(absl::Status ready) {
    absl::MutexLock lock(&mu_);
    ready_ = std::move(ready);
  }

  absl::Status Generate(v1::GenerateRequest request, absl::Time deadline,
                        const ChunkSink& sink, CancelToken* cancel) override {
    Script script;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(request);
      deadlines_.push_back(deadline);
      script = script_;
      ++active_;
      max_active_ = std::max(max_active_, active_);
    }
    absl::Status status = Run(script, request.request_id(), sink, cancel);
    absl::MutexLock lock(&mu_);
    --active_;
    ++finished_;
    return status;
  }

  absl::StatusOr<v1::TokenizeResponse> Tokenize(
      const v1::TokenizeRequest& request) override {
    absl::MutexLock lock(&mu_);
    tokenize_requests_.push_back(request);
    v1::TokenizeResponse response;
    response.add_token_ids(1);
    response.add_token_ids(15043);
    response.set_context_length(2048);
    return response;
  }

  absl::StatusOr<v1::ListModelsResponse> ListModels() override {
    absl::MutexLock lock(&mu_);
    return models_;
  }

  absl::Status CheckReady() override {
    absl::MutexLock lock(&mu_);
    return ready_;
  }

  std::vector<v1::GenerateRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  std::vector<absl::Time> deadlines() {
    absl::MutexLock lock(&mu_);
    return deadlines_;
  }
  std::vector<v1::TokenizeRequest> tokenize_requests() {
    absl::MutexLock lock(&mu_);
    return tokenize_requests_;
  }
  int max_active() {
    absl::MutexLock lock(&mu_);
    return max_active_;
  }
  // Waits until a sink refused a chunk (the client was gone).
  bool WaitForSinkRefusal(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&sink_refused_), timeout);
  }
  // Waits until `n` Generate calls have begun.
  bool WaitForStarted(int n, absl::Duration timeout) {
    auto started = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(requests_.size()) >= n;
    };
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&started), timeout);
  }
  // Waits until a stalled Generate saw its CancelToken fire.
  bool WaitForCancel(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&saw_cancel_), timeout);
  }
  // Waits until `n` Generate calls have returned.
  bool WaitForFinished(int n, absl::Duration timeout) {
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return finished_ >= n;
    };
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }

 private:
  absl::Status Run(const Script& script, const std::string& request_id,
                   const ChunkSink& sink, CancelToken* cancel) {
    if (script.wait_for_concurrent > 0) {
      auto enough = [this, &script]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return max_active_ >= script.wait_for_concurrent;
      };
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    }
    if (script.stall > absl::ZeroDuration()) {
      if (cancel == nullptr) {
        absl::SleepFor(script.stall);
      } else {
        absl::Notification cancelled;
        const int id = cancel->Register([&cancelled] { cancelled.Notify(); });
        const bool was_cancelled =
            cancelled.WaitForNotificationWithTimeout(script.stall);
        cancel->Unregister(id);  // Before `cancelled` goes out of scope.
        if (was_cancelled) {
          absl::MutexLock lock(&mu_);
          saw_cancel_ = true;
          return absl::CancelledError("cancelled by the front end");
        }
      }
    }
    uint32_t offset = 0;
    auto send = [&](v1::GenerateResponse chunk) {
      chunk.set_request_id(request_id);
      chunk.set_generated_offset(offset);
      offset += chunk.token_ids_size();
      if (sink(chunk)) return true;
      absl::MutexLock lock(&mu_);
      sink_refused_ = true;
      return false;
    };
    for (const v1::GenerateResponse& chunk : script.chunks) {
      if (!send(chunk)) return absl::CancelledError("client gone");
    }
    if (script.endless) {
      absl::Time give_up = absl::Now() + kWait;
      while (absl::Now() < give_up) {
        v1::GenerateResponse chunk;
        chunk.set_text("x");
        chunk.add_token_ids(7);
        if (!send(chunk)) return absl::CancelledError("client gone");
        absl::SleepFor(absl::Milliseconds(10));
      }
      return absl::DeadlineExceededError("endless script timed out");
    }
    return script.status;
  }

  absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  v1::ListModelsResponse models_ ABSL_GUARDED_BY(mu_);
  absl::Status ready_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::TokenizeRequest> tokenize_requests_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  int max_active_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool sink_refused_ ABSL_GUARDED_BY(mu_) = false;
  bool saw_cancel_ ABSL_GUARDED_BY(mu_) = false;
};

v1::GenerateResponse TextChunk(const std::string& text, uint32_t id) {
  v1::GenerateResponse chunk;
  chunk.set_text(text);
  chunk.add_token_ids(id);
  return chunk;
}

v1::GenerateResponse FinalChunk(const std::string& text, uint32_t id) {
  v1::GenerateResponse chunk = TextChunk(text, id);
  chunk.set_finish_reason(v1::FINISH_REASON_STOP);
  chunk.mutable_usage()->set_prompt_tokens(4);
  chunk.mutable_usage()->set_completion_tokens(3);
  chunk.mutable_usage()->set_cached_prompt_tokens(1);
  return chunk;
}

FakeClientApi::Script HelloScript() {
  FakeClientApi::Script script;
  script.chunks = {TextChunk("Hel", 1), TextChunk("lo", 2), FinalChunk("!", 3)};
  return script;
}

json ParseJson(const std::string& text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(value.is_discarded()) << text;
  return value;
}

// The payloads of an SSE body ("data: X\n\n" events), in order.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  for (absl::string_view event : absl::StrSplit(body, "\n\n")) {
    if (event.empty()) continue;
    EXPECT_TRUE(absl::ConsumePrefix(&event, "data: ")) << event;
    out.emplace_back(event);
  }
  EXPECT_TRUE(absl::EndsWith(body, "\n\n")) << body;
  return out;
}

// Connects to 127.0.0.1:`port` and sends a POST of `body` to `path`, then
// reads nothing. Returns the socket, or -1.
int SendRawPost(int port, absl::string_view path, absl::string_view body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address),
                sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  const std::string request = absl::StrCat(
      "POST ", path,
      " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      body.size(), "\r\n\r\n", body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n =
        ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      ::close(fd);
      return -1;
    }
    sent += static_cast<size_t>(n);
  }
  return fd;
}

class HttpFrontendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::ListModelsResponse models;
    v1::ModelInfo* model = models.add_models();
    model->set_id("smollm2");
    model->set_context_length(2048);
    model->set_created_unix_s(1700000000);
    model->set_owned_by("pdserve");
    api_.SetModels(models);
    StartServer(HttpFrontendOptions());
  }

  void StartServer(HttpFrontendOptions options) {
    frontend_.reset();
    absl::StatusOr<std::unique_ptr<HttpFrontend>> frontend =
        HttpFrontend::Start(options, &api_);
    ASSERT_TRUE(frontend.ok()) << frontend.status();
    frontend_ = std::move(*frontend);
    ASSERT_GT(frontend_->port(), 0);
  }

  std::unique_ptr<httplib::Client> NewClient() {
    auto client =
        std::make_unique<httplib::Client>("127.0.0.1", frontend_->port());
    client->set_connection_timeout(5);
    client->set_read_timeout(10);
    client->set_write_timeout(5);
    return client;
  }

  httplib::Result Post(const std::string& path, const std::string& body) {
    return NewClient()->Post(path, body, "application/json");
  }

  httplib::Result Get(const std::string& path) {
    return NewClient()->Get(path);
  }

  FakeClientApi api_;
  std::unique_ptr<HttpFrontend> frontend_;
};

void ExpectErrorBody(const httplib::Result& result, int status,
                     const std::string& type) {
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, status) << result->body;
  EXPECT_THAT(result->get_header_value("Content-Type"),
              StartsWith("application/json"));
  json body = ParseJson(result->body);
  ASSERT_TRUE(body["error"].is_object()) << result->body;
  EXPECT_EQ(body["error"]["type"], type) << result->body;
  EXPECT_EQ(body["error"]["code"], status) << result->body;
  EXPECT_TRUE(body["error"]["message"].is_string()) << result->body;
  EXPECT_TRUE(body["error"]["param"].is_null()) << result->body;
}

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

TEST_F(HttpFrontendTest, CompletionStream) {
  api_.SetScript(HelloScript());
  httplib::Result result = Post("/v1/completions",
                                R"({"prompt": "Say hi", "stream": true,
          "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200) << result->body;
  EXPECT_THAT(result->get_header_value("Content-Type"),
              StartsWith("text/event-stream"));
  std::vector<std::string> events = SseData(result->body);
  ASSERT_EQ(events.size(), 5u) << result->body;
  EXPECT_EQ(ParseJson(events[0])["choices"][0]["text"], "Hel");
  EXPECT_EQ(ParseJson(events[0])["object"], "text_completion");
  EXPECT_EQ(ParseJson(events[1])["choices"][0]["text"], "lo");
  json last = ParseJson(events[2]);
  EXPECT_EQ(last["choices"][0]["text"], "!");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  json usage = ParseJson(events[3]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  EXPECT_EQ(events[4], "[DONE]");

  std::vector<v1::GenerateRequest> requests = api_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_TRUE(requests[0].stream_options().include_usage());
}

TEST_F(HttpFrontendTest, ChatStreamWithoutUsage) {
  api_.SetScript(HelloScript());
  httplib::Result result = Post("/v1/chat/completions",
                                R"({"model": "smollm2", "stream": true,
          "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200) << result->body;
  std::vector<std::string> events = SseData(result->body);
  ASSERT_EQ(events.size(), 4u) << result->body;
  json first = ParseJson(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hel");
  EXPECT_FALSE(first.contains("usage"));
  EXPECT_EQ(ParseJson(events[1])["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(ParseJson(events[2])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[3], "[DONE]");
  EXPECT_FALSE(api_.requests()[0].stream_options().include_usage());
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

TEST_F(HttpFrontendTest, ErrorMidStreamIsAnErrorEvent) {
  FakeClientApi::Script script;
  script.chunks = {TextChunk("Hel", 1)};
  script.status = absl::InternalError("migrations exhausted");
  api_.SetScript(script);
  httplib::Result result = Post(
      "/v1/completions",
      R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  std::vector<std::string> events = SseData(result->body);
  ASSERT_EQ(events.size(), 3u) << result->body;
  EXPECT_EQ(ParseJson(events[0])["choices"][0]["text"], "Hel");
  json error = ParseJson(events[1]);
  EXPECT_EQ(error["error"]["message"], "migrations exhausted");
  EXPECT_EQ(error["error"]["type"], "internal_error");
  EXPECT_EQ(error["error"]["code"], 500);
  EXPECT_EQ(events[2], "[DONE]");
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

TEST_F(HttpFrontendTest, ClientDisconnectMidStreamRefusesSink) {
  FakeClientApi::Script script;
  script.chunks = {TextChunk("Hel", 1)};
  script.endless = true;
  api_.SetScript(script);

  std::unique_ptr<httplib::Client> client = NewClient();
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.set_header("Content-Type", "application/json");
  request.body = R"({"prompt": "a", "stream": true})";
  std::string received;
  request.content_receiver = [&received](const char* data, size_t size,
                                         uint64_t, uint64_t) {
    received.append(data, size);
    // Hang up once the first event is in.
    return received.find("\n\n") == std::string::npos;
  };
  httplib::Result result = client->send(request);
  EXPECT_FALSE(result);  // Cancelled by the receiver.
  EXPECT_THAT(received, StartsWith("data: "));
  client->stop();
  client.reset();

  EXPECT_TRUE(api_.WaitForSinkRefusal(kWait));
  EXPECT_TRUE(api_.WaitForFinished(1, kWait));
}

TEST_F(HttpFrontendTest, SlowFirstTokenCommitsTo200AndSendsKeepAlives) {
  // A long prefill: nothing for 1 s. The stream commits to 200 after the
  // commit delay and writes comments meanwhile (whose failing writes would
  // tell that the client is gone); the events that follow are unchanged.
  FakeClientApi::Script script = HelloScript();
  script.stall = absl::Seconds(1);
  api_.SetScript(script);

  std::unique_ptr<httplib::Client> client = NewClient();
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/chat/completions";
  request.set_header("Content-Type", "application/json");
  request.body =
      R"({"stream": true, "messages": [{"role": "user", "content": "hi"}]})";
  std::string received;
  request.content_receiver = [&received](const char* data, size_t size,
                                         uint64_t, uint64_t) {
    received.append(data, size);
    return true;
  };
  httplib::Result result = client->send(request);
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_THAT(result->get_header_value("Content-Type"),
              StartsWith("text/event-stream"));
  const size_t keep_alive = received.find(": keep-alive\n\n");
  ASSERT_NE(keep_alive, std::string::npos) << received;
  EXPECT_LT(keep_alive, received.find("data: ")) << received;
  EXPECT_TRUE(absl::EndsWith(received, "data: [DONE]\n\n")) << received;

  // Without the comments, the body is that of a fast stream.
  std::vector<std::string> events =
      SseData(absl::StrReplaceAll(received, {{": keep-alive\n\n", ""}}));
  ASSERT_EQ(events.size(), 4u) << received;
  EXPECT_EQ(ParseJson(events[0])["choices"][0]["delta"]["content"], "Hel");
  EXPECT_EQ(ParseJson(events[2])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[3], "[DONE]");
}

TEST_F(HttpFrontendTest, ClientGoneBeforeTheFirstTokenCancelsTheRequest) {
  // The client hangs up while its request waits for a (10 s) prefill: the
  // stream's next write fails, and the front end cancels the request through
  // its CancelToken instead of waiting for a chunk the sink could refuse.
  FakeClientApi::Script script = HelloScript();
  script.stall = kWait;
  api_.SetScript(script);
  const int fd = SendRawPost(frontend_->port(), "/v1/completions",
                             R"({"prompt": "a", "stream": true})");
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(api_.WaitForStarted(1, kWait));
  const absl::Time hung_up = absl::Now();
  ::close(fd);

  // 250 ms commit delay, then a failing write within a poll interval or two.
  const absl::Time limit = hung_up + absl::Milliseconds(1500);
  EXPECT_TRUE(api_.WaitForCancel(limit - absl::Now()));
  EXPECT_TRUE(api_.WaitForFinished(1, limit - absl::Now()));
  EXPECT_LT(absl::Now(), limit);
}

TEST_F(HttpFrontendTest, ManyConcurrentStreams) {
  constexpr int kStreams = 70;
  FakeClientApi::Script script = HelloScript();
  // Nothing is sent until all streams are open at once.
  script.wait_for_concurrent = kStreams;
  api_.SetScript(script);

  std::atomic<int> good{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([this, &good] {
      httplib::Result result = Post(
          "/v1/chat/completions",
          R"({"stream": true, "messages": [{"role": "user", "content": "x"}]})");
      if (!result) {
        ADD_FAILURE() << httplib::to_string(result.error());
        return;
      }
      if (result->status != 200) {
        ADD_FAILURE() << result->status << " " << result->body;
        return;
      }
      std::vector<std::string> events = SseData(result->body);
      if (events.size() == 4 && events.back() == "[DONE]") ++good;
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(good.load(), kStreams);
  EXPECT_EQ(api_.max_active(), kStreams);
}

TEST_F(HttpFrontendTest, ShutdownEndsInFlightStream) {
  FakeClientApi::Script script;
  script.endless = true;
  api_.SetScript(script);
  std::atomic<bool> got_data{false};
  std::thread client_thread([this, &got_data] {
    std::unique_ptr<httplib::Client> client = NewClient();
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.set_header("Content-Type", "application/json");
    request.body = R"({"prompt": "a", "stream": true})";
    request.content_receiver = [&got_data](const char*, size_t, uint64_t,
                                           uint64_t) {
      got_data = true;
      return true;
    };
    client->send(request);
  });
  absl::Time give_up = absl::Now() + kWait;
  while (!got_data && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(got_data);
  absl::Time start = absl::Now();
  frontend_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(api_.WaitForFinished(1, kWait));
  frontend_->Shutdown();  // Idempotent.
  client_thread.join();
}

TEST(HttpFrontendStartTest, BusyPortIsUnavailable) {
  FakeClientApi api;
  absl::StatusOr<std::unique_ptr<HttpFrontend>> first =
      HttpFrontend::Start(HttpFrontendOptions(), &api);
  ASSERT_TRUE(first.ok()) << first.status();
  HttpFrontendOptions options;
  options.listen_address = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<HttpFrontend>> second =
      HttpFrontend::Start(options, &api);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST(HttpFrontendStartTest, MalformedAddress) {
  FakeClientApi api;
  for (const char* address :
       {"localhost", "127.0.0.1:http", ":80", "127.0.0.1:70000"}) {
    HttpFrontendOptions options;
    options.listen_address = address;
    absl::StatusOr<std::unique_ptr<HttpFrontend>> frontend =
        HttpFrontend::Start(options, &api);
    ASSERT_FALSE(frontend.ok()) << address;
    EXPECT_EQ(frontend.status().code(), absl::StatusCode::kInvalidArgument)
        << address;
  }
}

TEST(HttpFrontendStartTest, ShutdownWithoutTraffic) {
  FakeClientApi api;
  absl::StatusOr<std::unique_ptr<HttpFrontend>> frontend =
      HttpFrontend::Start(HttpFrontendOptions(), &api);
  ASSERT_TRUE(frontend.ok()) << frontend.status();
  absl::Time start = absl::Now();
  (*frontend)->Shutdown();
  (*frontend)->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace pdserve::router
