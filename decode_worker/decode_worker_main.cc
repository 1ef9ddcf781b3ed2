// pd-decode-worker: a decode worker process.
//
// Today it serves health and reflection, registers with the router,
// heartbeats and drains on SIGTERM or on the router's command (see
// rpc/worker_process.h). The decode service itself joins with the serving
// path.
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/termination_signal.h"
#include "rpc/worker_process.h"

int main(int argc, char** argv) {
  pdserve::BlockTerminationSignals();
  absl::SetProgramUsageMessage("pd-decode-worker: a pdserve decode worker.");
  absl::ParseCommandLine(argc, argv);
  pdserve::rpc::WorkerProcessOptions options;
  options.role = pdserve::v1::WORKER_ROLE_DECODE;
  return pdserve::rpc::RunWorkerProcess(options);
}
