#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace pdserve::common {
namespace {

// Spin iterations before a worker sleeps. Layers follow each other within
// microseconds during a forward pass, so a short spin avoids a futex wake
// per loop; between requests the workers sleep. Kept short because a
// spinning thread steals its core from whoever else runs on the machine
// (other workers, tests running in parallel).
constexpr int kSpinIterations = 4000;
// The caller spins this long on unfinished chunks, then yields its core:
// a worker that was descheduled needs the CPU to finish.
constexpr int kCallerSpinIterations = 2000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : AvailableCpus()) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    stop_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunk(int index) {
  const int64_t chunks = num_threads_;
  // Even split in units of grain_; the last chunk takes the remainder.
  const int64_t units = (n_ + grain_ - 1) / grain_;
  const int64_t begin_unit = units * index / chunks;
  const int64_t end_unit = units * (index + 1) / chunks;
  const int64_t begin = std::min(n_, begin_unit * grain_);
  const int64_t end = std::min(n_, end_unit * grain_);
  if (begin < end) (*fn_)(begin, end);
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    int spins = 0;
    uint64_t gen;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      if (stop_.load(std::memory_order_acquire)) return;
      if (++spins < kSpinIterations) {
        CpuRelax();
        continue;
      }
      if (spins < 2 * kSpinIterations) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock<std::mutex> lock(sleep_mu_);
      wake_.wait(lock, [&] {
        return stop_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      });
    }
    seen = gen;
    RunChunk(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::ParallelFor(int64_t n,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  ParallelForGrained(n, 1, fn);
}

void ThreadPool::ParallelForGrained(
    int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  fn_ = &fn;
  n_ = n;
  grain_ = std::max<int64_t>(1, grain);
  pending_.store(num_threads_ - 1, std::memory_order_release);
  {
    // Taking the lock orders the bump against a worker about to sleep, so
    // no wake-up is lost.
    std::lock_guard<std::mutex> lock(sleep_mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  RunChunk(0);
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kCallerSpinIterations) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

}  // namespace pdserve::common
