#include "metrics/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/text_format.h"

namespace pdserve::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ProcessMetricsTest, ReadsThisProcessFromProc) {
  // Burn a little CPU so the counter is above zero at tick resolution.
  volatile double x = 0;
  for (absl::Time end = absl::Now() + absl::Milliseconds(30);
       absl::Now() < end;) {
    x = x + 1;
  }
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->cpu_seconds, 0);
  EXPECT_GT(stats->resident_memory_bytes, 1 << 20);
  EXPECT_GE(stats->open_fds, 3);  // stdin, stdout, stderr at least
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(stats->start_time_seconds, now + 1);
  EXPECT_GT(stats->start_time_seconds, now - 3600);
}

TEST(ProcessMetricsTest, OpenFdsFollowsOpenAndClose) {
  double before = ReadProcessStats()->open_fds;
  int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ReadProcessStats()->open_fds, before + 1);
  close(fd);
  EXPECT_EQ(ReadProcessStats()->open_fds, before);
}

TEST(ProcessMetricsTest, RegistersStandardNamesAndBuildInfo) {
  Registry registry;
  ASSERT_TRUE(AddProcessMetrics(&registry, {"1.2.3", "abc123"}).ok());
  std::string text = RenderText(registry);
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_resident_memory_bytes gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_open_fds gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_start_time_seconds gauge\n"));
  EXPECT_THAT(text, HasSubstr("pdserve_build_info{version=\"1.2.3\","
                              "revision=\"abc123\"} 1\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("NaN")));
  // Twice in one registry is a name clash, not a silent duplicate.
  EXPECT_EQ(AddProcessMetrics(&registry).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(ProcessMetricsTest, DefaultBuildInfo) {
  Registry registry;
  ASSERT_TRUE(AddProcessMetrics(&registry).ok());
  EXPECT_THAT(
      RenderText(registry),
      HasSubstr(absl::StrCat("pdserve_build_info{version=\"", kPdserveVersion,
                             "\",revision=\"unknown\"} 1\n")));
}

}  // namespace
}  // namespace pdserve::metrics
