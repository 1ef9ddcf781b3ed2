#include "engine/stop_checker.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

// Feeds `chunks` and returns, per chunk, the emitted text and stop flag as
// "text|S" or "text|-", plus "flush:<text>" at the end.
std::vector<std::string> Stream(std::vector<std::string> stops,
                                const std::vector<std::string>& chunks) {
  StopChecker checker(std::move(stops));
  std::vector<std::string> out;
  for (const std::string& c : chunks) {
    StopChecker::FeedResult r = checker.Feed(c);
    out.push_back(r.text + (r.stopped ? "|S" : "|-"));
  }
  out.push_back("flush:" + checker.Flush());
  return out;
}

using V = std::vector<std::string>;

TEST(StopChecker, NoStopStringsPassesTextThrough) {
  EXPECT_EQ(Stream({}, {"Hello", ", ", "world"}),
            (V{"Hello|-", ", |-", "world|-", "flush:"}));
  // Empty stop strings are ignored rather than matching everywhere.
  EXPECT_EQ(Stream({""}, {"abc"}), (V{"abc|-", "flush:"}));
}

TEST(StopChecker, StopStringSplitAcrossChunks) {
  EXPECT_EQ(Stream({"STOP"}, {"Hello ST", "OP and more", "ignored"}),
            (V{"Hello |-", "|S", "|S", "flush:"}));
  EXPECT_EQ(Stream({"STOP"}, {"Hello S", "T", "O", "Pxyz"}),
            (V{"Hello |-", "|-", "|-", "|S", "flush:"}));
  // Text before the match in the completing chunk is returned.
  EXPECT_EQ(Stream({"STOP"}, {"a S", "TO", "xyz"}),
            (V{"a |-", "|-", "STOxyz|-", "flush:"}));
  EXPECT_EQ(Stream({"<end>"}, {"one <e", "nd> two"}),
            (V{"one |-", "|S", "flush:"}));
}

TEST(StopChecker, FalseStartIsReleased) {
  EXPECT_EQ(Stream({"STOP"}, {"Hello ST", "ART"}),
            (V{"Hello |-", "START|-", "flush:"}));
  // A prefix still pending at the end comes out in Flush.
  EXPECT_EQ(Stream({"STOP"}, {"Hello ST"}), (V{"Hello |-", "flush:ST"}));
}

TEST(StopChecker, StopAtTheVeryStart) {
  EXPECT_EQ(Stream({"STOP"}, {"STOP now"}), (V{"|S", "flush:"}));
  EXPECT_EQ(Stream({"STOP"}, {"ST", "OP"}), (V{"|-", "|S", "flush:"}));
  EXPECT_EQ(Stream({"x"}, {"x"}), (V{"|S", "flush:"}));
}

TEST(StopChecker, OverlappingStopStrings) {
  // "ab" and "abc": "ab" completes first and stops.
  EXPECT_EQ(Stream({"abc", "ab"}, {"xa", "b", "c"}),
            (V{"x|-", "|S", "|S", "flush:"}));
  EXPECT_EQ(Stream({"ab", "abc"}, {"xa", "bc"}), (V{"x|-", "|S", "flush:"}));
  // "aab" with a run of a's: only the last two can still start it.
  EXPECT_EQ(Stream({"aab"}, {"a", "a", "a", "b", "c"}),
            (V{"|-", "|-", "a|-", "|S", "|S", "flush:"}));
  EXPECT_EQ(Stream({"aab"}, {"aaaac"}), (V{"aaaac|-", "flush:"}));
  EXPECT_EQ(Stream({"aab"}, {"aaaa"}), (V{"aa|-", "flush:aa"}));
  // The earliest-starting match wins inside one chunk.
  EXPECT_EQ(Stream({"world", "lo"}, {"hello world"}), (V{"hel|S", "flush:"}));
  // Streaming semantics: the first chunk whose text contains a match stops
  // (documented chunk dependence with overlapping stops).
  EXPECT_EQ(Stream({"b", "abc"}, {"ab", "c"}), (V{"a|S", "|S", "flush:"}));
  EXPECT_EQ(Stream({"b", "abc"}, {"abc"}), (V{"|S", "flush:"}));
  // Hold-back uses the longest candidate prefix over all stop strings.
  EXPECT_EQ(Stream({"xyz", "yzw"}, {"axy"}), (V{"a|-", "flush:xy"}));
}

TEST(StopChecker, MultiByteUtf8) {
  // 世 = E4 B8 96, 界 = E7 95 8C. The stop string arrives byte-split.
  EXPECT_EQ(Stream({"世界"}, {"你好\xE4\xB8", "\x96\xE7", "\x95\x8C!"}),
            (V{"你好|-", "|-", "|S", "flush:"}));
  // é = C3 A9 as a stop; ä = C3 A4 shares its lead byte and is released
  // once its second byte rules the match out.
  EXPECT_EQ(Stream({"é"}, {"a\xC3", "\xA4x", "caf\xC3", "\xA9"}),
            (V{"a|-", "äx|-", "caf|-", "|S", "flush:"}));
  // Without stop strings, an incomplete trailing character is still held
  // so emitted text never ends inside a character.
  EXPECT_EQ(Stream({}, {"a\xE4\xB8", "\x96", "b\xF0\x9F", "\x98", "\x80"}),
            (V{"a|-", "世|-", "b|-", "|-", "\xF0\x9F\x98\x80|-", "flush:"}));
  // ...and flushed as is at the end.
  EXPECT_EQ(Stream({}, {"b\xE4"}), (V{"b|-", "flush:\xE4"}));
  // Bytes that cannot start a character are not held.
  EXPECT_EQ(Stream({}, {"a\xFF", "\x80"}), (V{"a\xFF|-", "\x80|-", "flush:"}));
  // Matching a multi-byte stop right at the start.
  EXPECT_EQ(Stream({"ü"}, {"\xC3", "\xBC rest"}), (V{"|-", "|S", "flush:"}));
}

TEST(StopChecker, FlushEndsTheStream) {
  StopChecker checker({"zz"});
  EXPECT_EQ(checker.Feed("az").text, "a");
  EXPECT_EQ(checker.Flush(), "z");
  EXPECT_EQ(checker.Flush(), "");
  EXPECT_EQ(checker.Feed("more").text, "");
  EXPECT_FALSE(checker.stopped());
}

// Reference for a random test: stop strings are checked after each chunk on
// the whole text so far; the first chunk whose text contains one ends the
// output at the earliest match start.
std::string Reference(const std::vector<std::string>& stops,
                      const std::vector<std::string>& chunks, bool* stopped) {
  std::string text;
  for (const std::string& c : chunks) {
    text += c;
    size_t best = std::string::npos;
    for (const std::string& s : stops) best = std::min(best, text.find(s));
    if (best != std::string::npos) {
      *stopped = true;
      return text.substr(0, best);
    }
  }
  *stopped = false;
  return text;
}

TEST(StopChecker, RandomChunkingsMatchReference) {
  std::mt19937 gen(1);
  auto random_string = [&](int min_len, int max_len) {
    std::string s(std::uniform_int_distribution<int>(min_len, max_len)(gen),
                  'a');
    for (char& c : s) c = "abc"[std::uniform_int_distribution<int>(0, 2)(gen)];
    return s;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::string> stops;
    const int n_stops = std::uniform_int_distribution<int>(0, 3)(gen);
    for (int i = 0; i < n_stops; ++i) stops.push_back(random_string(1, 4));
    std::vector<std::string> chunks;
    const int n_chunks = std::uniform_int_distribution<int>(1, 8)(gen);
    for (int i = 0; i < n_chunks; ++i) chunks.push_back(random_string(0, 4));

    bool want_stopped = false;
    const std::string want = Reference(stops, chunks, &want_stopped);
    StopChecker checker(stops);
    std::string got;
    std::string fed;
    bool stopped = false;
    for (const std::string& c : chunks) {
      fed += c;
      StopChecker::FeedResult r = checker.Feed(c);
      got += r.text;
      // Never emits past the final answer...
      ASSERT_EQ(want.compare(0, got.size(), got), 0)
          << "stops " << testing::PrintToString(stops) << " chunks "
          << testing::PrintToString(chunks);
      stopped = r.stopped;
      if (stopped) break;
      // ...and holds back no more than the longest proper prefix of a stop
      // string (all ASCII here, so no UTF-8 hold).
      size_t max_hold = 0;
      for (const std::string& s : stops) {
        for (size_t k = std::min(s.size() - 1, fed.size()); k > 0; --k) {
          if (fed.compare(fed.size() - k, k, s, 0, k) == 0) {
            max_hold = std::max(max_hold, k);
            break;
          }
        }
      }
      ASSERT_EQ(got.size(), fed.size() - max_hold)
          << "stops " << testing::PrintToString(stops) << " chunks "
          << testing::PrintToString(chunks);
    }
    got += checker.Flush();
    EXPECT_EQ(got, want);
    EXPECT_EQ(stopped, want_stopped);
  }
}

// ---------------------------------------------------------------------------
// StopTokenChecker.

TEST(StopTokenChecker, EosAndStopTokenIds) {
  SamplingParams p;
  p.stop_token_ids = {7};
  const std::vector<uint32_t> eos = {2, 3};
  StopTokenChecker checker(p, eos, 100);
  EXPECT_TRUE(checker.IsStopToken(2));
  EXPECT_TRUE(checker.IsStopToken(3));
  EXPECT_TRUE(checker.IsStopToken(7));
  EXPECT_FALSE(checker.IsStopToken(4));
  EXPECT_EQ(checker.Check(2, 1, 10), FinishReason::kStop);
  EXPECT_EQ(checker.Check(7, 1, 10), FinishReason::kStop);
  EXPECT_EQ(checker.Check(4, 1, 10), FinishReason::kNone);

  p.ignore_eos = true;
  StopTokenChecker ignoring(p, eos, 100);
  EXPECT_FALSE(ignoring.IsStopToken(2));
  EXPECT_EQ(ignoring.Check(2, 1, 10), FinishReason::kNone);
  // stop_token_ids still apply with ignore_eos.
  EXPECT_EQ(ignoring.Check(7, 1, 10), FinishReason::kStop);
}

TEST(StopTokenChecker, LengthLimits) {
  SamplingParams p;
  p.max_tokens = 3;
  const std::vector<uint32_t> eos = {0};
  StopTokenChecker checker(p, eos, 50);
  EXPECT_EQ(checker.Check(5, 2, 12), FinishReason::kNone);
  EXPECT_EQ(checker.Check(5, 3, 13), FinishReason::kLength);
  // A stop token that is also the last allowed one is a natural stop.
  EXPECT_EQ(checker.Check(0, 3, 13), FinishReason::kStop);
  // Context full: prompt 47 + 3 generated = 50 = context length.
  SamplingParams unlimited;
  StopTokenChecker ctx(unlimited, eos, 50);
  EXPECT_EQ(ctx.Check(5, 2, 49), FinishReason::kNone);
  EXPECT_EQ(ctx.Check(5, 3, 50), FinishReason::kLength);
  EXPECT_EQ(ctx.Check(5, 1000000, 50), FinishReason::kLength);
  EXPECT_EQ(ctx.Check(5, 1000000, 49), FinishReason::kNone);
}

}  // namespace
}  // namespace pdserve::engine
