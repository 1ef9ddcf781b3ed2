#include "metrics/metrics_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/http_server_thread.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "httplib.h"
#include "metrics/text_format.h"

namespace pdserve::metrics {

class MetricsServer::Impl {
 public:
  Impl(const MetricsServerOptions& options, const Registry* registry)
      : options_(options), registry_(registry) {}

  absl::Status Start() {
    if (options_.threads < 1) {
      return absl::InvalidArgumentError("metrics server threads must be >= 1");
    }
    int threads = options_.threads;
    server_.new_task_queue = [threads] {
      return new httplib::ThreadPool(threads);
    };
    server_.Get("/metrics",
                [this](const httplib::Request&, httplib::Response& res) {
                  res.set_content(RenderText(*registry_), kTextContentType);
                });
    HttpServerThreadOptions options;
    options.listen_address = options_.listen_address;
    absl::StatusOr<std::unique_ptr<HttpServerThread>> thread =
        HttpServerThread::Start(options, &server_);
    if (!thread.ok()) {
      return absl::Status(
          thread.status().code(),
          absl::StrCat("/metrics: ", thread.status().message()));
    }
    thread_ = *std::move(thread);
    PD_LOG(INFO) << "serving /metrics on " << options_.listen_address
                 << " (port " << thread_->port() << ")";
    return absl::OkStatus();
  }

  int port() const { return thread_->port(); }
  void Shutdown() { thread_->Shutdown(); }

 private:
  const MetricsServerOptions options_;
  const Registry* const registry_;
  // Declared before thread_, which stops it, so that it outlives the thread.
  httplib::Server server_;
  std::unique_ptr<HttpServerThread> thread_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, const Registry* registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("registry is null");
  }
  auto impl = std::make_unique<Impl>(options, registry);
  PD_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() { Shutdown(); }

int MetricsServer::port() const { return impl_->port(); }

void MetricsServer::Shutdown() { impl_->Shutdown(); }

}  // namespace pdserve::metrics
