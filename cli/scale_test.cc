// pdctl scale's rules (which workers go, which sizes are refused) and its
// file channel to the supervisor. Scaling real processes under load is
// tested in tests/scale_test.cc.
#include "cli/scale.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "absl/time/clock.h"

namespace pdserve::cli {
namespace {

TEST(ScaleTest, VictimsAreDownThenDrainingThenLeastLoadedThenNewest) {
  const std::vector<ScaleCandidate> workers = {
      {.name = "decode-0", .inflight = 0},
      {.name = "decode-1", .inflight = 5},
      {.name = "decode-2", .inflight = 0},
      {.name = "decode-3", .draining = true, .inflight = 9},
      {.name = "decode-4", .down = true}};
  EXPECT_EQ(ChooseVictims(workers, 1), std::vector<std::string>{"decode-4"});
  EXPECT_EQ(ChooseVictims(workers, 2),
            (std::vector<std::string>{"decode-4", "decode-3"}));
  // Of two idle workers the newer goes; the busy one goes last.
  EXPECT_EQ(ChooseVictims(workers, 5),
            (std::vector<std::string>{"decode-4", "decode-3", "decode-2",
                                      "decode-0", "decode-1"}));
  EXPECT_EQ(ChooseVictims(workers, 9).size(), 5u);
  EXPECT_TRUE(ChooseVictims(workers, 0).empty());
}

TEST(ScaleTest, NoDecodingWorkerLeftIsRefusedPrefillMayGoToZero) {
  EXPECT_TRUE(
      CheckPoolSizes({{"prefill", 0}, {"decode", 1}, {"colocated", 0}}).ok());
  EXPECT_TRUE(
      CheckPoolSizes({{"prefill", 2}, {"decode", 0}, {"colocated", 1}}).ok());
  const absl::Status none =
      CheckPoolSizes({{"prefill", 2}, {"decode", 0}, {"colocated", 0}});
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("no decode or colocated worker"),
            std::string::npos)
      << none;
  EXPECT_EQ(CheckPoolSizes({{"decode", -1}, {"colocated", 1}}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScaleTest, PoolNames) {
  EXPECT_TRUE(CheckPoolName("prefill").ok());
  EXPECT_TRUE(CheckPoolName("colocated").ok());
  EXPECT_EQ(CheckPoolName("router").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PoolOfWorker("decode-12"), "decode");
  EXPECT_EQ(PoolOfWorker("colocated-0"), "colocated");
  EXPECT_EQ(PoolOfWorker("router"), "");
  EXPECT_EQ(PoolOfWorker("decode-x"), "");
}

TEST(ScaleTest, RequestsRoundTripAndBadOnesAreRefused) {
  const ScaleRequest request{.id = "42-7",
                             .pool = "decode",
                             .replicas = 3,
                             .drain_deadline = absl::Milliseconds(1500)};
  absl::StatusOr<ScaleRequest> parsed =
      ParseScaleRequest(FormatScaleRequest(request));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->id, "42-7");
  EXPECT_EQ(parsed->pool, "decode");
  EXPECT_EQ(parsed->replicas, 3);
  EXPECT_EQ(parsed->drain_deadline, absl::Milliseconds(1500));
  for (const char* bad :
       {"", "scale 1 decode 3", "scale 1 decode -1 100", "scale 1 gpu 1 100",
        "scale 1 decode 2 0", "grow 1 decode 2 100"}) {
    EXPECT_EQ(ParseScaleRequest(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// The channel, with this test as the supervisor: the request arrives whole,
// the result reaches the pdctl that asked, and a second pdctl waits for the
// first to finish.
TEST(ScaleTest, ChannelCarriesRequestAndResultAndSerializes) {
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR")) + "/scale_channel";
  std::filesystem::create_directories(dir);
  std::string id;
  EXPECT_FALSE(TakeScaleRequest(dir, &id).has_value());

  auto serve = [&](int requests) {
    for (int served = 0; served < requests;) {
      std::string taken_id;
      if (auto taken = TakeScaleRequest(dir, &taken_id)) {
        ASSERT_TRUE(taken->ok()) << taken->status();
        // Long enough for the second pdctl to find the lock held.
        absl::SleepFor(absl::Milliseconds(300));
        if ((*taken)->replicas == 0) {
          WriteScaleResult(dir, taken_id,
                           absl::FailedPreconditionError("refused: zero"));
        } else {
          WriteScaleResult(dir, taken_id,
                           absl::StrCat("scaled to ", (*taken)->replicas));
        }
        ++served;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  };
  std::thread supervisor(serve, 2);
  absl::StatusOr<std::string> first, second;
  std::ostringstream first_wait, second_wait;
  std::thread a([&] {
    first = RequestScale(
        dir, {.id = "a", .pool = "decode", .replicas = 2}, absl::Seconds(20),
        [] { return true; }, first_wait);
  });
  absl::SleepFor(absl::Milliseconds(100));
  std::thread b([&] {
    second = RequestScale(
        dir, {.id = "b", .pool = "prefill", .replicas = 0}, absl::Seconds(20),
        [] { return true; }, second_wait);
  });
  a.join();
  b.join();
  supervisor.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "scaled to 2");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), "refused: zero");
  EXPECT_NE(second_wait.str().find("waiting for another pdctl scale"),
            std::string::npos);

  // A supervisor that is gone: pdctl scale says so instead of waiting.
  absl::StatusOr<std::string> orphan = RequestScale(
      dir, {.id = "c", .pool = "decode", .replicas = 1}, absl::Seconds(20),
      [] { return false; }, first_wait);
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(TakeScaleRequest(dir, &id).has_value())
      << "the orphaned request was left for a later supervisor";
}

}  // namespace
}  // namespace pdserve::cli
