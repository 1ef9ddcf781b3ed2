// The OpenAI HTTP target against a scripted HTTP server in this process:
// how it reads SSE streams other servers may send (CRLF line ends, events
// split across reads, comments, usage-only chunks) and how it names what
// went wrong. The real router is driven in tests/slo.
#include "loadgen/target.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "httplib.h"

namespace pdserve::loadgen {
namespace {

// Serves POST /v1/completions with `status` and the SSE `body`, written in
// pieces of `piece` bytes.
class ScriptedServer {
 public:
  ScriptedServer(int status, std::string body, size_t piece = 7)
      : status_(status), body_(std::move(body)), piece_(piece) {
    server_.Post("/v1/completions", [this](const httplib::Request& request,
                                           httplib::Response& response) {
      absl::MutexLock lock(&mu_);
      last_request_ = request.body;
      response.status = status_;
      if (status_ != 200) {
        response.set_content(body_, "application/json");
        return;
      }
      response.set_chunked_content_provider(
          "text/event-stream", [this](size_t, httplib::DataSink& sink) {
            for (size_t at = 0; at < body_.size(); at += piece_) {
              sink.write(body_.data() + at,
                         std::min(piece_, body_.size() - at));
            }
            sink.done();
            return true;
          });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // httplib 0.11 has no wait_until_ready; the socket is bound and
    // listening already (connections queue until the loop runs).
  }
  ~ScriptedServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  std::string last_request() {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }

 private:
  httplib::Server server_;
  const int status_;
  const std::string body_;
  const size_t piece_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::string last_request_ ABSL_GUARDED_BY(mu_);
};

std::string Event(const std::string& text) {
  return absl::StrCat(R"(data: {"choices": [{"index": 0, "text": ")", text,
                      R"("}], "usage": null})", "\n\n");
}

std::string Usage(int completion_tokens) {
  return absl::StrCat(
      R"(data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": )",
      completion_tokens, "}}\n\n");
}

RequestRecord Send(const std::string& url, int output_tokens = 3) {
  auto target = MakeTarget({.url = url, .model = "m", .temperature = 0});
  EXPECT_TRUE(target.ok()) << target.status();
  BenchRequest request;
  request.prompt = {300, 301, 302};
  request.output_tokens = output_tokens;
  return (*target)->Send(request, absl::Now(), absl::Seconds(10));
}

TEST(OpenAiHttpTargetTest, ReadsLfAndCrlfStreamsSplitAnywhere) {
  const std::string lf =
      absl::StrCat(": keep-alive\n\n", Event("a"), Event("b"), Event("c"),
                   Usage(3), "data: [DONE]\n\n");
  const std::string crlf = absl::StrReplaceAll(lf, {{"\n", "\r\n"}});
  for (const std::string& body : {lf, crlf}) {
    for (size_t piece : {1u, 5u, 4096u}) {
      ScriptedServer server(200, body, piece);
      const RequestRecord r = Send(server.url());
      ASSERT_TRUE(r.ok()) << r.error_kind << ": " << r.error;
      EXPECT_EQ(r.output_tokens, 3);
      EXPECT_EQ(r.prompt_tokens, 3);
      EXPECT_EQ(r.itl_ms.size(), 2u);  // three output chunks
      EXPECT_LE(r.ttft, r.e2e);
    }
  }
  // A data field over two lines (joined by the SSE rule), and a last event
  // the server did not end with a blank line.
  {
    ScriptedServer server(200,
                          absl::StrCat(Event("a"),
                                       "data: {\"choices\": [{\"index\": 0,\n"
                                       "data: \"text\": \"b\"}]}\n\n",
                                       Event("c"), Usage(3), "data: [DONE]"));
    const RequestRecord r = Send(server.url());
    ASSERT_TRUE(r.ok()) << r.error_kind << ": " << r.error;
    EXPECT_EQ(r.itl_ms.size(), 2u);
  }
  // What it asked for: a token-id prompt, streamed, EOS ignored, usage.
  ScriptedServer server(200, lf);
  Send(server.url());
  for (const char* field :
       {R"("prompt":[300,301,302])", R"("stream":true)", R"("ignore_eos":true)",
        R"("include_usage":true)", R"("model":"m")", R"("max_tokens":3)"}) {
    EXPECT_NE(server.last_request().find(field), std::string::npos)
        << field << " not in " << server.last_request();
  }
}

TEST(OpenAiHttpTargetTest, NamesWhatWentWrong) {
  {
    ScriptedServer server(503, R"({"error": {"message": "full"}})");
    const RequestRecord r = Send(server.url());
    EXPECT_EQ(r.error_kind, "HTTP 503");
    EXPECT_NE(r.error.find("full"), std::string::npos);
  }
  {
    // No [DONE]: the stream was cut.
    ScriptedServer server(200, absl::StrCat(Event("a"), Event("b")));
    EXPECT_EQ(Send(server.url()).error_kind, "TRUNCATED");
  }
  {
    ScriptedServer server(200, absl::StrCat(Event("a"), "data: {not json\n\n",
                                            "data: [DONE]\n\n"));
    EXPECT_EQ(Send(server.url()).error_kind, "BAD_EVENT");
  }
  {
    ScriptedServer server(
        200, absl::StrCat(Event("a"), R"(data: {"error": {"message": "boom"}})",
                          "\n\ndata: [DONE]\n\n"));
    const RequestRecord r = Send(server.url());
    EXPECT_EQ(r.error_kind, "STREAM_ERROR");
    EXPECT_NE(r.error.find("boom"), std::string::npos);
  }
  {
    // Fewer tokens than asked for (with ignore_eos): cut short silently.
    ScriptedServer server(
        200, absl::StrCat(Event("a"), Usage(1), "data: [DONE]\n\n"));
    const RequestRecord r = Send(server.url());
    EXPECT_EQ(r.error_kind, "SHORT_OUTPUT");
    EXPECT_EQ(r.error, "1 of 3 tokens");
  }
  EXPECT_EQ(Send("http://127.0.0.1:1").error_kind, "CONNECT");
}

}  // namespace
}  // namespace pdserve::loadgen
