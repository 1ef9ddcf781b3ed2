#include "engine/sampling_proto.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/common.pb.h"

namespace pdserve::engine {
namespace {

using ::testing::ElementsAre;

TEST(FromProtoTest, AbsentFieldsTakeTheEngineDefaults) {
  const SamplingParams s = FromProto(v1::SamplingParams());
  EXPECT_EQ(s.temperature, 1.0f);
  EXPECT_EQ(s.top_p, 1.0f);
  EXPECT_EQ(s.repetition_penalty, 1.0f);
  EXPECT_FALSE(s.seed.has_value());
  EXPECT_FALSE(s.max_tokens.has_value());
  EXPECT_TRUE(s.logit_bias.empty());
}

// Every field reaches the engine: a field the conversion forgot would be
// accepted by the router and silently ignored by the workers.
TEST(FromProtoTest, EveryFieldIsCarried) {
  v1::SamplingParams p;
  p.set_temperature(0.5f);
  p.set_top_k(40);
  p.set_top_p(0.9f);
  p.set_min_p(0.05f);
  p.set_repetition_penalty(1.1f);
  p.set_presence_penalty(0.25f);
  p.set_frequency_penalty(-0.5f);
  p.set_seed(1234);
  p.set_max_tokens(16);
  p.add_stop("END");
  p.add_stop_token_ids(7);
  p.set_ignore_eos(true);
  p.set_logprobs(true);
  p.set_top_logprobs(3);
  (*p.mutable_logit_bias())[42] = 100.0f;
  (*p.mutable_logit_bias())[3] = -2.5f;
  const SamplingParams s = FromProto(p);
  EXPECT_EQ(s.temperature, 0.5f);
  EXPECT_EQ(s.top_k, 40u);
  EXPECT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.min_p, 0.05f);
  EXPECT_EQ(s.repetition_penalty, 1.1f);
  EXPECT_EQ(s.presence_penalty, 0.25f);
  EXPECT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(s.max_tokens, 16u);
  EXPECT_THAT(s.stop, ElementsAre("END"));
  EXPECT_THAT(s.stop_token_ids, ElementsAre(7u));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_TRUE(s.logprobs);
  EXPECT_EQ(s.top_logprobs, 3u);
  EXPECT_EQ(s.logit_bias,
            (std::map<uint32_t, float>{{3, -2.5f}, {42, 100.0f}}));
}

}  // namespace
}  // namespace pdserve::engine
