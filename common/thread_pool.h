// ThreadPool: a persistent set of worker threads for data-parallel loops in
// the engine's forward pass (matrix rows, attention heads).
//
// The engine runs 30-odd small layers per token, each a handful of parallel
// loops of a few microseconds; creating threads per loop, or handing work
// through a queue of heap-allocated closures, would cost more than the work.
// So ParallelFor publishes one loop at a time to workers that spin briefly
// and then sleep, splits [0, n) into one contiguous chunk per thread (the
// caller runs chunk 0 itself), and allocates nothing.
//
// The default size is the number of CPUs this process may run on (its
// sched_getaffinity mask), so a worker pinned to cores does not
// oversubscribe them.
//
// Ownership: the pool owns its threads; the destructor joins them.
// Thread-safety: ParallelFor may be called from one thread at a time (the
// engine loop); calls from several threads are serialized by a mutex. The
// function passed to ParallelFor runs concurrently on disjoint ranges.
#ifndef PDSERVE_COMMON_THREAD_POOL_H_
#define PDSERVE_COMMON_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace pdserve::common {

// CPUs in this process's affinity mask (at least 1).
int AvailableCpus();

class ThreadPool {
 public:
  // num_threads <= 0 means AvailableCpus(). The calling thread counts as one
  // of them: a pool of N threads starts N - 1 workers.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), one range per
  // thread at most, and returns when all have finished. Ranges are
  // contiguous and in order of thread index, so results are the same for
  // every run with the same pool size. n <= 0 returns at once.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn);

  // As ParallelFor, with chunk boundaries rounded to multiples of `grain`
  // (e.g. a tile of rows), except the last.
  void ParallelForGrained(int64_t n, int64_t grain,
                          absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  void WorkerLoop(int index);
  void RunChunk(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time

  // The published loop. Written by the caller before bumping generation_.
  absl::FunctionRef<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;

  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex sleep_mu_;
  std::condition_variable wake_;
};

}  // namespace pdserve::common

#endif  // PDSERVE_COMMON_THREAD_POOL_H_
