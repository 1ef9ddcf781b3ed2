// HttpServerThread: runs a configured cpp-httplib server's accept loop on a
// thread of its own, for the processes' small HTTP endpoints (GET /metrics;
// the router's OpenAI front end can use it too).
//
// httplib's stop() does nothing until the accept loop runs and must be
// called once, so starting and stopping have an order to keep: bind, start
// the loop, wait for it to run, and only then stop it. This class keeps it,
// and refuses a taken port instead of sharing it.
//
// Ownership: the httplib::Server is not owned; it must outlive this object,
// and its routes, task queue and socket options are set before Start.
// Thread-safety: port() and Shutdown() may be called from any thread.
#ifndef PDSERVE_COMMON_HTTP_SERVER_THREAD_H_
#define PDSERVE_COMMON_HTTP_SERVER_THREAD_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "httplib.h"

namespace pdserve {

struct HostPort {
  std::string host;
  int port = 0;
};

// "host:port" or "[v6addr]:port" with 0 <= port <= 65535; INVALID_ARGUMENT
// otherwise.
absl::StatusOr<HostPort> ParseListenAddress(absl::string_view address);

struct HttpServerThreadOptions {
  // "host:port" ("[v6addr]:port" for IPv6); port 0 picks a free port.
  std::string listen_address;
  // Runs after the socket is bound and before the accept loop starts (the
  // router raises the listen backlog here).
  std::function<void()> after_bind;
};

class HttpServerThread {
 public:
  // Binds `server` to options.listen_address (never with SO_REUSEPORT: a
  // taken port is UNAVAILABLE) and starts its accept loop.
  // INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot be
  // bound or the loop does not start.
  static absl::StatusOr<std::unique_ptr<HttpServerThread>> Start(
      const HttpServerThreadOptions& options, httplib::Server* server);

  HttpServerThread(const HttpServerThread&) = delete;
  HttpServerThread& operator=(const HttpServerThread&) = delete;
  // Calls Shutdown().
  ~HttpServerThread();

  // The bound port.
  int port() const { return port_; }

  // Stops accepting and waits for the connection threads to finish.
  // Idempotent.
  void Shutdown();

 private:
  HttpServerThread(httplib::Server* server, int port);

  httplib::Server* const server_;
  const int port_;
  std::thread thread_;
  std::atomic<bool> loop_returned_{false};
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_HTTP_SERVER_THREAD_H_
