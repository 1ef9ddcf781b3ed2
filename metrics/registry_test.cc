#include "metrics/registry.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

MetricOptions Options(std::string name, std::vector<std::string> labels = {}) {
  MetricOptions o;
  o.name = std::move(name);
  o.help = "help";
  o.label_names = std::move(labels);
  return o;
}

TEST(RegistryTest, SeriesAreCreatedOnceAndHeldByTheCaller) {
  Registry registry;
  absl::StatusOr<CounterFamily*> family = registry.AddCounter(
      Options("pdserve_requests_total", {"model", "status"}));
  ASSERT_TRUE(family.ok()) << family.status();
  absl::StatusOr<Counter*> ok = (*family)->WithLabels({"m", "ok"});
  absl::StatusOr<Counter*> error = (*family)->WithLabels({"m", "error"});
  ASSERT_TRUE(ok.ok() && error.ok());
  EXPECT_NE(*ok, *error);
  EXPECT_EQ(*(*family)->WithLabels({"m", "ok"}), *ok);
  (*ok)->Inc(2);
  (*error)->Inc();

  std::vector<FamilySnapshot> snapshot = registry.Collect();
  ASSERT_THAT(snapshot, SizeIs(1));
  EXPECT_EQ(snapshot[0].type, MetricType::kCounter);
  EXPECT_THAT(snapshot[0].label_names, ElementsAre("model", "status"));
  // Series sorted by label values.
  ASSERT_THAT(snapshot[0].series, SizeIs(2));
  EXPECT_THAT(snapshot[0].series[0].label_values, ElementsAre("m", "error"));
  EXPECT_EQ(snapshot[0].series[0].value, 1);
  EXPECT_EQ(snapshot[0].series[1].value, 2);
}

TEST(RegistryTest, UnlabelledFamiliesAreExportedBeforeAnyRecording) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge(Options("pdserve_requests_running")).ok());
  std::vector<FamilySnapshot> snapshot = registry.Collect();
  ASSERT_THAT(snapshot[0].series, SizeIs(1));
  EXPECT_EQ(snapshot[0].series[0].value, 0);
}

TEST(RegistryTest, WrongLabelCountAndTooManySeriesAreRefused) {
  Registry registry;
  MetricOptions options = Options("pdserve_tokens_total", {"worker"});
  options.max_series = 3;
  CounterFamily* family = *registry.AddCounter(options);
  EXPECT_EQ(family->WithLabels({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->WithLabels({"a", "b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(family->WithLabels({absl::StrCat("w", i)}).ok());
  }
  absl::StatusOr<Counter*> fourth = family->WithLabels({"w3"});
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(fourth.status().message(), HasSubstr("never from requests"));
  // Existing series are still found.
  EXPECT_TRUE(family->WithLabels({"w1"}).ok());
}

TEST(RegistryTest, RefusesBadNamesLabelsHelpAndBuckets) {
  Registry registry;
  EXPECT_EQ(registry.AddCounter(Options("pdserve_requests")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(registry.AddGauge(Options("pdserve_x", {"le"})).ok());
  MetricOptions no_help = Options("pdserve_y");
  no_help.help.clear();
  EXPECT_THAT(registry.AddGauge(no_help).status().message(), HasSubstr("help"));
  EXPECT_FALSE(registry.AddHistogram(Options("pdserve_z_seconds"), {}).ok());
  EXPECT_FALSE(
      registry.AddHistogram(Options("pdserve_z_seconds"), {2, 1}).ok());
  EXPECT_THAT(
      registry.AddGauge(Options("pdserve_version_info")).status().message(),
      HasSubstr("AddInfo"));
  EXPECT_FALSE(
      registry
          .AddGaugeCallback(Options("pdserve_cb", {"a"}), [] { return 1.0; })
          .ok());
}

TEST(RegistryTest, NamesAndTheSeriesNamesOfHistogramsAreUnique) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge(Options("pdserve_queue_seconds")).ok());
  EXPECT_EQ(registry.AddGauge(Options("pdserve_queue_seconds")).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.AddHistogram(Options("pdserve_step_seconds"), {1}).ok());
  absl::StatusOr<GaugeFamily*> clash =
      registry.AddGauge(Options("pdserve_step_seconds_bucket"));
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(clash.status().message(), HasSubstr("pdserve_step_seconds"));
}

TEST(RegistryTest, CallbacksAndInfoAreReadAtCollect) {
  Registry registry;
  double value = 1;
  ASSERT_TRUE(registry
                  .AddGaugeCallback(Options("pdserve_pool_workers"),
                                    [&value] { return value; })
                  .ok());
  ASSERT_TRUE(registry
                  .AddInfo("pdserve_build_info", "build",
                           {{"version", "1.2"}, {"revision", "abc"}})
                  .ok());
  EXPECT_FALSE(registry.AddInfo("pdserve_build", "x", {}).ok());
  value = 7;
  std::vector<FamilySnapshot> snapshot = registry.Collect();
  ASSERT_THAT(snapshot, SizeIs(2));
  EXPECT_EQ(snapshot[0].series[0].value, 7);
  EXPECT_THAT(snapshot[1].label_names, ElementsAre("version", "revision"));
  EXPECT_THAT(snapshot[1].series[0].label_values, ElementsAre("1.2", "abc"));
  EXPECT_EQ(snapshot[1].series[0].value, 1);
}

TEST(RegistryTest, LabelledCallbacksExportWhatTheyReturnAtCollect) {
  Registry registry;
  MetricOptions options = Options("pdserve_blocks", {"state"});
  options.max_series = 2;
  std::vector<Sample> samples = {{{"used"}, 3}, {{"free"}, 5}};
  ASSERT_TRUE(
      registry.AddGaugeCallback(options, [&samples] { return samples; }).ok());
  samples[0].value = 4;
  std::vector<FamilySnapshot> snapshot = registry.Collect();
  ASSERT_THAT(snapshot, SizeIs(1));
  EXPECT_THAT(snapshot[0].label_names, ElementsAre("state"));
  ASSERT_THAT(snapshot[0].series, SizeIs(2));
  EXPECT_THAT(snapshot[0].series[0].label_values, ElementsAre("used"));
  EXPECT_EQ(snapshot[0].series[0].value, 4);
  EXPECT_EQ(snapshot[0].series[1].value, 5);
  // A sample with the wrong number of label values is dropped, and no more
  // than max_series are exported.
  samples = {{{"used", "extra"}, 1}, {{"a"}, 1}, {{"b"}, 2}, {{"c"}, 3}};
  snapshot = registry.Collect();
  ASSERT_THAT(snapshot[0].series, SizeIs(2));
  EXPECT_THAT(snapshot[0].series[0].label_values, ElementsAre("a"));
  EXPECT_THAT(snapshot[0].series[1].label_values, ElementsAre("b"));
}

TEST(RegistryTest, SeriesCreatedWhileCollectingFromOtherThreads) {
  Registry registry;
  HistogramFamily* family = *registry.AddHistogram(
      Options("pdserve_latency_seconds", {"worker"}), {0.1, 1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([family, t] {
      for (int i = 0; i < 1000; ++i) {
        Histogram* h = *family->WithLabels({absl::StrCat("w", (t + i) % 8)});
        h->Observe(0.5);
      }
    });
  }
  for (int i = 0; i < 50; ++i) registry.Collect();
  for (std::thread& t : threads) t.join();
  uint64_t total = 0;
  // Held: a range-for over a member of the temporary would read freed memory.
  const std::vector<FamilySnapshot> families = registry.Collect();
  for (const SeriesSnapshot& s : families[0].series) {
    total += s.cumulative_counts.back();
  }
  EXPECT_EQ(total, 4000);
}

}  // namespace
}  // namespace pdserve::metrics
