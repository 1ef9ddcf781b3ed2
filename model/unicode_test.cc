// Tests of model/unicode.h: the byte-level mapping, categories, UTF-8
// decoding and validation, and the pre-tokenizer splits, with expectations
// derived by hand (llama.cpp's own pieces are checked through the tokenizer
// goldens, tokenizer_golden_test).
#include "model/unicode.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::model {
namespace {

using ::testing::ElementsAre;

TEST(UnicodeTest, ByteToUnicodeMapping) {
  // Printable Latin-1 bytes map to themselves ...
  EXPECT_EQ(ByteToUnicode('!'), 0x21u);
  EXPECT_EQ(ByteToUnicode('A'), 0x41u);
  EXPECT_EQ(ByteToUnicode('~'), 0x7Eu);
  EXPECT_EQ(ByteToUnicode(0xA1), 0xA1u);
  EXPECT_EQ(ByteToUnicode(0xAC), 0xACu);
  EXPECT_EQ(ByteToUnicode(0xAE), 0xAEu);
  EXPECT_EQ(ByteToUnicode(0xFF), 0xFFu);
  // ... the others to U+0100 + their rank among the unmapped bytes:
  // 0x00..0x20 (33 bytes), 0x7F, 0x80..0xA0 (33 bytes), 0xAD.
  EXPECT_EQ(ByteToUnicode(0x00), 0x100u);
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);  // "Ċ"
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);   // "Ġ"
  EXPECT_EQ(ByteToUnicode(0x7F), 0x121u);
  EXPECT_EQ(ByteToUnicode(0x80), 0x122u);
  EXPECT_EQ(ByteToUnicode(0xA0), 0x142u);
  EXPECT_EQ(ByteToUnicode(0xAD), 0x143u);
  EXPECT_EQ(ByteToUnicodeUtf8(' '), "\xC4\xA0");
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = ByteToUnicode(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second) << b;
    EXPECT_EQ(UnicodeToByte(cp), b);
  }
  EXPECT_EQ(UnicodeToByte(0x144), -1);
  EXPECT_EQ(UnicodeToByte(0x20), -1);
  EXPECT_EQ(UnicodeToByte(0x4E00), -1);
}

TEST(UnicodeTest, Categories) {
  EXPECT_EQ(GetUnicodeCategory('A'), UnicodeCategory::kLetter);
  EXPECT_EQ(GetUnicodeCategory('z'), UnicodeCategory::kLetter);
  EXPECT_EQ(GetUnicodeCategory('5'), UnicodeCategory::kNumber);
  EXPECT_EQ(GetUnicodeCategory(' '), UnicodeCategory::kSeparator);
  EXPECT_EQ(GetUnicodeCategory('!'), UnicodeCategory::kPunctuation);
  EXPECT_EQ(GetUnicodeCategory('_'), UnicodeCategory::kPunctuation);
  EXPECT_EQ(GetUnicodeCategory('$'), UnicodeCategory::kSymbol);
  EXPECT_EQ(GetUnicodeCategory('`'), UnicodeCategory::kSymbol);
  EXPECT_EQ(GetUnicodeCategory('\n'), UnicodeCategory::kControl);
  EXPECT_EQ(GetUnicodeCategory(0xE9), UnicodeCategory::kLetter);    // é
  EXPECT_EQ(GetUnicodeCategory(0x301), UnicodeCategory::kMark);     // acute
  EXPECT_EQ(GetUnicodeCategory(0x663), UnicodeCategory::kNumber);   // ٣
  EXPECT_EQ(GetUnicodeCategory(0xB2), UnicodeCategory::kNumber);    // ²
  EXPECT_EQ(GetUnicodeCategory(0x216B), UnicodeCategory::kNumber);  // Ⅻ
  EXPECT_EQ(GetUnicodeCategory(0x4E00), UnicodeCategory::kLetter);  // 一
  EXPECT_EQ(GetUnicodeCategory(0x3002), UnicodeCategory::kPunctuation);
  EXPECT_EQ(GetUnicodeCategory(0x1F600), UnicodeCategory::kSymbol);  // 😀
  EXPECT_EQ(GetUnicodeCategory(0x200D), UnicodeCategory::kControl);  // ZWJ
  EXPECT_EQ(GetUnicodeCategory(0xE000), UnicodeCategory::kControl);  // Co
  EXPECT_EQ(GetUnicodeCategory(0xD800), UnicodeCategory::kControl);  // Cs
  EXPECT_EQ(GetUnicodeCategory(0x3000), UnicodeCategory::kSeparator);
  EXPECT_EQ(GetUnicodeCategory(0x378), UnicodeCategory::kUndefined);
  EXPECT_EQ(GetUnicodeCategory(0x10FFFF), UnicodeCategory::kUndefined);
  EXPECT_EQ(GetUnicodeCategory(0x110000), UnicodeCategory::kUndefined);
  EXPECT_FALSE(UnicodeTableVersion().empty());
}

TEST(UnicodeTest, Whitespace) {
  for (uint32_t cp :
       {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u,
        0x2000u, 0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_TRUE(IsUnicodeWhitespace(cp)) << cp;
  }
  for (uint32_t cp :
       {0x08u, 0x0Eu, 0x1Cu, 0x21u, 0x200Bu, 0x180Eu, 0xFEFFu, 0x2581u}) {
    EXPECT_FALSE(IsUnicodeWhitespace(cp)) << cp;
  }
}

TEST(UnicodeTest, DecodeUtf8Lenient) {
  EXPECT_THAT(DecodeUtf8Lenient("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
              ElementsAre(0x61, 0xE9, 0x20AC, 0x1F600));
  // Each invalid byte is one U+FFFD; decoding resumes at the next byte.
  EXPECT_THAT(DecodeUtf8Lenient("\xFF\x80\xE2\x82x"),
              ElementsAre(0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 'x'));
  // Overlong forms and surrogates keep their value, as in llama.cpp.
  EXPECT_THAT(DecodeUtf8Lenient("\xC1\x81\xED\xA0\x80"),
              ElementsAre(0x41, 0xD800));
  EXPECT_THAT(DecodeUtf8Lenient("\xF5\x80\x80\x80"),
              ElementsAre(0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD));
  EXPECT_TRUE(DecodeUtf8Lenient("").empty());
}

TEST(UnicodeTest, StrictUtf8) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));
  EXPECT_EQ(SanitizeUtf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b"),
            "a" + fffd + "b");
  // A truncated sequence is one maximal subpart.
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"), fffd);
  EXPECT_EQ(SanitizeUtf8("\xE2\x82x"), fffd + "x");
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98"), fffd);
  // ED A0: A0 cannot follow ED, so three separate replacements.
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), fffd + fffd);
  EXPECT_EQ(IncompleteUtf8SuffixLength("abc"), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("a\xC3"), 1u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xED\xA0"), 0u);  // never valid
  EXPECT_EQ(IncompleteUtf8SuffixLength("\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8SuffixLength("\xFF"), 0u);
}

TEST(UnicodeTest, DecodeUtf8StrictAt) {
  uint32_t cp = 0;
  EXPECT_EQ(DecodeUtf8StrictAt("a", 0, &cp), 1u);
  EXPECT_EQ(cp, 0x61u);
  EXPECT_EQ(DecodeUtf8StrictAt("x\xC3\xA9", 1, &cp), 2u);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(DecodeUtf8StrictAt("\xE3\x80\x80", 0, &cp), 3u);
  EXPECT_EQ(cp, 0x3000u);
  EXPECT_EQ(DecodeUtf8StrictAt("\xF4\x8F\xBF\xBF", 0, &cp), 4u);
  EXPECT_EQ(cp, 0x10FFFFu);
  // Whatever IsValidUtf8 refuses gives 0 and leaves *cp alone: overlong
  // forms, surrogates, values past U+10FFFF, stray continuation bytes and
  // sequences cut short.
  cp = 7;
  for (absl::string_view bad :
       {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80",
        "\xF5\x80\x80\x80", "\x80", "\xFF", "\xE2\x82"}) {
    EXPECT_EQ(DecodeUtf8StrictAt(bad, 0, &cp), 0u) << absl::CHexEscape(bad);
  }
  EXPECT_EQ(cp, 7u);
}

std::vector<std::string> Split(absl::string_view text,
                               std::vector<PreTokenizerRule> rules) {
  return PreTokenize(text, rules);
}

TEST(PreTokenizeTest, Gpt2) {
  const std::vector<PreTokenizerRule> gpt2 = {PreTokenizerRule::kGpt2};
  EXPECT_THAT(Split("Hello world's  end 123abc!!  \n", gpt2),
              ElementsAre("Hello", " world", "'s", " ", " end", " 123", "abc",
                          "!!", "  \n"));
  // Contractions are case-sensitive here.
  EXPECT_THAT(Split("WE'VE we've", gpt2),
              ElementsAre("WE", "'", "VE", " we", "'ve"));
  // Only a space may lead a word; other whitespace stands alone.
  EXPECT_THAT(Split("a\t\tb", gpt2), ElementsAre("a", "\t", "\t", "b"));
  EXPECT_THAT(Split("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 42", gpt2),
              ElementsAre("caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC", " 42"));
  EXPECT_THAT(Split("", gpt2), ElementsAre());
}

TEST(PreTokenizeTest, Llama3AndQwen2) {
  EXPECT_THAT(Split("Hello world's 12345 x\n\n y", {PreTokenizerRule::kLlama3}),
              ElementsAre("Hello", " world", "'s", " ", "123", "45", " x",
                          "\n\n", " y"));
  EXPECT_THAT(Split("WE'VE (ok)\n", {PreTokenizerRule::kLlama3}),
              ElementsAre("WE", "'VE", " (", "ok", ")\n"));
  EXPECT_THAT(
      Split("Hello world's 12345", {PreTokenizerRule::kQwen2}),
      ElementsAre("Hello", " world", "'s", " ", "1", "2", "3", "4", "5"));
  // Qwen3.5 keeps combining marks with the letters; Qwen2 does not.
  EXPECT_THAT(Split("e\xCC\x81t\xCC\x81", {PreTokenizerRule::kQwen35}),
              ElementsAre("e\xCC\x81t\xCC\x81"));
  EXPECT_THAT(Split("e\xCC\x81t", {PreTokenizerRule::kQwen2}),
              ElementsAre("e", "\xCC\x81t"));
}

TEST(PreTokenizeTest, SmolLmIsolatesDigits) {
  EXPECT_THAT(Split("a 12 b2", {PreTokenizerRule::kIsolateNumbers,
                                PreTokenizerRule::kGpt2}),
              ElementsAre("a", " ", "1", "2", " b", "2"));
}

TEST(PreTokenizeTest, DefaultRules) {
  const std::vector<PreTokenizerRule> rules = {
      PreTokenizerRule::kPunctuationRuns, PreTokenizerRule::kGpt2,
      PreTokenizerRule::kNumberRuns, PreTokenizerRule::kAsciiDigitTriples};
  EXPECT_THAT(
      Split("Hello!!! 1234567 $x", rules),
      ElementsAre("Hello", "!!!", " ", "123", "456", "7", " ", "$", "x"));
  // The backtick is not in the default punctuation class, but is in
  // Falcon's.
  EXPECT_THAT(Split("a`b", {PreTokenizerRule::kPunctuationRuns}),
              ElementsAre("a`b"));
  EXPECT_THAT(Split("a`b", {PreTokenizerRule::kPunctuationRunsWithBacktick}),
              ElementsAre("a", "`", "b"));
  EXPECT_THAT(Split("x\n\ny", {PreTokenizerRule::kNewlineRuns}),
              ElementsAre("x", "\n\n", "y"));
}

TEST(PreTokenizeTest, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_THAT(Split("a\xFF", {PreTokenizerRule::kGpt2}),
              ElementsAre("a", "\xEF\xBF\xBD"));
}

}  // namespace
}  // namespace pdserve::model
