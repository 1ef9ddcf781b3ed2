#include "router/testing/http_frontend_fixture.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"

namespace pdserve::router {

using json = nlohmann::json;
using ::testing::StartsWith;

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

void HttpFrontendTest::SetUp() {
  v1::ListModelsResponse models;
  v1::ModelInfo* model = models.add_models();
  model->set_id("smollm2");
  model->set_context_length(2048);
  model->set_created_unix_s(1700000000);
  model->set_owned_by("pdserve");
  api_.SetModels(models);
  StartServer(HttpFrontendOptions());
}

void HttpFrontendTest::StartServer(HttpFrontendOptions options) {
  frontend_.reset();
  absl::StatusOr<std::unique_ptr<HttpFrontend>> frontend =
      HttpFrontend::Start(options, &api_);
  ASSERT_TRUE(frontend.ok()) << frontend.status();
  frontend_ = std::move(*frontend);
  ASSERT_GT(frontend_->port(), 0);
}

std::unique_ptr<httplib::Client> HttpFrontendTest::NewClient() {
  auto client =
      std::make_unique<httplib::Client>("127.0.0.1", frontend_->port());
  client->set_connection_timeout(5);
  client->set_read_timeout(10);
  client->set_write_timeout(5);
  return client;
}

httplib::Result HttpFrontendTest::Post(const std::string& path,
                                       const std::string& body) {
  return NewClient()->Post(path, body, "application/json");
}

httplib::Result HttpFrontendTest::Get(const std::string& path) {
  return NewClient()->Get(path);
}

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

}  // namespace pdserve::router
