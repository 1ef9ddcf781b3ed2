#include "worker/proto_conversion.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::worker {
namespace {

using ::testing::ElementsAre;

TEST(ProtoConversionTest, FinishReasons) {
  EXPECT_EQ(ToProto(engine::FinishReason::kStop), v1::FINISH_REASON_STOP);
  EXPECT_EQ(ToProto(engine::FinishReason::kLength), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ToProto(engine::FinishReason::kNone),
            v1::FINISH_REASON_UNSPECIFIED);
}

// Each event carries its one block hash; a clear carries none.
TEST(ProtoConversionTest, PrefixCacheEventsKeepTheirOrderAndKeys) {
  using Kind = engine::PrefixCacheEvent::Kind;
  const std::vector<v1::PrefixCacheEvent> events =
      ToProto({{Kind::kStored, 11}, {Kind::kRemoved, 22}, {Kind::kCleared, 0}});
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind(), v1::PrefixCacheEvent::KIND_STORED);
  EXPECT_THAT(events[0].block_hashes(), ElementsAre(11u));
  EXPECT_EQ(events[1].kind(), v1::PrefixCacheEvent::KIND_REMOVED);
  EXPECT_THAT(events[1].block_hashes(), ElementsAre(22u));
  EXPECT_EQ(events[2].kind(), v1::PrefixCacheEvent::KIND_CLEARED);
  EXPECT_TRUE(events[2].block_hashes().empty());
}

TEST(ProtoConversionTest, TokensFromTheWire) {
  const std::vector<uint32_t> ids = {0, 5, 49151};
  EXPECT_THAT(ToTokens(ids), ElementsAre(0, 5, 49151));
}

}  // namespace
}  // namespace pdserve::worker
