// HttpFrontend's SSE streams and its life as a server: events in order,
// errors mid-stream, clients that hang up, slow first tokens, many streams
// at once, start-up failures and shutdown with streams in flight.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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

namespace pdserve::router {
namespace {

using json = nlohmann::json;
using ::testing::StartsWith;

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
