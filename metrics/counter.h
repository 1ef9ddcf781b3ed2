// Counter: one series of a monotonically increasing Prometheus counter (one
// label-value combination of a family, see registry.h).
//
// Recording is on the request and decode paths, so it takes no lock and
// allocates nothing: whole-number increments are one relaxed fetch_add on an
// integer (exact up to 2^64), fractional ones (seconds) one on a double. The
// value read at scrape time is their sum; relaxed order is enough because a
// scrape only needs each increment to show up eventually, not in order with
// other memory.
//
// Ownership: a registry's family owns its counters; callers hold the
// pointer for the registry's lifetime. Thread-safety: every method may be
// called from any thread.
#ifndef PDSERVE_METRICS_COUNTER_H_
#define PDSERVE_METRICS_COUNTER_H_

#include <atomic>
#include <cstdint>

namespace pdserve::metrics {

class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Inc() { whole_.fetch_add(1, std::memory_order_relaxed); }
  void Inc(uint64_t n) { whole_.fetch_add(n, std::memory_order_relaxed); }

  // Adds `v` (seconds, bytes as a double, ...). A negative or NaN `v` is
  // dropped: a counter that went down would read as a process restart to
  // rate(), and recording must never fail the request it measures.
  void Add(double v) {
    if (!(v >= 0)) return;
    fraction_.fetch_add(v, std::memory_order_relaxed);
  }

  double Value() const {
    return static_cast<double>(whole_.load(std::memory_order_relaxed)) +
           fraction_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> whole_{0};
  std::atomic<double> fraction_{0};
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_COUNTER_H_
