#include "common/status_macros.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

absl::StatusOr<int> ParsePositive(int value) {
  if (value <= 0) return absl::InvalidArgumentError("not positive");
  return value;
}

absl::Status CheckPositive(int value) {
  PD_ASSIGN_OR_RETURN(int parsed, ParsePositive(value));
  (void)parsed;
  return absl::OkStatus();
}

absl::StatusOr<int> AddPositives(int a, int b) {
  PD_ASSIGN_OR_RETURN(const int x, ParsePositive(a));
  int y = 0;
  PD_ASSIGN_OR_RETURN(y, ParsePositive(b));  // Assigns an existing variable.
  return x + y;
}

absl::StatusOr<std::unique_ptr<std::string>> MakeOwned(bool ok) {
  if (!ok) return absl::NotFoundError("no string");
  return std::make_unique<std::string>("owned");
}

absl::StatusOr<std::string> MoveOnlyValue(bool ok) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<std::string> owned, MakeOwned(ok));
  return *owned;
}

int calls = 0;
absl::Status CountedFailure() {
  ++calls;
  return absl::InternalError("counted");
}

absl::Status ReturnIfError(bool fail) {
  if (fail) PD_RETURN_IF_ERROR(CountedFailure());
  PD_RETURN_IF_ERROR(absl::OkStatus());
  return absl::AlreadyExistsError("reached the end");
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesError) {
  const absl::Status status = CheckPositive(-1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "not positive");
  EXPECT_TRUE(CheckPositive(3).ok());
}

TEST(StatusMacrosTest, AssignOrReturnAssignsDeclarationsAndVariables) {
  EXPECT_EQ(*AddPositives(2, 5), 7);
  EXPECT_EQ(AddPositives(2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacrosTest, AssignOrReturnMovesMoveOnlyValues) {
  EXPECT_EQ(*MoveOnlyValue(true), "owned");
  EXPECT_EQ(MoveOnlyValue(false).status().code(), absl::StatusCode::kNotFound);
}

TEST(StatusMacrosTest, ReturnIfErrorEvaluatesOnceAndReturns) {
  calls = 0;
  EXPECT_EQ(ReturnIfError(true).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ReturnIfError(false).code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace pdserve
