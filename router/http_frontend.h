// HttpFrontend: the router's OpenAI-compatible HTTP/1.1 front end, serving
// a ClientApi (router/client_api.h) with cpp-httplib.
//
// Routes:
//   POST /v1/completions, POST /v1/chat/completions
//       "stream": true -> 200 text/event-stream, one `data: {chunk}\n\n`
//       event per OpenAI chunk, then `data: [DONE]\n\n`; otherwise one JSON
//       body. An error before the first event is an HTTP error status with
//       an OpenAI error body (503 + Retry-After for RESOURCE_EXHAUSTED); an
//       error after it is one `data: {"error": {...}}` event, then [DONE].
//   GET  /v1/models   the ListModels result.
//   GET  /health      200 {"status":"ok"} when CheckReady() is OK, else 503.
//   POST /tokenize    vLLM-style tokenization.
//   GET  /metrics     the router's Prometheus metrics (text format 0.0.4),
//                     when a registry is given.
// A completion request's id is its body's "request_id", else its
// x-request-id header, else a fresh one (request_ids.h); every response
// carries it back in x-request-id.
//   Anything else: 404 (unknown path) or 405 (known path, wrong method), and
//   413 for a body over max_body_bytes, all with OpenAI error bodies.
// With api_keys set, every route but /health and /metrics first requires
// `Authorization: Bearer KEY` with one of the keys: 401 with an OpenAI
// error body (and WWW-Authenticate: Bearer) otherwise, before the body is
// read or any work is done.
//
// Each request's deadline is now + its "timeout" field (seconds) or
// default_timeout. A streaming request runs ClientApi::Generate on a helper
// thread of its own while the connection's thread writes the events: the
// HTTP status line must be chosen before the first byte is written, and
// httplib writes it before it calls the content provider, so the handler
// waits up to 250 ms for the first event or the error: errors known by then
// (bad prompt, full router) get their own status. After that the stream is
// committed to 200 and, while there is nothing to send, carries SSE comments
// (": keep-alive") every 200 ms: httplib 0.11 shows a closed connection only
// as a failed write. When a write to the client fails, the request's
// CancelToken stops it on every worker, also before its first token; later
// errors are an error event. Non-streaming requests run Generate on
// the connection's thread; a client that disconnects while waiting for a
// non-streaming response is not noticed (httplib gives handlers no access to
// the socket), so such a request runs to its end or its deadline.
//
// Ownership: the ClientApi is not owned and must outlive the HttpFrontend.
// Thread-safety: port() and Shutdown() may be called from any thread;
// requests are served on a pool of max_connections threads.
#ifndef PDSERVE_ROUTER_HTTP_FRONTEND_H_
#define PDSERVE_ROUTER_HTTP_FRONTEND_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "metrics/registry.h"
#include "router/client_api.h"
#include "router/router_metrics.h"
#include "rpc/cluster_credential.h"

namespace pdserve::router {

struct HttpFrontendOptions {
  // "host:port" ("[v6addr]:port" for IPv6); port 0 picks a free port.
  std::string listen_address = "127.0.0.1:0";
  // Connection threads: the number of requests (and SSE streams) served at
  // once; further connections wait in the accept queue.
  int max_connections = 256;
  // Deadline for requests that do not set "timeout".
  absl::Duration default_timeout = absl::Minutes(10);
  // Retry-After (seconds) on 503 responses for RESOURCE_EXHAUSTED.
  int retry_after_s = 1;
  // Larger request bodies are refused with 413.
  size_t max_body_bytes = size_t{8} << 20;
  // Where each completion request's end is recorded (by endpoint and
  // status); null records to series nobody exports. Not owned.
  RouterMetrics* metrics = nullptr;
  // Served at GET /metrics (Prometheus text format) when set. Not owned.
  const metrics::Registry* metrics_registry = nullptr;
  // The API keys clients must present (a key file in the token file's
  // format, rpc/cluster_credential.h: one per line, every line accepted,
  // compared in constant time); default: no key required.
  rpc::ClusterCredential api_keys;
};

class HttpFrontend {
 public:
  // Binds `options.listen_address` and starts serving on a thread of its
  // own. UNAVAILABLE if the address cannot be bound, INVALID_ARGUMENT if it
  // or another option is malformed. `api` must outlive the result.
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(
      const HttpFrontendOptions& options, ClientApi* api);

  HttpFrontend(const HttpFrontend&) = delete;
  HttpFrontend& operator=(const HttpFrontend&) = delete;
  // Calls Shutdown().
  ~HttpFrontend();

  // The bound port.
  int port() const;

  // Stops accepting connections, makes every in-flight generation's sink
  // refuse its next chunk (so the core cancels it), and waits for the
  // connection threads to finish. Idempotent.
  void Shutdown();

 private:
  class Impl;
  explicit HttpFrontend(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_HTTP_FRONTEND_H_
