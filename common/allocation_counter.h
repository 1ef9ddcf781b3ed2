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

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ALLOCATION_COUNTER_H_
