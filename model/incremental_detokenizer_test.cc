// Tests of IncrementalDetokenizer (model/tokenizer.h): characters and
// spaces held back until settled, and agreement with Detokenize on random
// streams.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/testing/tokenizer_fixtures.h"
#include "model/tokenizer.h"

namespace pdserve::model {
namespace {

using ::testing::ElementsAre;
using tokenizer_fixtures::CheckRandomStreams;
using tokenizer_fixtures::kBos;
using tokenizer_fixtures::kEndOfText;
using tokenizer_fixtures::kHello;
using tokenizer_fixtures::kSpaceWorld;
using tokenizer_fixtures::Stream;
using tokenizer_fixtures::TinyBpe;

TEST(IncrementalDetokenizerTest, HoldsSplitCharacters) {
  auto t = TinyBpe("smollm");
  ASSERT_NE(t, nullptr);
  IncrementalDetokenizer d(*t, false, false);
  // "a😀b" as byte tokens: the emoji's four bytes arrive one by one.
  std::vector<std::string> outputs;
  EXPECT_EQ(Stream(&d, {'a', 0xF0, 0x9F, 0x98, 0x80, 'b'}, &outputs),
            "a\xF0\x9F\x98\x80"
            "b");
  EXPECT_THAT(outputs,
              ElementsAre("a", "", "", "", "\xF0\x9F\x98\x80", "b", ""));
  // Bytes left incomplete at the end, and ill-formed ones, become U+FFFD.
  EXPECT_EQ(Stream(&d, {'x', 0xE2, 0x82}), "x\xEF\xBF\xBD");
  EXPECT_EQ(Stream(&d, {0xFF, 'y'}), "\xEF\xBF\xBDy");
  EXPECT_EQ(Stream(&d, {}), "");
}

TEST(IncrementalDetokenizerTest, HoldsSpacesUntilCleanUpIsSettled) {
  auto t = TinyBpe("gpt-2");  // cleans up spaces
  ASSERT_NE(t, nullptr);
  IncrementalDetokenizer d(*t, false, false);
  std::vector<std::string> outputs;
  EXPECT_EQ(Stream(&d, {kHello, ' ', '?'}, &outputs), "hello?");
  EXPECT_THAT(outputs, ElementsAre("hello", "", "", "?"));
}

TEST(IncrementalDetokenizerTest, MatchesDetokenizeOnRandomStreams) {
  auto t = TinyBpe("gpt-2", {{"tokenizer.ggml.add_bos_token", true},
                             {"tokenizer.ggml.add_eos_token", true},
                             {"tokenizer.ggml.add_space_prefix", true}});
  ASSERT_NE(t, nullptr);
  const std::vector<TokenId> pool = {
      ' ',  ' ',  ' ',  '\'',       '\'', 's',         'm',    'r',  'e',  'v',
      '?',  '.',  ',',  '!',        'a',  0xF0,        0x9F,   0x98, 0x80, 0xC3,
      0xA9, 0xFF, 0x80, kEndOfText, kBos, kSpaceWorld, kHello, '\0'};
  CheckRandomStreams(*t, pool, 3000, 1);
}

}  // namespace
}  // namespace pdserve::model
