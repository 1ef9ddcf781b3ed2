// The harness of the HttpFrontend tests: a front end on an ephemeral port
// over a FakeClientApi (HttpFrontendTest), and helpers to script chunks and
// read JSON, SSE bodies and OpenAI error bodies. Shared by the test targets
// that split HttpFrontend's cases by topic.
//
// Thread-safety: as gtest fixtures; the helpers are thread-safe.
#ifndef PDSERVE_ROUTER_TESTING_HTTP_FRONTEND_FIXTURE_H_
#define PDSERVE_ROUTER_TESTING_HTTP_FRONTEND_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/client.pb.h"
#include "router/http_frontend.h"
#include "router/testing/fake_client_api.h"

namespace pdserve::router {

// A chunk of one token.
v1::GenerateResponse TextChunk(const std::string& text, uint32_t id);
// The last chunk (finish reason STOP), with usage 4 prompt, 3 completion and
// 1 cached token.
v1::GenerateResponse FinalChunk(const std::string& text, uint32_t id);
// "Hel", "lo", "!" and the end.
FakeClientApi::Script HelloScript();

// `text` as JSON; a parse error fails the test (and returns discarded).
nlohmann::json ParseJson(const std::string& text);

// The payloads of an SSE body ("data: X\n\n" events), in order.
std::vector<std::string> SseData(const std::string& body);

// Connects to 127.0.0.1:`port` and sends a POST of `body` to `path`, then
// reads nothing. Returns the socket, or -1.
int SendRawPost(int port, absl::string_view path, absl::string_view body);

// Expects an OpenAI error body of HTTP `status` and error `type`.
void ExpectErrorBody(const httplib::Result& result, int status,
                     const std::string& type);

// A front end serving model "smollm2" (context 2048) from `api_`.
class HttpFrontendTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kWait = FakeClientApi::kWait;

  void SetUp() override;
  // Replaces the running front end with one started with `options`.
  void StartServer(HttpFrontendOptions options);
  std::unique_ptr<httplib::Client> NewClient();
  httplib::Result Post(const std::string& path, const std::string& body);
  httplib::Result Get(const std::string& path);

  FakeClientApi api_;
  std::unique_ptr<HttpFrontend> frontend_;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_TESTING_HTTP_FRONTEND_FIXTURE_H_
