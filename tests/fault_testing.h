// The fixture of the fault-injection tests (tests/*fault*_test.cc): a local
// cluster on a model slow enough that requests are still running when the
// fault hits, load sent from client threads, and the checks every fault test
// ends with — every worker back to idle (nothing queued, running or in
// transfer, every KV block free), and every process that was not killed
// exiting cleanly on SIGTERM (no stuck thread, no orphan).
//
// Each test reports one row of the fault table (Report): requests sent,
// completed correctly, rejected with a clear error, lost, and the recovery
// time. Rows are printed as "FAULT-TABLE|..." lines, which
// scripts/fault_table.sh collects from the test logs.
#ifndef PDSERVE_TESTS_FAULT_TESTING_H_
#define PDSERVE_TESTS_FAULT_TESTING_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "proto/admin.pb.h"
#include "proto/client.pb.h"
#include "proto/common.pb.h"
#include "tests/cluster_testing.h"
#include "tests/serving_testing.h"

namespace pdserve::testing {

// One row of the fault table.
struct FaultRow {
  std::string fault;
  int sent = 0;
  int completed = 0;  // With exactly the offline engine's answer.
  int rejected = 0;   // With a clear error the client can act on.
  int lost = 0;       // Anything else: must be 0.
  // From the fault to the cluster serving normally again (the measure is
  // named in `recovery_what`).
  absl::Duration recovery = absl::ZeroDuration();
  std::string recovery_what;
};

// Waits until every worker the router at `control_address` lists is idle
// (nothing queued, running or in transfer, every KV block free) and every
// worker in `expected` is among them and SERVING. Returns how long that
// took, or fails the test and returns InfiniteDuration after `timeout`.
absl::Duration AwaitWorkersIdle(const std::string& control_address,
                                const std::vector<std::string>& expected,
                                absl::Duration timeout);

class FaultTest : public ::testing::Test {
 protected:
  // Lease 1.5 s, heartbeats every 200 ms; KV reservations held at most
  // 20 s and quarantined 500 ms, so leaks show within a test.
  // `prefill` + `decode` workers; the extra flags go to every worker, the
  // router, and single workers by name.
  void Start(
      const std::string& name, int prefill, int decode,
      const std::vector<std::string>& worker_args = {},
      const std::vector<std::string>& router_args = {},
      const std::map<std::string, std::vector<std::string>>& process_args = {});
  // Checks that the cluster is idle and stops it cleanly.
  void TearDown() override;

  // Sends every request at once, each from its own thread, over gRPC;
  // `on_progress` sees the number of tokens each has received so far.
  std::vector<Outcome> SendAll(
      const std::vector<v1::GenerateRequest>& requests,
      const std::function<void(const std::vector<int>&)>& on_progress =
          nullptr);

  // A load with a fault injected part-way: the outcomes, and when the
  // fault was injected (InfiniteFuture if the moment never came).
  struct FaultedLoad {
    std::vector<Outcome> got;
    absl::Time fault_at = absl::InfiniteFuture();
    bool fired() const { return fault_at != absl::InfiniteFuture(); }
  };
  using Progress = std::function<bool(const std::vector<int>& received)>;
  // Sends every request (as SendAll) and, the first time `ready` holds for
  // the tokens received so far, sends `signal` to each of `targets`.
  FaultedLoad SendAllWithFault(const std::vector<v1::GenerateRequest>& requests,
                               const Progress& ready,
                               const std::vector<std::string>& targets,
                               int signal);
  // Progress conditions: every stream has at least `tokens` tokens (so every
  // prefill is done and streams are cut mid-way); at least `streams` streams
  // have started; any answer has started (most prompts still in prefill).
  static Progress EveryStreamHas(int tokens);
  static Progress StreamsStarted(int streams);
  static Progress AnyAnswer();

  // Sends `signal` to a worker (SIGKILL and SIGSTOP mark it as one whose
  // exit status is not checked).
  void Signal(const std::string& name, int signal);

  // Waits until every worker the router lists is idle (nothing queued,
  // running or in transfer, every KV block free) and every worker the
  // cluster started, but those in `disturbed_`, is among them and serving.
  // Returns how long that took, or fails the test and returns
  // InfiniteDuration after `timeout`.
  absl::Duration AwaitIdle(absl::Duration timeout);

  // Counts each outcome against the offline engine: completed with its
  // answer, rejected (a clear status: one of `clear_errors`), or lost.
  // Fails the test for every lost one.
  FaultRow Score(const std::string& fault,
                 const std::vector<v1::GenerateRequest>& requests,
                 const std::vector<Outcome>& got, OfflineEngine& offline,
                 const std::set<absl::StatusCode>& clear_errors = {});

  // Prints the row for the fault table and fails the test if it lost any.
  static void Report(const FaultRow& row);

  // The workers' current load, by worker id.
  std::map<std::string, v1::WorkerInfo> Workers();

  // The sum of the samples of metric `family` with `labels` that process
  // `process` ("router", "decode-0", ...) exports now; fails the test (and
  // returns -1) when it cannot be read.
  double Metric(const std::string& process, const std::string& family,
                const metrics::Labels& labels = {});
  // Metric, read again until it is at least `at_least` or 10 s passed: a
  // process records a request's end just after its client saw that end.
  double AwaitMetric(const std::string& process, const std::string& family,
                     const metrics::Labels& labels, double at_least);

  std::unique_ptr<cli::LocalCluster> cluster_;
  // The model Start serves; empty: SlowTinyModelPath().
  std::string model_path_;
  // Processes whose exit is not expected to be clean.
  std::set<std::string> disturbed_;
};

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_FAULT_TESTING_H_
