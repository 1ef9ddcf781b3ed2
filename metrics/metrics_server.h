// MetricsServer: a small plain-HTTP server that answers GET /metrics with a
// registry in the Prometheus text format, for processes that have no HTTP
// port of their own (the workers' --metrics_listen). The router serves
// RenderText (text_format.h) on its existing HTTP port instead.
//
// Scrapes are rare (one per scrape interval per Prometheus), so a couple of
// connection threads are enough; every other path is 404.
//
// Ownership: the registry is not owned and must outlive the server.
// Thread-safety: port() and Shutdown() may be called from any thread.
#ifndef PDSERVE_METRICS_METRICS_SERVER_H_
#define PDSERVE_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/registry.h"

namespace pdserve::metrics {

struct MetricsServerOptions {
  // "host:port" ("[v6addr]:port" for IPv6); port 0 picks a free port.
  std::string listen_address = "0.0.0.0:0";
  // Scrapes served at once.
  int threads = 2;
};

class MetricsServer {
 public:
  // Binds and starts serving on a thread of its own. INVALID_ARGUMENT for a
  // malformed option, UNAVAILABLE when the address cannot be bound (in use,
  // not local). `registry` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options, const Registry* registry);

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // Calls Shutdown().
  ~MetricsServer();

  // The bound port.
  int port() const;

  // Stops accepting and waits for scrapes in progress. Idempotent.
  void Shutdown();

 private:
  class Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_METRICS_SERVER_H_
