#include "engine/chunk_budget.h"

#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

TEST(ChunkBudgetTest, ChunksFillTheBudgetAndOnlyAFinishingOneWantsLogits) {
  ChunkBudget budget(10);
  EXPECT_EQ(budget.Fit(4), 4);
  const ModelRunner::StepItem whole = budget.Take(1, 4, 4);
  EXPECT_EQ(whole.id, 1);
  EXPECT_EQ(whole.num_tokens, 4);
  EXPECT_EQ(whole.logits, LogitsMode::kLast);
  EXPECT_EQ(budget.left(), 6);

  // A longer prompt gets what is left: a chunk without logits.
  EXPECT_EQ(budget.Fit(20), 6);
  const ModelRunner::StepItem chunk = budget.Take(2, 6, 20);
  EXPECT_EQ(chunk.num_tokens, 6);
  EXPECT_EQ(chunk.logits, LogitsMode::kNone);
  EXPECT_EQ(budget.left(), 0);
  EXPECT_LE(budget.Fit(1), 0);
}

TEST(ChunkBudgetTest, NothingLeftToComputeFitsNothing) {
  ChunkBudget budget(8);
  EXPECT_EQ(budget.Fit(0), 0);
  EXPECT_EQ(budget.left(), 8);
}

}  // namespace
}  // namespace pdserve::engine
