#include "common/termination_signal.h"

#include <signal.h>

#include <thread>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

// gtest_main starts no threads before this runs, so blocking here affects the
// whole process, as BlockTerminationSignals() requires.
TEST(TerminationSignalTest, TimesOutWithoutASignal) {
  BlockTerminationSignals();
  EXPECT_EQ(WaitForTerminationSignal(absl::Milliseconds(20)), std::nullopt);
}

TEST(TerminationSignalTest, ReturnsTheSignalSentToTheProcess) {
  BlockTerminationSignals();
  std::thread sender([] { ::kill(::getpid(), SIGTERM); });
  EXPECT_EQ(WaitForTerminationSignal(absl::Seconds(10)), SIGTERM);
  sender.join();
  ::kill(::getpid(), SIGINT);
  EXPECT_EQ(WaitForTerminationSignal(), SIGINT);
}

}  // namespace
}  // namespace pdserve
