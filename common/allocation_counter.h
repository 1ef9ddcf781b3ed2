// AllocationCount: how many times this process has called the global
// operator new, for tests that prove a hot path allocates nothing (a decode
// step, recording a metric).
//
// Linking this library replaces every plain (not over-aligned) form of the
// global operator new and delete, so a test that depends on it must be a
// binary of its own; it is testonly. The same technique as
// engine/decode_alloc_test.cc, which predates this library.
//
// Thread-safety: AllocationCount may be called from any thread; the count
// covers every thread.
#ifndef PDSERVE_COMMON_ALLOCATION_COUNTER_H_
#define PDSERVE_COMMON_ALLOCATION_COUNTER_H_

#include <cstdint>

namespace pdserve {

// Calls of the global operator new (any plain form) since the process
// started.
int64_t AllocationCount();

// Whether the count above sees this process's allocations. It does not
// under AddressSanitizer, whose runtime library is found before this one
// and supplies operator new itself; a test that proves a path allocates
// nothing must then skip, not pass with a count that never moves.
bool AllocationCountingIsLive();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ALLOCATION_COUNTER_H_
