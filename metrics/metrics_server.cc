#include "metrics/metrics_server.h"

#include <sys/socket.h>

#include <atomic>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "httplib.h"
#include "metrics/text_format.h"

namespace pdserve::metrics {
namespace {

// How long Start waits for the accept loop to come up.
constexpr absl::Duration kStartTimeout = absl::Seconds(10);

absl::Status SplitHostPort(const std::string& address, std::string* host,
                           int* port) {
  size_t colon = address.rfind(':');
  if (colon != std::string::npos) {
    *host = address.substr(0, colon);
    if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
      *host = host->substr(1, host->size() - 2);
    }
  }
  if (colon == std::string::npos || host->empty() ||
      !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics listen address '", address, "' is not host:port"));
  }
  return absl::OkStatus();
}

}  // namespace

class MetricsServer::Impl {
 public:
  Impl(const MetricsServerOptions& options, const Registry* registry)
      : options_(options), registry_(registry) {}
  ~Impl() { Shutdown(); }

  absl::Status Start() {
    if (options_.threads < 1) {
      return absl::InvalidArgumentError("metrics server threads must be >= 1");
    }
    std::string host;
    int port = 0;
    absl::Status address = SplitHostPort(options_.listen_address, &host, &port);
    if (!address.ok()) return address;
    Configure();
    if (port == 0) {
      port_ = server_.bind_to_any_port(host);
    } else {
      port_ = server_.bind_to_port(host, port) ? port : -1;
    }
    if (port_ < 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options_.listen_address,
                       " for /metrics (address in use or not local?)"));
    }
    thread_ = std::thread([this] {
      server_.listen_after_bind();
      serve_returned_ = true;
    });
    // stop() is a no-op until the accept loop runs, so Shutdown must not
    // race with its start.
    absl::Time give_up = absl::Now() + kStartTimeout;
    while (!server_.is_running() && !serve_returned_ && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (!server_.is_running()) {
      Shutdown();
      return absl::UnavailableError(absl::StrCat(
          "metrics server on ", options_.listen_address, " did not start"));
    }
    PD_LOG(INFO) << "serving /metrics on " << host << ":" << port_;
    return absl::OkStatus();
  }

  int port() const { return port_; }

  void Shutdown() {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    if (!thread_.joinable()) return;
    while (!serve_returned_) {
      if (server_.is_running()) {
        server_.stop();
        break;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    thread_.join();
  }

 private:
  void Configure() {
    int threads = options_.threads;
    server_.new_task_queue = [threads] {
      return new httplib::ThreadPool(threads);
    };
    // httplib's default sets SO_REUSEPORT, which would let a second process
    // silently share the port; SO_REUSEADDR only allows quick restarts.
    server_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    server_.Get("/metrics",
                [this](const httplib::Request&, httplib::Response& res) {
                  res.set_content(RenderText(*registry_), kTextContentType);
                });
  }

  const MetricsServerOptions options_;
  const Registry* const registry_;
  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;
  std::atomic<bool> serve_returned_{false};
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, const Registry* registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("registry is null");
  }
  auto impl = std::make_unique<Impl>(options, registry);
  absl::Status status = impl->Start();
  if (!status.ok()) return status;
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() { Shutdown(); }

int MetricsServer::port() const { return impl_->port(); }

void MetricsServer::Shutdown() { impl_->Shutdown(); }

}  // namespace pdserve::metrics
