#include "common/allocation_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<int64_t> g_allocations{0};

void* Allocate(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
}  // namespace

// Every plain (not over-aligned) form, so that each new meets its own
// delete (AddressSanitizer checks the pairing).
void* operator new(std::size_t n) {
  if (void* p = Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = Allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return Allocate(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return Allocate(n);
}
// GCC takes free() on a replaced operator new's memory for a mismatch.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace pdserve {

int64_t AllocationCount() {
  return g_allocations.load(std::memory_order_relaxed);
}

bool AllocationCountingIsLive() {
  const int64_t before = AllocationCount();
  // A direct call of the replaceable function, which the compiler may not
  // elide as it may a new-expression.
  void* p = ::operator new(16);
  const bool counted = AllocationCount() > before;
  ::operator delete(p);
  return counted;
}

}  // namespace pdserve
