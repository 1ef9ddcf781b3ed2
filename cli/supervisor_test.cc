// The restart policy's arithmetic. The supervisor's handling of real
// processes (a crash restarted, a crash loop left down, a drained worker
// left alone) is tested against a real pdctl cluster in
// tests/supervisor_test.cc.
#include "cli/supervisor.h"

#include <gtest/gtest.h>

namespace pdserve::cli {
namespace {

TEST(RestartPolicyTest, BackoffDoublesPerCrashInARowUpToTheMaximum) {
  RestartPolicy policy;
  policy.initial_backoff = absl::Milliseconds(500);
  policy.max_backoff = absl::Seconds(3);
  EXPECT_EQ(policy.Backoff(1), absl::Milliseconds(500));
  EXPECT_EQ(policy.Backoff(2), absl::Seconds(1));
  EXPECT_EQ(policy.Backoff(3), absl::Seconds(2));
  EXPECT_EQ(policy.Backoff(4), absl::Seconds(3));
  EXPECT_EQ(policy.Backoff(1000), absl::Seconds(3));
}

TEST(RestartPolicyTest, StateNamesAreWhatStatusPrints) {
  EXPECT_STREQ(SupervisedStateName(SupervisedState::kRunning), "running");
  EXPECT_STREQ(SupervisedStateName(SupervisedState::kBackingOff),
               "backing-off");
  EXPECT_STREQ(SupervisedStateName(SupervisedState::kCrashLoop), "crash-loop");
  EXPECT_STREQ(SupervisedStateName(SupervisedState::kLeft), "left");
  EXPECT_STREQ(SupervisedStateName(SupervisedState::kLeaving), "leaving");
}

}  // namespace
}  // namespace pdserve::cli
