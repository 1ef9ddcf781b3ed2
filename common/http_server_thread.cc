#include "common/http_server_thread.h"

#include <sys/socket.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pdserve {
namespace {

// How long Start waits for the accept loop to come up.
constexpr absl::Duration kStartTimeout = absl::Seconds(10);

}  // namespace

absl::StatusOr<HostPort> ParseListenAddress(absl::string_view address) {
  size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "' is not host:port"));
  }
  HostPort out;
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  out.host = std::string(host);
  if (out.host.empty() ||
      !absl::SimpleAtoi(address.substr(colon + 1), &out.port) || out.port < 0 ||
      out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "' is not host:port"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<HttpServerThread>> HttpServerThread::Start(
    const HttpServerThreadOptions& options, httplib::Server* server) {
  absl::StatusOr<HostPort> address = ParseListenAddress(options.listen_address);
  if (!address.ok()) return address.status();
  // httplib's default sets SO_REUSEPORT, which would let a second server
  // silently share the port; SO_REUSEADDR only allows quick restarts.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  int port = -1;
  if (address->port == 0) {
    port = server->bind_to_any_port(address->host);
  } else if (server->bind_to_port(address->host, address->port)) {
    port = address->port;
  }
  if (port < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     " (address in use or not local?)"));
  }
  if (options.after_bind) options.after_bind();
  std::unique_ptr<HttpServerThread> out(new HttpServerThread(server, port));
  HttpServerThread* self = out.get();
  out->thread_ = std::thread([self] {
    self->server_->listen_after_bind();
    self->loop_returned_ = true;
  });
  absl::Time give_up = absl::Now() + kStartTimeout;
  while (!server->is_running() && !out->loop_returned_ &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (!server->is_running()) {
    return absl::UnavailableError(absl::StrCat(
        "HTTP server on ", options.listen_address, " did not start"));
  }
  return out;
}

HttpServerThread::HttpServerThread(httplib::Server* server, int port)
    : server_(server), port_(port) {}

HttpServerThread::~HttpServerThread() { Shutdown(); }

void HttpServerThread::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (!thread_.joinable()) return;
  // stop() must come after the loop runs (Start waited for that, unless
  // the loop never came up) and only once.
  while (!loop_returned_) {
    if (server_->is_running()) {
      server_->stop();
      break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  thread_.join();
}

}  // namespace pdserve
