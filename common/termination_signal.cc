#include "common/termination_signal.h"

#include <signal.h>
#include <time.h>

#include <cerrno>

namespace pdserve {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::optional<int> WaitForTerminationSignal(absl::Duration timeout) {
  const sigset_t set = TerminationSet();
  while (true) {
    int sig;
    if (timeout == absl::InfiniteDuration()) {
      sig = sigwaitinfo(&set, nullptr);
    } else {
      const timespec ts = absl::ToTimespec(timeout);
      sig = sigtimedwait(&set, nullptr, &ts);
    }
    if (sig > 0) return sig;
    if (errno == EAGAIN) return std::nullopt;
    // EINTR: another signal interrupted the wait; wait again.
  }
}

}  // namespace pdserve
