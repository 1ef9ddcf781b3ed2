#include "router/http_frontend.h"

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http_server_thread.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "httplib.h"
#include "metrics/text_format.h"
#include "proto/client.pb.h"
#include "router/openai_request.h"
#include "router/openai_response.h"
#include "router/request_ids.h"

namespace pdserve::router {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kEventStream[] = "text/event-stream";
// How often a waiting stream checks that its client is still connected.
constexpr absl::Duration kStreamPollInterval = absl::Milliseconds(200);
// How long a stream waits for its first event before committing to status
// 200: errors found at once (bad prompt, overload, unknown model) still get
// their own status; after that a slow first token (a long prefill) is
// waited for with SSE comments on an open 200 stream, whose failing writes
// tell that the client has gone.
constexpr absl::Duration kStreamCommitDelay = absl::Milliseconds(250);
// Sent when nothing else was for a poll interval; clients ignore comments.
constexpr absl::string_view kKeepAlive = ": keep-alive\n\n";

// The routes we serve, for telling 405 from 404.
struct Route {
  const char* path;
  const char* method;
};
constexpr Route kRoutes[] = {
    {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
    {"/v1/models", "GET"},       {"/health", "GET"},
    {"/tokenize", "POST"},       {"/metrics", "GET"},
};

const char* ErrorTypeForHttpStatus(int status) {
  if (status == 404) return "not_found_error";
  if (status >= 400 && status < 500) return "invalid_request_error";
  return "internal_error";
}

// One streaming generation, shared by the handler, the content provider
// (connection thread) and the generator thread that runs
// ClientApi::Generate.
struct StreamState {
  absl::Mutex mu;
  // Formatted SSE payloads not yet written.
  std::deque<std::string> events ABSL_GUARDED_BY(mu);
  // Whether any event was produced (the HTTP status is then 200).
  bool started ABSL_GUARDED_BY(mu) = false;
  // Generate has returned, with `status`.
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  // A write to the client failed (or the response was abandoned): the sink
  // refuses further chunks.
  bool client_gone ABSL_GUARDED_BY(mu) = false;
  // Stops the request on every worker as soon as the client is known to be
  // gone, also while it still waits for its first token.
  CancelToken cancel;
  std::thread generator;
};

// Marks the client gone and stops its request.
void ClientGone(StreamState& stream) {
  {
    absl::MutexLock lock(&stream.mu);
    if (stream.done) return;
    stream.client_gone = true;
  }
  stream.cancel.Cancel();
}

bool StartedOrDone(StreamState* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
  return s->started || s->done;
}

bool HasEventsOrDone(StreamState* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
  return !s->events.empty() || s->done;
}

// httplib 0.11 listens with a backlog of 5: a burst of new connections (a
// benchmark opening 64 streams at once) overflows it, and the kernel drops
// their handshakes until clients give up. Calling listen() again on the
// bound socket raises the backlog.
class HttpServer : public httplib::Server {
 public:
  bool RaiseListenBacklog() { return ::listen(svr_sock_, SOMAXCONN) == 0; }
};

bool WriteEvent(httplib::DataSink& sink, absl::string_view payload) {
  std::string event = absl::StrCat("data: ", payload, "\n\n");
  return sink.write(event.data(), event.size());
}

}  // namespace

class HttpFrontend::Impl {
 public:
  Impl(const HttpFrontendOptions& options, ClientApi* api)
      : options_(options),
        api_(api),
        metrics_(options.metrics != nullptr ? options.metrics
                                            : RouterMetrics::Unregistered()) {}

  ~Impl() { Shutdown(); }

  absl::Status Start() {
    if (options_.max_connections < 1) {
      return absl::InvalidArgumentError("max_connections must be >= 1");
    }
    Configure();
    HttpServerThreadOptions accept_loop;
    accept_loop.listen_address = options_.listen_address;
    accept_loop.after_bind = [this] {
      if (!server_.RaiseListenBacklog()) {
        PD_LOG(WARNING) << "cannot raise the listen backlog on "
                        << options_.listen_address << "; bursts of new "
                        << "connections may be refused";
      }
    };
    PD_ASSIGN_OR_RETURN(accept_loop_,
                        HttpServerThread::Start(accept_loop, &server_));
    PD_LOG(INFO) << "OpenAI HTTP front end listening on "
                 << options_.listen_address << " (port " << accept_loop_->port()
                 << ")";
    return absl::OkStatus();
  }

  int port() const {
    return accept_loop_ == nullptr ? -1 : accept_loop_->port();
  }

  void Shutdown() {
    // Every open stream stops at its next chunk; the accept loop then
    // stops and its connection threads finish.
    stopping_ = true;
    if (accept_loop_ != nullptr) accept_loop_->Shutdown();
  }

 private:
  void Configure() {
    int threads = options_.max_connections;
    server_.new_task_queue = [threads] {
      return new httplib::ThreadPool(threads);
    };
    server_.set_payload_max_length(options_.max_body_bytes);
    if (options_.api_keys.enabled()) {
      server_.set_pre_routing_handler(
          [this](const httplib::Request& req, httplib::Response& res) {
            return CheckApiKey(req, res);
          });
    }

    server_.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   HandleGenerate(OpenAiKind::kCompletion, req, res);
                 });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   HandleGenerate(OpenAiKind::kChat, req, res);
                 });
    server_.Get("/v1/models",
                [this](const httplib::Request&, httplib::Response& res) {
                  HandleModels(res);
                });
    server_.Get("/health",
                [this](const httplib::Request&, httplib::Response& res) {
                  HandleHealth(res);
                });
    server_.Post("/tokenize",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   HandleTokenize(req, res);
                 });
    if (options_.metrics_registry != nullptr) {
      server_.Get(
          "/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics::RenderText(*options_.metrics_registry),
                            metrics::kTextContentType);
          });
    }
    server_.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) {
          return HandleHttpError(req, res);
        }));
    server_.set_exception_handler([](const httplib::Request&,
                                     httplib::Response& res,
                                     std::exception_ptr) {
      SendJson(res, 500,
               ErrorBody(absl::InternalError("internal error in handler")));
    });
  }

  // Lets a request with an accepted key (or to /health, /metrics) through
  // to its route; answers 401 otherwise.
  httplib::Server::HandlerResponse CheckApiKey(const httplib::Request& req,
                                               httplib::Response& res) {
    if (req.path == "/health" || req.path == "/metrics") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string header = req.get_header_value("Authorization");
    constexpr absl::string_view kBearer = "Bearer ";
    if (absl::StartsWith(header, kBearer) &&
        options_.api_keys.Accepts(
            absl::string_view(header).substr(kBearer.size()))) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.set_header("WWW-Authenticate", "Bearer");
    SendJson(res, 401,
             ErrorBody(401, "invalid_request_error",
                       header.empty()
                           ? "no API key: send 'Authorization: Bearer KEY'"
                           : "the API key in 'Authorization' is not "
                             "accepted"));
    return httplib::Server::HandlerResponse::Handled;
  }

  static void SendJson(httplib::Response& res, int status,
                       const std::string& body) {
    res.status = status;
    res.set_content(body, kJson);
  }

  void SendError(httplib::Response& res, const absl::Status& status) {
    int http_status = HttpStatusFor(status.code());
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      res.set_header("Retry-After", absl::StrCat(options_.retry_after_s));
    }
    // 503s (overload, no worker) are expected under load and not logged.
    if (http_status == 500) {
      // A completion request's id is already on the response.
      const std::string id = res.get_header_value(kRequestIdHeader);
      PD_LOG(WARNING) << "HTTP 500"
                      << (id.empty() ? "" : absl::StrCat(" for request ", id))
                      << ": " << status;
    }
    SendJson(res, http_status, ErrorBody(status));
  }

  // Fills the body of httplib's own error responses (no route, body too
  // large, malformed request); leaves responses our handlers wrote alone.
  httplib::Server::HandlerResponse HandleHttpError(const httplib::Request& req,
                                                   httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      std::string allowed;
      for (const Route& route : kRoutes) {
        if (req.path == route.path) allowed = route.method;
      }
      if (!allowed.empty()) {
        res.status = 405;
        res.set_header("Allow", allowed);
        res.set_content(
            ErrorBody(405, "invalid_request_error",
                      absl::StrCat("method ", req.method, " is not allowed on ",
                                   req.path, "; use ", allowed)),
            kJson);
        return httplib::Server::HandlerResponse::Handled;
      }
      res.set_content(
          ErrorBody(404, "not_found_error",
                    absl::StrCat("no route for ", req.method, " ", req.path)),
          kJson);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (res.status == 413) {
      res.set_content(BodyTooLarge(), kJson);
      return httplib::Server::HandlerResponse::Handled;
    }
    res.set_content(ErrorBody(res.status, ErrorTypeForHttpStatus(res.status),
                              absl::StrCat("HTTP error ", res.status)),
                    kJson);
    return httplib::Server::HandlerResponse::Handled;
  }

  std::string BodyTooLarge() const {
    return ErrorBody(413, "invalid_request_error",
                     absl::StrCat("request body is larger than ",
                                  options_.max_body_bytes, " bytes"));
  }

  // The model name for responses: the request's, or the only served model
  // when the request left it empty.
  std::string ResponseModel(const std::string& requested) {
    if (!requested.empty()) return requested;
    absl::StatusOr<v1::ListModelsResponse> models = api_->ListModels();
    if (models.ok() && models->models_size() == 1) {
      return models->models(0).id();
    }
    return requested;
  }

  void HandleGenerate(OpenAiKind kind, const httplib::Request& req,
                      httplib::Response& res) {
    const Endpoint endpoint = kind == OpenAiKind::kChat
                                  ? Endpoint::kChatCompletions
                                  : Endpoint::kCompletions;
    if (req.body.size() > options_.max_body_bytes) {
      metrics_->RecordRequest(endpoint, absl::InvalidArgumentError("large"));
      SendJson(res, 413, BodyTooLarge());
      return;
    }
    absl::StatusOr<OpenAiRequest> parsed =
        kind == OpenAiKind::kChat ? ParseChatCompletionRequest(req.body)
                                  : ParseCompletionRequest(req.body);
    if (parsed.ok() && parsed->generate.request_id().empty()) {
      const std::string header = req.get_header_value(kRequestIdHeader);
      parsed->generate.set_request_id(header.empty() ? NewRequestId() : header);
    }
    if (parsed.ok()) {
      // Checked here (the core checks again) so that an id unfit for a
      // header is never echoed in one.
      if (absl::Status id = CheckRequestId(parsed->generate.request_id());
          !id.ok()) {
        parsed = id;
      } else {
        res.set_header(kRequestIdHeader, parsed->generate.request_id());
      }
    }
    if (!parsed.ok()) {
      metrics_->RecordRequest(endpoint, parsed.status());
      SendError(res, parsed.status());
      return;
    }
    absl::Time deadline =
        absl::Now() + parsed->timeout.value_or(options_.default_timeout);
    OpenAiResponseOptions format;
    format.kind = kind;
    format.id = ResponseId(kind, parsed->generate.request_id());
    format.model = ResponseModel(parsed->generate.model());
    format.created_unix_s = absl::ToUnixSeconds(absl::Now());
    format.include_usage = parsed->include_usage;
    format.logprobs = parsed->logprobs;
    if (parsed->stream) {
      ServeStream(endpoint, std::move(*parsed), deadline, std::move(format),
                  res);
    } else {
      ServeUnary(endpoint, std::move(*parsed), deadline, std::move(format),
                 res);
    }
  }

  void ServeUnary(Endpoint endpoint, OpenAiRequest request, absl::Time deadline,
                  OpenAiResponseOptions format, httplib::Response& res) {
    OpenAiStreamFormatter formatter(std::move(format));
    absl::Status status =
        api_->Generate(std::move(request.generate), deadline,
                       [this, &formatter](const v1::GenerateResponse& chunk) {
                         if (stopping_) return false;
                         formatter.Accumulate(chunk);
                         return true;
                       });
    metrics_->RecordRequest(endpoint, status);
    if (!status.ok()) {
      SendError(res, status);
      return;
    }
    SendJson(res, 200, formatter.Final());
  }

  void ServeStream(Endpoint endpoint, OpenAiRequest request,
                   absl::Time deadline, OpenAiResponseOptions format,
                   httplib::Response& res) {
    auto stream = std::make_shared<StreamState>();
    auto formatter = std::make_shared<OpenAiStreamFormatter>(std::move(format));
    stream->generator =
        std::thread([this, stream, formatter, deadline, endpoint,
                     generate = std::move(request.generate)]() mutable {
          absl::Status status = api_->Generate(
              std::move(generate), deadline,
              [this, &stream, &formatter](const v1::GenerateResponse& chunk) {
                // Only this thread touches the formatter.
                std::vector<std::string> events = formatter->OnChunk(chunk);
                absl::MutexLock lock(&stream->mu);
                if (stream->client_gone || stopping_) return false;
                for (std::string& event : events) {
                  stream->events.push_back(std::move(event));
                  stream->started = true;
                }
                return true;
              },
              &stream->cancel);
          metrics_->RecordRequest(endpoint, status);
          absl::MutexLock lock(&stream->mu);
          stream->done = true;
          stream->status = std::move(status);
        });

    // The status line depends on whether anything comes before an error.
    bool started;
    absl::Status status;
    {
      absl::MutexLock lock(&stream->mu);
      stream->mu.AwaitWithTimeout(absl::Condition(&StartedOrDone, stream.get()),
                                  kStreamCommitDelay);
      started = stream->started;
      status = stream->status;
    }
    if (!started && !status.ok()) {
      stream->generator.join();
      SendError(res, status);
      return;
    }
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        kEventStream,
        [stream](size_t /*offset*/, httplib::DataSink& sink) {
          return WriteEvents(*stream, sink);
        },
        [stream](bool /*success*/) {
          ClientGone(*stream);
          stream->generator.join();
        });
  }

  // Writes what the generator has produced; called by httplib on the
  // connection thread until it returns false or calls sink.done().
  static bool WriteEvents(StreamState& stream, httplib::DataSink& sink) {
    std::deque<std::string> batch;
    bool done;
    absl::Status status;
    {
      absl::MutexLock lock(&stream.mu);
      stream.mu.AwaitWithTimeout(absl::Condition(&HasEventsOrDone, &stream),
                                 kStreamPollInterval);
      batch.swap(stream.events);
      done = stream.done;
      status = stream.status;
    }
    bool ok = true;
    for (const std::string& event : batch) {
      if (!(ok = WriteEvent(sink, event))) break;
    }
    if (ok && done) {
      if (!status.ok()) ok = WriteEvent(sink, ErrorBody(status));
      if (ok) ok = WriteEvent(sink, "[DONE]");
      if (ok) {
        sink.done();
        return true;
      }
    }
    // Nothing to say: a comment, so that a client that went away is noticed
    // by the failing write (a closed socket still looks writable).
    if (ok && batch.empty()) {
      ok = sink.is_writable() &&
           sink.write(kKeepAlive.data(), kKeepAlive.size());
    }
    if (!ok) ClientGone(stream);
    return ok;
  }

  void HandleModels(httplib::Response& res) {
    absl::StatusOr<v1::ListModelsResponse> models = api_->ListModels();
    if (!models.ok()) {
      SendError(res, models.status());
      return;
    }
    SendJson(res, 200, ModelsBody(*models));
  }

  void HandleHealth(httplib::Response& res) {
    absl::Status ready = api_->CheckReady();
    if (ready.ok()) {
      SendJson(res, 200, R"({"status":"ok"})");
      return;
    }
    SendJson(res, 503, ErrorBody(503, "service_unavailable", ready.message()));
  }

  void HandleTokenize(const httplib::Request& req, httplib::Response& res) {
    if (req.body.size() > options_.max_body_bytes) {
      SendJson(res, 413, BodyTooLarge());
      return;
    }
    absl::StatusOr<v1::TokenizeRequest> parsed = ParseTokenizeRequest(req.body);
    if (!parsed.ok()) {
      SendError(res, parsed.status());
      return;
    }
    absl::StatusOr<v1::TokenizeResponse> tokens = api_->Tokenize(*parsed);
    if (!tokens.ok()) {
      SendError(res, tokens.status());
      return;
    }
    SendJson(res, 200, TokenizeBody(*tokens));
  }

  const HttpFrontendOptions options_;
  ClientApi* const api_;
  RouterMetrics* const metrics_;
  HttpServer server_;
  // Declared after server_, so destroyed (and stopped) before it.
  std::unique_ptr<HttpServerThread> accept_loop_;
  // Set by Shutdown: every sink refuses its next chunk.
  std::atomic<bool> stopping_{false};
};

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(
    const HttpFrontendOptions& options, ClientApi* api) {
  if (api == nullptr) return absl::InvalidArgumentError("api is null");
  auto impl = std::make_unique<Impl>(options, api);
  absl::Status status = impl->Start();
  if (!status.ok()) return status;
  return std::unique_ptr<HttpFrontend>(new HttpFrontend(std::move(impl)));
}

HttpFrontend::HttpFrontend(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

HttpFrontend::~HttpFrontend() { Shutdown(); }

int HttpFrontend::port() const { return impl_->port(); }

void HttpFrontend::Shutdown() { impl_->Shutdown(); }

}  // namespace pdserve::router
