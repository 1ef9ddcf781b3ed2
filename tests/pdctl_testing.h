// The fixture of the tests that drive a real `pdctl up --foreground`
// cluster (its supervisor) with the real pdctl binary: the supervisor
// started and awaited, pdctl commands run to completion, and the
// supervisor's state file read back.
#ifndef PDSERVE_TESTS_PDCTL_TESTING_H_
#define PDSERVE_TESTS_PDCTL_TESTING_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"

namespace pdserve::testing {

// One process line of the supervisor's state file.
struct ProcessState {
  pid_t pid = 0;
  std::string state;
  int restarts = 0;
  std::string last_exit;
};

class PdctlClusterTest : public ::testing::Test {
 protected:
  // A work folder named after the test.
  void SetUp() override;
  // Stops the supervisor (and with it the cluster) if it still runs.
  void TearDown() override;

  // Runs pdctl with `args` (plus --work_dir) to completion within
  // `timeout`; its exit code (-1 when it did not finish), its output in
  // *output. Thread-safe.
  int Pdctl(std::vector<std::string> args, std::string* output = nullptr,
            absl::Duration timeout = absl::Seconds(150));

  // `pdctl up --foreground` on `model` (empty: the slow test model) with
  // small workers, loopback ports, short leases and `extra_args`; returns
  // once ready (fails the test if the supervisor exits or 90 s pass first).
  void Up(const std::vector<std::string>& extra_args,
          const std::string& model = "");

  // Reads the state file: the endpoints (grpc_, control_, http_) and each
  // process's line, by name.
  std::map<std::string, ProcessState> ReadState();

  std::string work_dir_;
  std::unique_ptr<Subprocess> pdctl_;
  std::string grpc_;
  std::string control_;
  std::string http_;  // host:port of the router's HTTP (and /metrics)

 private:
  absl::Mutex mu_;
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_PDCTL_TESTING_H_
