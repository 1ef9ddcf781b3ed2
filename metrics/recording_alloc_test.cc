// Recording through held handles allocates nothing: Inc, Add, Set and
// Observe run on the request and decode paths, whose allocation-free tests
// must keep passing with metrics on (issue 17). Registration, series
// creation and scrapes may allocate; they happen at startup and once per
// scrape interval.
#include <cmath>
#include <cstdint>

#include "common/allocation_counter.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"

namespace pdserve::metrics {
namespace {

MetricOptions Options(const char* name, std::vector<std::string> labels) {
  MetricOptions o;
  o.name = name;
  o.help = "help";
  o.label_names = std::move(labels);
  return o;
}

TEST(RecordingAllocTest, IncSetAndObserveAllocateNothing) {
  if (!AllocationCountingIsLive()) {
    GTEST_SKIP() << "operator new is not ours to count in this build "
                    "(AddressSanitizer); the default build runs this test";
  }
  Registry registry;
  Counter* tokens =
      *(*registry.AddCounter(Options("pdserve_tokens_total", {"model"})))
           ->WithLabels({"m"});
  Gauge* running =
      *(*registry.AddGauge(Options("pdserve_requests_running", {})))
           ->WithLabels({});
  Histogram* itl =
      *(*registry.AddHistogram(
            Options("pdserve_inter_token_latency_seconds", {"model"}),
            {0.0005, 0.001, 0.002, 0.005, 0.01, 0.1, 1}))
           ->WithLabels({"m"});
  registry.Collect();  // a scrape before recording changes nothing below

  const int64_t before = AllocationCount();
  for (int i = 0; i < 10000; ++i) {
    tokens->Inc();
    tokens->Inc(3);
    tokens->Add(0.5);
    running->Inc();
    running->Set(i);
    running->Dec();
    itl->Observe(0.0001 * i);
    itl->Observe(std::nan(""));
  }
  EXPECT_EQ(AllocationCount() - before, 0);

  // The counter really is live: the same binary sees allocations elsewhere.
  const int64_t scrape = AllocationCount();
  EXPECT_EQ(registry.Collect().size(), 3);
  EXPECT_GT(AllocationCount(), scrape);
}

}  // namespace
}  // namespace pdserve::metrics
