// The pieces every transport backend shares: extent validation and
// coalescing, the operation table, the notice mailbox.
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_transfer/extents.h"
#include "kv_transfer/notice_mailbox.h"
#include "kv_transfer/operation_table.h"

namespace pdserve::kv_transfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ExtentsTest, ValidationChecksBothRegionsAndOverflow) {
  EXPECT_TRUE(ValidateExtents({{0, 0, 10}, {90, 40, 10}}, 100, 50).ok());
  EXPECT_EQ(ValidateExtents({{0, 0, 0}}, 100, 100).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status local = ValidateExtents({{91, 0, 10}}, 100, 100);
  EXPECT_EQ(local.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(local.message()), HasSubstr("extent 0"));
  EXPECT_EQ(ValidateExtents({{0, 0, 1}, {0, 41, 10}}, 100, 50).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ValidateExtents({{UINT64_MAX, 0, 2}}, UINT64_MAX, 100).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(ExtentsTest, CoalescesRunsContiguousOnBothSides) {
  // Blocks 3,4,5 -> remote 10,11,12 merge; block 6 -> remote 20 does not;
  // given out of order.
  const std::vector<Extent> extents = {
      {400, 1100, 100}, {300, 1000, 100}, {500, 1200, 100}, {600, 2000, 100}};
  EXPECT_THAT(CoalesceExtents(extents),
              ElementsAre(Extent{300, 1000, 300}, Extent{600, 2000, 100}));
  // Contiguous locally but not remotely: kept apart.
  EXPECT_THAT(CoalesceExtents({{0, 0, 10}, {10, 30, 10}}),
              ElementsAre(Extent{0, 0, 10}, Extent{10, 30, 10}));
  EXPECT_EQ(TotalBytes(extents), 400u);
  EXPECT_TRUE(CoalesceExtents({}).empty());
}

TEST(OperationTableTest, PollReportsInProgressThenTheResultOnce) {
  OperationTable table;
  const OperationId op = table.Add();
  EXPECT_EQ(table.Poll(op).state, OperationState::kInProgress);
  EXPECT_TRUE(table.Complete(op, absl::DataLossError("bad checksum")));
  EXPECT_FALSE(table.Complete(op, absl::OkStatus()));  // First one wins.
  const OperationStatus status = table.Poll(op);
  EXPECT_EQ(status.state, OperationState::kFailed);
  EXPECT_EQ(status.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(table.Poll(op).status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.size(), 0u);
}

TEST(OperationTableTest, WaitReturnsOnCompletionOrLeavesItRunning) {
  OperationTable table;
  const OperationId op = table.Add();
  EXPECT_EQ(table.Wait(op, absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(table.size(), 1u);  // Still known, still running.
  std::thread completer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    table.Complete(op, absl::OkStatus());
  });
  EXPECT_TRUE(table.Wait(op, absl::Now() + absl::Seconds(10)).ok());
  completer.join();
  EXPECT_EQ(table.size(), 0u);
}

TEST(OperationTableTest, IsFinishedDoesNotConsumeTheResult) {
  OperationTable table;
  const OperationId op = table.Add();
  EXPECT_FALSE(table.IsFinished(op));
  table.Complete(op, absl::CancelledError("cancelled"));
  EXPECT_TRUE(table.IsFinished(op));
  EXPECT_EQ(table.Poll(op).status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(table.IsFinished(op));  // Unknown counts as finished.
}

TEST(NoticeMailboxTest, DeliversOnceToAWaiterOrALaterClaim) {
  NoticeMailbox mailbox;
  mailbox.Deliver("t1", "early");
  EXPECT_EQ(*mailbox.Await("t1", absl::Now()), "early");
  EXPECT_EQ(mailbox.Await("t1", absl::Now()).status().code(),
            absl::StatusCode::kDeadlineExceeded);

  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(20));
    mailbox.Deliver("t2", "late");
  });
  absl::StatusOr<std::string> late =
      mailbox.Await("t2", absl::Now() + absl::Seconds(10));
  sender.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "late");
}

TEST(NoticeMailboxTest, ClaimedNoticesNeverCrowdOutNewOnes) {
  // One notice is never claimed while thousands of others come and go: new
  // notices must still be stored and claimable.
  NoticeMailbox mailbox(/*capacity=*/4);
  mailbox.Deliver("abandoned", "x");
  for (int i = 0; i < 5000; ++i) {
    const std::string key = "t" + std::to_string(i);
    mailbox.Deliver(key, "p");
    ASSERT_TRUE(mailbox.Await(key, absl::Now()).ok()) << i;
  }
  EXPECT_EQ(mailbox.size(), 1u);
  EXPECT_EQ(*mailbox.Await("abandoned", absl::Now()), "x");
}

TEST(NoticeMailboxTest, DropsTheOldestUnclaimedNoticeWhenFull) {
  NoticeMailbox mailbox(/*capacity=*/2);
  mailbox.Deliver("a", "1");
  mailbox.Deliver("b", "2");
  mailbox.Deliver("c", "3");
  EXPECT_EQ(mailbox.size(), 2u);
  EXPECT_EQ(mailbox.Await("a", absl::Now()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*mailbox.Await("c", absl::Now()), "3");
}

}  // namespace
}  // namespace pdserve::kv_transfer
