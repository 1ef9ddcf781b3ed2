// Gauge: one series of a Prometheus gauge, a value that goes up and down
// (requests running, KV blocks used).
//
// Set is a relaxed store and Add a relaxed fetch_add on a std::atomic<double>
// (lock-free on every platform we build for), so recording takes no lock and
// allocates nothing. Whole-number Adds (+1/-1 for a request starting and
// ending) stay exact up to 2^53.
//
// Ownership: a registry's family owns its gauges; callers hold the pointer
// for the registry's lifetime. Thread-safety: every method may be called
// from any thread.
#ifndef PDSERVE_METRICS_GAUGE_H_
#define PDSERVE_METRICS_GAUGE_H_

#include <atomic>

namespace pdserve::metrics {

class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Sub(double v) { value_.fetch_sub(v, std::memory_order_relaxed); }
  void Inc() { Add(1); }
  void Dec() { Sub(1); }

  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  static_assert(std::atomic<double>::is_always_lock_free);
  std::atomic<double> value_{0};
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_METRICS_GAUGE_H_
