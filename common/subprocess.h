// Subprocess: starts a child process and guarantees it does not outlive its
// owner.
//
// Used by the local cluster launcher (pdctl up) and by multi-process tests.
// The child gets its own process group, so Kill/Terminate reach whatever it
// started too; PR_SET_PDEATHSIG makes the kernel kill it if the parent dies
// without cleaning up (a crashed or timed-out test leaves no servers behind).
//
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, so Start() must
// be called from a thread that outlives the child (main, or a test body).
//
// Ownership: the object owns the child; destroying it kills the child's
// process group (SIGKILL) if still running and reaps it.
// Thread-safety: not thread-safe; use from one thread.
#ifndef PDSERVE_COMMON_SUBPROCESS_H_
#define PDSERVE_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve {

struct SubprocessOptions {
  // argv[0] is the program path (not searched in PATH).
  std::vector<std::string> argv;
  // NAME=VALUE entries added to the inherited environment, replacing
  // inherited variables of the same name.
  std::vector<std::string> extra_env;
  // When set, stdout and stderr are appended to this file.
  std::string log_path;
  // When set, the child runs only on these CPUs (sched_setaffinity before
  // exec; its threads and children inherit it). Benchmarks pin processes
  // so that they do not share cores.
  std::vector<int> cpus;
};

class Subprocess {
 public:
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const SubprocessOptions& options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Sends `signal` to the child's process group (no-op once exited).
  void Signal(int signal);

  // Waits up to `timeout` for the child to exit. Returns its wait status
  // (as from waitpid) or DEADLINE_EXCEEDED while it still runs.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the wait status.
  int Stop(absl::Duration grace);

  // True until the child has been reaped.
  bool running();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}

  const pid_t pid_;
  std::optional<int> wait_status_;
};

// "exited with code 3" / "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_SUBPROCESS_H_
