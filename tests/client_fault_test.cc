// Clients that go away or run out of time: streaming HTTP clients that
// disconnect (some waiting for their first token, some mid-stream), and
// per-request deadlines over gRPC (the call's deadline) and HTTP (the
// `timeout` body parameter). The work stops on every worker and every KV
// block is free again within about a second.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/fault_testing.h"
#include "tests/serving_testing.h"

namespace pdserve {
namespace {

using testing::FaultRow;
using testing::FaultTest;
using testing::Generate;
using testing::HeavyTinyModelPath;
using testing::OfflineEngine;
using testing::Outcome;
using testing::TokenRequest;

// The port of "http://127.0.0.1:PORT".
int HttpPort(const std::string& url) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(url.substr(url.rfind(':') + 1), &port)) << url;
  return port;
}

// A /v1/completions body: `length` prompt token ids from `salt`, streamed,
// `max_tokens` tokens whatever the model says.
std::string CompletionBody(int length, int salt, int max_tokens, bool stream,
                           double timeout_s = 0) {
  std::vector<std::string> ids;
  for (int i = 0; i < length; ++i) {
    ids.push_back(absl::StrCat(1 + (salt * 131 + i * 17) % 250));
  }
  std::string body = absl::StrCat(R"({"prompt": [)", absl::StrJoin(ids, ","),
                                  R"(], "max_tokens": )", max_tokens,
                                  R"(, "ignore_eos": true, "stream": )",
                                  stream ? "true" : "false");
  if (timeout_s > 0) absl::StrAppend(&body, R"(, "timeout": )", timeout_s);
  absl::StrAppend(&body, "}");
  return body;
}

// Opens a connection and sends a streaming completion request; the socket
// stays open, unread, until closed.
int OpenStream(int port, const std::string& body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  return fd;
}

// What one streamed response looked like from the client's side.
struct StreamSeen {
  std::string bytes;
  // When its first token arrived (InfiniteFuture: none yet).
  absl::Time first_token = absl::InfiniteFuture();
  // The router closed the connection.
  bool closed_by_router = false;

  int tokens() const {
    int n = 0;
    for (size_t at = bytes.find("data: {"); at != std::string::npos;
         at = bytes.find("data: {", at + 1)) {
      ++n;
    }
    return n;
  }
  bool finished() const {
    return bytes.find("data: [DONE]") != std::string::npos;
  }
  bool ok_so_far() const {
    return bytes.empty() || bytes.starts_with("HTTP/1.1 200");
  }
};

// Reads what has arrived on `fd` without waiting. Returns whether the
// response has started streaming tokens.
bool Streaming(int fd, StreamSeen* seen) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0) seen->closed_by_router = true;
    if (n <= 0) break;
    seen->bytes.append(buffer, n);
  }
  const bool streaming = seen->tokens() > 0;
  if (streaming && seen->first_token == absl::InfiniteFuture()) {
    seen->first_token = absl::Now();
  }
  return streaming;
}

// Whether every worker is idle; else what is left, in `busy`. `only_held`
// says whether what is left is only KV blocks a decode worker still holds
// for a transfer (reserved or quarantined, nothing queued or running).
bool Idle(const std::map<std::string, v1::WorkerInfo>& workers,
          std::string* busy, bool* only_held) {
  busy->clear();
  *only_held = true;
  for (const auto& [id, w] : workers) {
    const v1::WorkerLoad& load = w.load();
    const bool working =
        w.inflight_requests() != 0 || load.queued_prefill_tokens() != 0 ||
        load.running_sequences() != 0 || load.waiting_sequences() != 0;
    const bool holding = load.reserved_kv_blocks() != 0 ||
                         load.inflight_transfers() != 0 ||
                         load.free_kv_blocks() != load.total_kv_blocks();
    if (working) *only_held = false;
    if (working || holding) {
      absl::StrAppend(busy, id, " (", load.ShortDebugString(), " inflight ",
                      w.inflight_requests(), ") ");
    }
  }
  return busy->empty();
}

// 50 streaming HTTP clients disconnect at once, some mid-stream and some
// still waiting for their first token: every worker stops their work and
// frees their blocks within about a second.
TEST_F(FaultTest, FiftyHttpClientsDisconnectingFreeEverything) {
  constexpr int kStreams = 50;
  // Work that takes a cluster ignoring the disconnects far longer than the
  // bound below: on the slow tiny model 400 tokens a stream took AMD Zen 4
  // about 1.2 ms a token, all 50 streams under a second, so a router that
  // never cancelled passed; the heavy model's context holds 3000 tokens.
  constexpr int kMaxTokens = 3000;
  // Long prompts, so that the ones still queued are seconds of prefill: a
  // router that does not cancel a request whose client left before its
  // first token (it stops it only when that token cannot be sent) took 2 s
  // to free everything with 60-token prompts.
  constexpr int kPromptTokens = 600;
  model_path_ = HeavyTinyModelPath();
  // KV for every prompt at once (64 MB holds 13 of them): the test counts
  // a request refused for want of KV as lost.
  Start("http-disconnect", 1, 1,
        {"--max_batch_tokens=64", "--kv_cache_mb=512"});
  const int port = HttpPort(cluster_->http_url());
  std::vector<int> sockets;
  for (int i = 0; i < kStreams; ++i) {
    sockets.push_back(
        OpenStream(port, CompletionBody(kPromptTokens, i, kMaxTokens, true)));
  }
  // Until some streams are running, the first of them a few tokens in (its
  // pace measures how long the work left would take): the rest are still
  // queued for prefill.
  std::vector<StreamSeen> seen(sockets.size());
  int streaming = 0;
  int most_tokens = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while ((streaming < 5 || most_tokens < 8) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    streaming = 0;
    most_tokens = 0;
    for (size_t i = 0; i < sockets.size(); ++i) {
      streaming += Streaming(sockets[i], &seen[i]);
      most_tokens = std::max(most_tokens, seen[i].tokens());
    }
  }
  ASSERT_GE(streaming, 5) << "no stream started";
  ASSERT_LT(streaming, kStreams) << "every stream started: none waits any more";
  const absl::Time closed = absl::Now();
  for (int fd : sockets) ::close(fd);

  // What the clients saw before they went: a stream the router had already
  // ended (finished, failed, or closed) did not end by its client's
  // disconnect.
  int cut_by_client = 0, finished = 0, lost = 0;
  // The time the work left would take a cluster that ignored the
  // disconnects: at least the most advanced stream's remaining tokens at
  // the pace it had (its first token was seen up to one poll late, so the
  // pace is if anything overstated and the time understated).
  absl::Duration work_left = absl::InfiniteDuration();
  absl::Duration leader_ran = absl::ZeroDuration();
  // And the prompts still queued, at the pace the started ones began.
  absl::Time first_started = absl::InfiniteFuture();
  for (const StreamSeen& s : seen) {
    first_started = std::min(first_started, s.first_token);
    if (s.finished()) {
      ++finished;
    } else if (s.closed_by_router || !s.ok_so_far()) {
      ++lost;
      ADD_FAILURE() << "the router ended a stream before its client left: "
                    << s.bytes.substr(0, 300);
    } else {
      ++cut_by_client;
    }
    if (s.tokens() == most_tokens && s.tokens() > 1) {
      const absl::Duration per_token =
          (closed - s.first_token) / (s.tokens() - 1);
      work_left = std::min(work_left, per_token * (kMaxTokens - s.tokens()));
      leader_ran = closed - s.first_token;
    }
  }

  // The README promises about a second: typically 0.45-0.6 s (heartbeats
  // every 200 ms; the work itself stops sooner). The bound leaves room for a
  // loaded 2-core CI machine (50 cancellations, each a few RPCs, have queued
  // there for up to 3.3 s) and does not depend on the model's speed.
  const absl::Duration bound = absl::Seconds(4);
  const absl::Duration prefill_left =
      (closed - first_started) / (streaming - 1) * (kStreams - streaming);
  // A cluster that ignored the disconnects, mid-stream or before the first
  // token, would still be busy at twice the bound.
  ASSERT_GT(work_left, 2 * bound)
      << "this model generates too fast (" << most_tokens << " tokens in "
      << leader_ran << ") to tell freed work from finished work";
  ASSERT_GT(prefill_left, 2 * bound)
      << "prompts prefill too fast (" << streaming - 1 << " in "
      << closed - first_started << ") to tell dropped ones from finished ones";

  // The one allowance: once (CI, after Admit stopped waiting behind the
  // engine loop) a transfer's blocks stayed held by the decode worker, its
  // writer's release never confirmed, until its 20 s reservation ended plus
  // the 0.5 s quarantine. Not seen in the runs made for issue 22 (four
  // healthy ones, 0.28-0.44 s); if it happens, only that (blocks held,
  // nothing queued or running anywhere) may outlast the bound, and the test
  // says so.
  std::string busy;
  bool only_held = false;
  while (!Idle(Workers(), &busy, &only_held) && absl::Now() - closed < bound) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  const absl::Duration took = absl::Now() - closed;
  bool held_past_bound = false;
  if (!busy.empty()) {
    ASSERT_TRUE(only_held) << "work still running " << took
                           << " after every client left: " << busy;
    held_past_bound = true;
    std::cerr << "KV blocks still held " << took
              << " after the disconnects (the known gap: waiting for the "
                 "reservation to end): "
              << busy << "\n";
    ASSERT_NE(AwaitIdle(absl::Seconds(21)), absl::InfiniteDuration());
  }
  FaultRow row;
  row.fault = absl::StrCat(
      kStreams,
      " streaming HTTP clients disconnect (some mid-stream, the rest "
      "before their first token)");
  row.sent = kStreams;
  row.completed = finished;
  row.rejected = cut_by_client;  // Each ended by its own client.
  row.lost = lost;
  row.recovery = took;
  row.recovery_what = absl::StrCat(
      "disconnect -> every KV block free (", streaming, " were mid-stream",
      held_past_bound ? "; one transfer's blocks held to its reservation's end"
                      : "",
      ")");
  Report(row);

  // Every disconnect is one cancellation, counted once, and the request's
  // end is recorded as cancelled.
  EXPECT_EQ(AwaitMetric("router", "pdserve_request_cancellations_total", {},
                        cut_by_client),
            cut_by_client);
  EXPECT_EQ(Metric("router", "pdserve_requests_total",
                   {{"endpoint", "completions"}, {"status", "cancelled"}}),
            cut_by_client);

  // The router forgot them all: a new request is served.
  httplib::Client client(cluster_->http_url());
  client.set_read_timeout(60);
  auto response = client.Post(
      "/v1/completions", CompletionBody(20, 1, 4, false), "application/json");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200) << response->body;
}

// Deadlines hold end to end: a gRPC deadline and an HTTP `timeout` end a
// long generation at the deadline with DEADLINE_EXCEEDED / 504, and the
// workers drop it at once: every worker is idle long before the generation
// would have ended had they ignored the deadline.
TEST_F(FaultTest, RequestDeadlinesAreHonouredEndToEnd) {
  // A model whose generation to the end of its context takes seconds on any
  // CPU this runs on: on the slow tiny model a fast AMD Zen 4 generated the
  // whole context in 180 ms, too fast for a deadline to fall inside it.
  model_path_ = HeavyTinyModelPath();
  OfflineEngine offline(model_path_);
  const int32_t vocab = offline.model().config().vocab_size;
  const int prompt = 50;
  const int most_tokens = offline.model().config().context_length - prompt;
  // The whole generation's time from 64 decode steps offline: a 65-token
  // request's time less a 1-token one's (the same prompt length, fresh
  // prompts), so that prefill speed does not enter it. In this process,
  // with nothing else running, and before the context grows: a lower bound
  // for the cluster's.
  auto timed = [&](int salt, int tokens) {
    const absl::Time start = absl::Now();
    const Outcome outcome =
        offline.Run(TokenRequest(prompt, salt, tokens, vocab));
    EXPECT_TRUE(outcome.status.ok()) << outcome.status;
    return absl::Now() - start;
  };
  const absl::Duration decode_64 = timed(2, 65) - timed(6, 1);
  const absl::Duration whole_generation = decode_64 / 64 * most_tokens;
  const absl::Duration limit = std::clamp(
      whole_generation / 4, absl::Milliseconds(300), absl::Seconds(1));
  // Every worker must be idle within half the time the request still had
  // to run at its deadline: a worker that ignored the deadline could not.
  const absl::Duration idle_within = (whole_generation - limit) / 2;
  ASSERT_GE(idle_within, absl::Milliseconds(750))
      << "this model generates too fast (whole generation " << whole_generation
      << ") to tell a dropped request from a finished one";
  Start("deadline", 1, 1);

  // gRPC: the call's deadline.
  v1::GenerateRequest long_request =
      TokenRequest(prompt, 3, most_tokens, vocab);
  absl::Time start = absl::Now();
  const Outcome grpc_outcome =
      Generate(cluster_->router_address(), long_request, limit);
  const absl::Duration grpc_took = absl::Now() - start;
  EXPECT_EQ(grpc_outcome.status.code(), absl::StatusCode::kDeadlineExceeded)
      << grpc_outcome.status;
  EXPECT_GT(grpc_outcome.tokens.size(), 0u) << "it never started";
  EXPECT_LT(grpc_outcome.tokens.size(), static_cast<size_t>(most_tokens / 2));
  EXPECT_LT(grpc_took, limit + absl::Milliseconds(500));
  ASSERT_NE(AwaitIdle(idle_within), absl::InfiniteDuration())
      << "the workers kept generating past the gRPC deadline";
  const absl::Duration grpc_idle = absl::Now() - start - limit;

  // HTTP: the body's timeout (seconds), unary and streamed.
  httplib::Client client(cluster_->http_url());
  client.set_read_timeout(60);
  start = absl::Now();
  auto unary = client.Post("/v1/completions",
                           CompletionBody(prompt, 4, most_tokens, false,
                                          absl::ToDoubleSeconds(limit)),
                           "application/json");
  const absl::Duration http_took = absl::Now() - start;
  ASSERT_TRUE(unary) << httplib::to_string(unary.error());
  EXPECT_EQ(unary->status, 504) << unary->body;
  EXPECT_NE(unary->body.find("\"error\""), std::string::npos) << unary->body;
  EXPECT_LT(http_took, limit + absl::Milliseconds(500));
  ASSERT_NE(AwaitIdle(idle_within), absl::InfiniteDuration())
      << "the workers kept generating past the HTTP timeout";
  auto streamed = client.Post("/v1/completions",
                              CompletionBody(prompt, 5, most_tokens, true,
                                             absl::ToDoubleSeconds(limit)),
                              "application/json");
  ASSERT_TRUE(streamed) << httplib::to_string(streamed.error());
  EXPECT_EQ(streamed->status, 200);
  // Tokens, then an error event naming the deadline, then [DONE].
  EXPECT_NE(streamed->body.find("\"text\""), std::string::npos);
  EXPECT_NE(streamed->body.find("\"error\""), std::string::npos)
      << streamed->body.substr(streamed->body.size() - 300);
  EXPECT_NE(streamed->body.rfind("data: [DONE]"), std::string::npos);
  ASSERT_NE(AwaitIdle(idle_within), absl::InfiniteDuration())
      << "the workers kept generating past the streamed request's timeout";

  FaultRow row;
  row.fault = absl::StrFormat(
      "deadline %d ms on %d-token generations (gRPC %d tokens by then, HTTP "
      "x2; whole generation ~%d ms)",
      absl::ToInt64Milliseconds(limit), most_tokens, grpc_outcome.tokens.size(),
      absl::ToInt64Milliseconds(whole_generation));
  row.sent = 3;
  row.rejected =
      (grpc_outcome.status.code() == absl::StatusCode::kDeadlineExceeded) +
      (unary->status == 504) +
      (streamed->body.find("\"error\"") != std::string::npos);
  row.lost = row.sent - row.rejected;
  row.recovery = grpc_idle;
  row.recovery_what = "deadline -> every KV block free (gRPC)";
  Report(row);
}

}  // namespace
}  // namespace pdserve
