#include "loadgen/runner.h"

#include <cmath>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace pdserve::loadgen {

std::vector<absl::Duration> ArrivalOffsets(int64_t n, double request_rate,
                                           double burstiness, uint64_t seed) {
  std::vector<absl::Duration> offsets(n, absl::ZeroDuration());
  if (!std::isfinite(request_rate) || request_rate <= 0 || burstiness <= 0) {
    return offsets;
  }
  std::mt19937_64 rng(seed);
  // Mean shape * scale = 1 / rate.
  std::gamma_distribution<double> gap(burstiness,
                                      1.0 / (request_rate * burstiness));
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    offsets[i] = absl::Seconds(t);
    t += gap(rng);
  }
  return offsets;
}

LoadResult RunLoad(Target& target, const std::vector<BenchRequest>& requests,
                   const LoadOptions& options) {
  const int64_t n = requests.size();
  std::vector<absl::Duration> offsets =
      ArrivalOffsets(n, options.request_rate, options.burstiness, options.seed);
  for (int64_t i = 0; i < n; ++i) {
    if (requests[i].arrival.has_value()) offsets[i] = *requests[i].arrival;
  }
  LoadResult result;
  result.records.resize(n);
  absl::Mutex mu;
  int64_t in_flight = 0;
  LoadOptions::Progress progress;
  progress.total = n;
  bool all_done = n == 0;

  const absl::Time start = absl::Now();
  std::thread reporter;
  if (options.on_progress) {
    reporter = std::thread([&] {
      absl::MutexLock lock(&mu);
      while (!all_done) {
        mu.AwaitWithTimeout(absl::Condition(&all_done),
                            options.progress_interval);
        progress.elapsed = absl::Now() - start;
        options.on_progress(progress);
      }
    });
  }
  std::vector<std::thread> senders;
  senders.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    absl::SleepFor(start + offsets[i] - absl::Now());
    {
      absl::MutexLock lock(&mu);
      if (options.max_concurrency > 0) {
        auto has_room = [&] { return in_flight < options.max_concurrency; };
        mu.Await(absl::Condition(&has_room));
      }
      ++in_flight;
      ++progress.sent;
    }
    senders.emplace_back([&, i] {
      RequestRecord record =
          target.Send(requests[i], start, options.request_timeout);
      absl::MutexLock lock(&mu);
      --in_flight;
      ++progress.finished;
      progress.failed += !record.ok();
      result.records[i] = std::move(record);
      all_done = progress.finished == n;
    });
  }
  for (std::thread& t : senders) t.join();
  result.duration = absl::Now() - start;
  if (reporter.joinable()) reporter.join();
  // The run ends at the last answer; requests that had not begun by the
  // first send do not count before it.
  absl::Duration first = absl::InfiniteDuration();
  for (const RequestRecord& r : result.records)
    first = std::min(first, r.sent_at);
  if (n > 0) result.duration -= first;
  return result;
}

}  // namespace pdserve::loadgen
