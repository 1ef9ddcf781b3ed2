#include "common/log.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = MinLogLevel(); }
  void TearDown() override {
    SetMinLogLevel(saved_);
    SetLogTag("");
  }
  LogLevel saved_ = LogLevel::kInfo;
};

TEST_F(LogTest, WritesLevelTagLocationAndMessage) {
  SetMinLogLevel(LogLevel::kInfo);
  SetLogTag("decode-7");
  ::testing::internal::CaptureStderr();
  PD_LOG(WARNING) << "free blocks " << 42;
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.front(), 'W');
  EXPECT_NE(out.find("[decode-7]"), std::string::npos) << out;
  EXPECT_NE(out.find("log_test.cc:"), std::string::npos) << out;
  EXPECT_NE(out.find("] free blocks 42\n"), std::string::npos) << out;
}

int evaluated = 0;
int CountEvaluation() { return ++evaluated; }

TEST_F(LogTest, DropsMessagesBelowTheMinimumWithoutEvaluatingThem) {
  SetMinLogLevel(LogLevel::kError);
  evaluated = 0;
  ::testing::internal::CaptureStderr();
  PD_LOG(INFO) << "hidden " << CountEvaluation();
  PD_LOG(ERROR) << "shown " << CountEvaluation();
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
  EXPECT_NE(out.find("shown 1"), std::string::npos) << out;
  EXPECT_EQ(evaluated, 1);
}

TEST_F(LogTest, ConcurrentLinesStayWhole) {
  SetMinLogLevel(LogLevel::kInfo);
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        PD_LOG(INFO) << "thread=" << t << " line=" << i << " end";
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const std::string out = ::testing::internal::GetCapturedStderr();
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    ++lines;
    EXPECT_EQ(line.front(), 'I') << line;
    EXPECT_TRUE(absl::EndsWith(line, " end")) << line;
  }
  EXPECT_EQ(lines, 800);
}

}  // namespace
}  // namespace pdserve
