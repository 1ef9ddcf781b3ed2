// pd-metrics-demo: serves a registry with every kind of metric, the process
// metrics and pdserve_build_info on --listen, and keeps recording made-up
// values, so that a scrape can be tried by hand:
//
//   bazel run //metrics:pd-metrics-demo -- --listen=127.0.0.1:9400 &
//   curl -s localhost:9400/metrics | promtool check metrics
//
// Not part of the cluster; the processes adopt the library themselves.
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/termination_signal.h"
#include "metrics/buckets.h"
#include "metrics/metrics_server.h"
#include "metrics/process_metrics.h"
#include "metrics/registry.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:9400",
          "host:port to serve GET /metrics on");
ABSL_FLAG(std::string, itl_buckets, "",
          "inter-token latency bucket bounds in seconds, comma-separated; "
          "empty: 0.5 ms doubling 14 times");

namespace pdserve::metrics {
namespace {

MetricOptions Options(const char* name, const char* help,
                      std::vector<std::string> labels = {}) {
  MetricOptions o;
  o.name = name;
  o.help = help;
  o.label_names = std::move(labels);
  return o;
}

absl::Status Run() {
  Registry registry;
  PD_RETURN_IF_ERROR(AddProcessMetrics(&registry));
  std::vector<double> itl_bounds;
  if (absl::GetFlag(FLAGS_itl_buckets).empty()) {
    PD_ASSIGN_OR_RETURN(itl_bounds, ExponentialBuckets(0.0005, 2, 14));
  } else {
    PD_ASSIGN_OR_RETURN(itl_bounds,
                        ParseBuckets(absl::GetFlag(FLAGS_itl_buckets)));
  }
  PD_ASSIGN_OR_RETURN(
      CounterFamily * tokens,
      registry.AddCounter(Options("pdserve_demo_tokens_total",
                                  "Made-up tokens generated.", {"model"})));
  PD_ASSIGN_OR_RETURN(GaugeFamily * running,
                      registry.AddGauge(Options("pdserve_demo_requests_running",
                                                "Made-up requests.")));
  PD_ASSIGN_OR_RETURN(
      HistogramFamily * itl,
      registry.AddHistogram(Options("pdserve_demo_inter_token_latency_seconds",
                                    "Made-up gaps between tokens.", {"model"}),
                            itl_bounds));
  PD_ASSIGN_OR_RETURN(Counter * token_counter, tokens->WithLabels({"demo"}));
  PD_ASSIGN_OR_RETURN(Gauge * running_gauge, running->WithLabels({}));
  PD_ASSIGN_OR_RETURN(Histogram * itl_histogram, itl->WithLabels({"demo"}));

  MetricsServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> server,
                      MetricsServer::Start(options, &registry));
  PD_LOG(INFO) << "serving made-up metrics on port " << server->port()
               << "; SIGINT or SIGTERM stops";
  for (int i = 0; !WaitForTerminationSignal(absl::Milliseconds(5)); ++i) {
    token_counter->Inc();
    running_gauge->Set(i % 8);
    itl_histogram->Observe(0.0005 * (1 + i % 40));
  }
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace
}  // namespace pdserve::metrics

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::ParseCommandLine(argc, argv);
  absl::Status status = pdserve::metrics::Run();
  if (!status.ok()) {
    PD_LOG(ERROR) << status;
    return 1;
  }
  return 0;
}
