// Waiting for SIGTERM / SIGINT without async signal handlers.
//
// A server's main() calls BlockTerminationSignals() first, before any thread
// exists, so every thread inherits the blocked mask; then, after starting its
// work, it calls WaitForTerminationSignal() to sleep until asked to stop and
// drains in ordinary code (no work inside a signal handler).
//
// Thread-safety: BlockTerminationSignals must run before threads start;
// WaitForTerminationSignal may run on any one thread.
#ifndef PDSERVE_COMMON_TERMINATION_SIGNAL_H_
#define PDSERVE_COMMON_TERMINATION_SIGNAL_H_

#include <optional>

#include "absl/time/time.h"

namespace pdserve {

void BlockTerminationSignals();

// Returns the signal received (SIGTERM or SIGINT), or nullopt after
// `timeout` passes without one.
std::optional<int> WaitForTerminationSignal(
    absl::Duration timeout = absl::InfiniteDuration());

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TERMINATION_SIGNAL_H_
