// Tests of model/unicode.h and model/tokenizer.h.
//
// Expectations come from two independent sources: hand-derived ones written
// here (byte mapping, categories, splits, small vocabularies), and goldens
// produced by llama.cpp itself (tools/gen_tokenizer_goldens.py ->
// model/testdata/*_golden.json). The goldens that need the default model
// skip when PDSERVE_DEFAULT_MODEL is unset; the SentencePiece golden carries
// its own vocabulary and always runs.
#include "model/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/gguf_types.h"
#include "model/gguf_writer.h"
#include "model/testing/golden_json.h"
#include "model/unicode.h"

namespace pdserve::model {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using golden::Json;

// The golden `name` under model/testdata (relative to the workspace root,
// which is the working directory of bazel test and of a manual run).
std::optional<Json> LoadGolden(absl::string_view name) {
  const std::string path = absl::StrCat("model/testdata/", name);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return std::nullopt;
  }
  in.close();
  std::optional<Json> json = golden::LoadGoldenJson(path);
  if (!json) ADD_FAILURE() << "bad JSON in " << path;
  return json;
}

// ---------------------------------------------------------------------------
// Helpers.

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "/tokenizer_test_", ::getpid(), "_",
                      name);
}

const char* DefaultModel() {
  const char* path = std::getenv("PDSERVE_DEFAULT_MODEL");
  if (path == nullptr || access(path, R_OK) != 0) return nullptr;
  return path;
}

// Writes `metadata` (and general.architecture = llama) to a GGUF file and
// loads a Tokenizer from it.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromMetadata(
    absl::string_view name,
    std::vector<std::pair<std::string, GgufValue>> metadata,
    std::string* path_out = nullptr) {
  auto writer = GgufWriter::Create();
  if (!writer.ok()) return writer.status();
  absl::Status status =
      (*writer)->AddMetadata("general.architecture", std::string("llama"));
  for (auto& [key, value] : metadata) {
    if (status.ok()) status = (*writer)->AddMetadata(key, std::move(value));
  }
  const std::string path = TempPath(absl::StrCat(name, ".gguf"));
  if (status.ok()) status = (*writer)->WriteFile(path);
  if (!status.ok()) return status;
  if (path_out != nullptr) *path_out = path;
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(**file);
}

GgufValue Strings(std::vector<std::string> v) {
  return GgufValue(GgufArray(std::move(v)));
}
GgufValue Ints(std::vector<int32_t> v) {
  return GgufValue(GgufArray(std::move(v)));
}
GgufValue Floats(std::vector<float> v) {
  return GgufValue(GgufArray(std::move(v)));
}

std::string Utf8(uint32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

std::string Hex(absl::string_view bytes) {
  return absl::BytesToHexString(bytes);
}

// ---------------------------------------------------------------------------
// A byte-level BPE vocabulary written by hand:
//   ids 0..255   the byte-level characters, id b standing for byte b;
//   256 "<|endoftext|>" (control), 257.. merged tokens (kMerged below).
// Merges in rank order: h e, l l, he ll, hell o, Ġ w, o r, Ġw or, l d,
// Ġwor ld, b c, a b.
constexpr TokenId kEndOfText = 256;
constexpr TokenId kHe = 257, kLl = 258, kHell = 259, kHello = 260,
                  kSpaceW = 261, kOr = 262, kSpaceWor = 263, kLd = 264,
                  kSpaceWorld = 265, kAb = 266, kBc = 267, kBos = 268;

std::vector<std::pair<std::string, GgufValue>> TinyBpeMetadata(
    const std::string& pre) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(ByteToUnicodeUtf8(static_cast<uint8_t>(b)));
    types.push_back(1);
  }
  const std::string g = Utf8(0x120);  // the byte-level space, "Ġ"
  for (const std::string& t :
       {std::string("<|endoftext|>"), std::string("he"), std::string("ll"),
        std::string("hell"), std::string("hello"), g + "w", std::string("or"),
        g + "wor", std::string("ld"), g + "world", std::string("ab"),
        std::string("bc"), std::string("<s>")}) {
    tokens.push_back(t);
    types.push_back(t[0] == '<' ? 3 : 1);
  }
  std::vector<std::string> merges = {"h e",        "l l", "he ll",    "hell o",
                                     g + " w",     "o r", g + "w or", "l d",
                                     g + "wor ld", "b c", "a b"};
  return {{"tokenizer.ggml.model", std::string("gpt2")},
          {"tokenizer.ggml.pre", pre},
          {"tokenizer.ggml.tokens", Strings(tokens)},
          {"tokenizer.ggml.token_type", Ints(types)},
          {"tokenizer.ggml.merges", Strings(merges)},
          {"tokenizer.ggml.bos_token_id", uint32_t{kBos}},
          {"tokenizer.ggml.eos_token_id", uint32_t{kEndOfText}}};
}

std::unique_ptr<Tokenizer> TinyBpe(
    const std::string& pre,
    std::vector<std::pair<std::string, GgufValue>> extra = {}) {
  auto metadata = TinyBpeMetadata(pre);
  for (auto& kv : extra) metadata.push_back(std::move(kv));
  auto t = LoadFromMetadata(absl::StrCat("tiny_", pre), std::move(metadata));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// ---------------------------------------------------------------------------
// Unicode.

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

// ---------------------------------------------------------------------------
// Tokenizer on hand-written vocabularies.

TEST(TokenizerTest, TinyBpeMerges) {
  auto t = TinyBpe("gpt-2");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type(), Tokenizer::Type::kBpe);
  EXPECT_EQ(t->vocab_size(), 269);
  EXPECT_THAT(t->Encode("hello world", false, false),
              ElementsAre(kHello, kSpaceWorld));
  EXPECT_THAT(t->Encode("hellohello", false, false),
              ElementsAre(kHello, kHello));
  // "he" has no merge with "l" alone: h e l -> he, l.
  EXPECT_THAT(t->Encode("hel", false, false), ElementsAre(kHe, 'l'));
  // b c (rank 9) beats a b (rank 10).
  EXPECT_THAT(t->Encode("abc", false, false), ElementsAre('a', kBc));
  EXPECT_THAT(t->Encode("ab", false, false), ElementsAre(kAb));
  EXPECT_THAT(t->Encode("old", false, false), ElementsAre('o', kLd));
  // Bytes of non-ASCII text come out as the byte tokens.
  EXPECT_THAT(t->Encode("\xC3\xA9", false, false), ElementsAre(0xC3, 0xA9));
  EXPECT_THAT(t->Encode("", false, false), ElementsAre());
  (void)kLl;
  (void)kHell;
  (void)kSpaceW;
  (void)kOr;
  (void)kSpaceWor;
}

TEST(TokenizerTest, TinyBpeSpecialTokens) {
  auto t = TinyBpe("gpt-2");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->bos_id(), kBos);
  EXPECT_EQ(t->eos_id(), kEndOfText);
  EXPECT_FALSE(t->add_bos());  // gpt2 default
  EXPECT_FALSE(t->add_eos());
  EXPECT_TRUE(t->IsControl(kEndOfText));
  EXPECT_FALSE(t->IsControl(kHello));
  EXPECT_TRUE(t->IsEndOfGeneration(kEndOfText));
  EXPECT_FALSE(t->IsEndOfGeneration(kBos));
  // "<|endoftext|>" also becomes EOT by its text.
  EXPECT_EQ(t->eot_id(), kEndOfText);
  EXPECT_THAT(t->end_of_generation_ids(), ElementsAre(kEndOfText));
  EXPECT_THAT(t->Encode("hello<|endoftext|>", false, true),
              ElementsAre(kHello, kEndOfText));
  // Without parse_special the text is tokenized as text.
  const std::vector<TokenId> plain = t->Encode("<|endoftext|>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kEndOfText), 0);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(t->Detokenize(plain, false, false), "<|endoftext|>");

  auto with_bos = TinyBpe("gpt-2", {{"tokenizer.ggml.add_bos_token", true},
                                    {"tokenizer.ggml.add_eos_token", true}});
  ASSERT_NE(with_bos, nullptr);
  EXPECT_THAT(with_bos->Encode("ab", true, false),
              ElementsAre(kBos, kAb, kEndOfText));
  EXPECT_THAT(with_bos->Encode("ab", false, false), ElementsAre(kAb));
  EXPECT_THAT(with_bos->Encode("", true, false), ElementsAre(kBos, kEndOfText));
}

TEST(TokenizerTest, TinyBpeDecoding) {
  auto t = TinyBpe("gpt-2");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->TokenToPiece(kSpaceWorld, false), " world");
  EXPECT_EQ(*t->TokenToPiece(' ', false), " ");
  EXPECT_EQ(*t->TokenToPiece('\n', false), "\n");
  EXPECT_EQ(*t->TokenToPiece(0xC3, false), "\xC3");
  EXPECT_EQ(*t->TokenToPiece(kEndOfText, false), "");
  EXPECT_EQ(*t->TokenToPiece(kEndOfText, true), "<|endoftext|>");
  EXPECT_EQ(t->token_text(kSpaceWorld), Utf8(0x120) + "world");
  EXPECT_EQ(*t->TokenIdOf("hello"), kHello);
  EXPECT_EQ(t->TokenIdOf("nope").status().code(), absl::StatusCode::kNotFound);

  // Bad ids: an error from TokenToPiece, nothing from Detokenize.
  for (TokenId bad : {-1, 269, 1 << 30}) {
    auto piece = t->TokenToPiece(bad, true);
    EXPECT_EQ(piece.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(piece.status().message()), HasSubstr("out of"));
    EXPECT_FALSE(t->IsControl(bad));
    EXPECT_FALSE(t->IsEndOfGeneration(bad));
    EXPECT_EQ(t->token_text(bad), "");
  }
  EXPECT_EQ(t->Detokenize({kHello, -5, kSpaceWorld, 100000}, false, false),
            "hello world");

  EXPECT_EQ(t->Detokenize({kHello, kEndOfText}, false, false), "hello");
  EXPECT_EQ(t->Detokenize({kHello, kEndOfText}, false, true),
            "hello<|endoftext|>");
  // gpt-2 cleans up spaces: " ?" -> "?", " 's" -> "'s", " ' " -> "'".
  EXPECT_EQ(t->Detokenize({'a', ' ', '?', ' ', '\'', 's', ' ', '\'', ' ', 'b'},
                          false, false),
            "a?'s'b");
}

TEST(TokenizerTest, SmolLmStyleKeepsSpaces) {
  auto t = TinyBpe("smollm");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Detokenize({'a', ' ', '?'}, false, false), "a ?");
  EXPECT_THAT(t->Encode("a12", false, false), ElementsAre('a', '1', '2'));
}

TEST(TokenizerTest, PreTokenizerNames) {
  const std::vector<std::string> names = Tokenizer::PreTokenizerNames();
  for (const char* name : {"default", "gpt-2", "llama-bpe", "llama3", "qwen2",
                           "smollm", "starcoder", "falcon", "qwen35"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
}

TEST(TokenizerTest, AbsentPreMeansDefault) {
  auto metadata = TinyBpeMetadata("unused");
  metadata.erase(metadata.begin() + 1);  // tokenizer.ggml.pre
  auto t = LoadFromMetadata("no_pre", std::move(metadata));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->pre(), "default");
}

TEST(TokenizerTest, SentencePieceByHand) {
  // <unk> <s> </s> <0x00>..<0xFF>, then ▁ h i ▁h hi ▁i.
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
  }
  const std::string sp = "\xE2\x96\x81";
  for (const std::string& s : {sp, std::string("h"), std::string("i"), sp + "h",
                               std::string("hi"), sp + "i"}) {
    tokens.push_back(s);
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  const TokenId kSp = 259, kSpH = 262, kHi = 263, kSpI = 264;
  scores[kSpH] = -1.0f;
  scores[kHi] = -0.5f;  // "hi" merges before "▁h"
  scores[kSpI] = -3.0f;
  auto t = LoadFromMetadata("spm_hand",
                            {{"tokenizer.ggml.model", std::string("llama")},
                             {"tokenizer.ggml.tokens", Strings(tokens)},
                             {"tokenizer.ggml.scores", Floats(scores)},
                             {"tokenizer.ggml.token_type", Ints(types)}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->type(), Tokenizer::Type::kSpm);
  EXPECT_EQ((*t)->bos_id(), 1);  // SentencePiece defaults
  EXPECT_EQ((*t)->eos_id(), 2);
  EXPECT_EQ((*t)->unk_id(), 0);
  EXPECT_TRUE((*t)->add_bos());
  EXPECT_TRUE((*t)->add_space_prefix());
  // "▁hi": h i merges first (score -0.5 beats -1), and "▁hi" is no token.
  EXPECT_THAT((*t)->Encode("hi", true, false), ElementsAre(1, kSp, kHi));
  // "x" is not a piece: byte fallback.
  EXPECT_THAT((*t)->Encode("hx", false, false), ElementsAre(kSpH, 3 + 'x'));
  EXPECT_THAT((*t)->Encode("i i", false, false), ElementsAre(kSpI, kSpI));
  EXPECT_EQ(*(*t)->TokenToPiece(kSpH, false), " h");
  // A stream that starts the text drops the first piece's space, as
  // Detokenize does; one that continues a prompt (model output) keeps it.
  IncrementalDetokenizer starts(**t, false, false);
  std::string started = starts.Add(kSpH);
  started += starts.Finish();
  EXPECT_EQ(started, "h");
  IncrementalDetokenizer continues(**t, false, false, /*continues_text=*/true);
  std::string continued = continues.Add(kSpH);
  continued += continues.Add(kSpI);
  continued += continues.Finish();
  EXPECT_EQ(continued, " h i");
  EXPECT_EQ(*(*t)->TokenToPiece(3 + 0x0A, false), "\n");
  // The first piece loses its leading space; a BOS first (rendered or
  // removed) keeps the space of the piece after it, as in llama.cpp.
  EXPECT_EQ((*t)->Detokenize({kSp, kHi}, false, false), "hi");
  EXPECT_EQ((*t)->Detokenize({kSpH, kSpI}, false, false), "h i");
  EXPECT_EQ((*t)->Detokenize({1, kSp, kHi}, false, false), " hi");
  EXPECT_EQ((*t)->Detokenize({1, kSp, kHi}, true, false), " hi");
  EXPECT_EQ((*t)->Detokenize({1, kSp, kHi}, false, true), "<s> hi");
}

// ---------------------------------------------------------------------------
// Loading errors.

struct ErrorCase {
  const char* name;
  std::function<void(std::vector<std::pair<std::string, GgufValue>>*)> edit;
  std::vector<std::string> words;
};

void SetKey(std::vector<std::pair<std::string, GgufValue>>* m,
            const std::string& key, GgufValue value) {
  for (auto& [k, v] : *m) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  m->emplace_back(key, std::move(value));
}

void EraseKey(std::vector<std::pair<std::string, GgufValue>>* m,
              const std::string& key) {
  m->erase(std::remove_if(m->begin(), m->end(),
                          [&](const auto& kv) { return kv.first == key; }),
           m->end());
}

TEST(TokenizerTest, LoadErrorsNameKeyAndFile) {
  const std::vector<ErrorCase> cases = {
      {"unknown_pre",
       [](auto* m) { SetKey(m, "tokenizer.ggml.pre", std::string("bogus")); },
       {"bogus", "tokenizer.ggml.pre"}},
      {"unknown_model",
       [](auto* m) { SetKey(m, "tokenizer.ggml.model", std::string("bert")); },
       {"bert", "tokenizer.ggml.model"}},
      {"no_model",
       [](auto* m) { EraseKey(m, "tokenizer.ggml.model"); },
       {"tokenizer.ggml.model", "missing"}},
      {"no_tokens",
       [](auto* m) { EraseKey(m, "tokenizer.ggml.tokens"); },
       {"tokenizer.ggml.tokens", "missing"}},
      {"tokens_not_strings",
       [](auto* m) {
         SetKey(m, "tokenizer.ggml.tokens", Ints({1, 2}));
       },
       {"tokenizer.ggml.tokens", "array[string]"}},
      {"tokens_not_array",
       [](auto* m) { SetKey(m, "tokenizer.ggml.tokens", std::string("x")); },
       {"tokenizer.ggml.tokens"}},
      {"no_merges",
       [](auto* m) { EraseKey(m, "tokenizer.ggml.merges"); },
       {"tokenizer.ggml.merges", "missing"}},
      {"merge_unknown_token",
       [](auto* m) {
         SetKey(m, "tokenizer.ggml.merges", Strings({"h e", "he zz"}));
       },
       {"tokenizer.ggml.merges", "merge 1", "zz", "unknown"}},
      {"merge_without_space",
       [](auto* m) { SetKey(m, "tokenizer.ggml.merges", Strings({"he"})); },
       {"tokenizer.ggml.merges", "'A B'"}},
      {"types_short",
       [](auto* m) {
         SetKey(m, "tokenizer.ggml.token_type", Ints({1, 1}));
       },
       {"tokenizer.ggml.token_type", "2 types"}},
      {"types_not_ints",
       [](auto* m) { SetKey(m, "tokenizer.ggml.token_type", Strings({"a"})); },
       {"tokenizer.ggml.token_type"}},
      {"scores_short",
       [](auto* m) { SetKey(m, "tokenizer.ggml.scores", Floats({0.5f})); },
       {"tokenizer.ggml.scores", "1 scores"}},
      {"scores_strings",
       [](auto* m) { SetKey(m, "tokenizer.ggml.scores", Strings({"a"})); },
       {"tokenizer.ggml.scores", "array[string]"}},
      {"bos_not_int",
       [](auto* m) {
         SetKey(m, "tokenizer.ggml.bos_token_id", std::string("1"));
       },
       {"tokenizer.ggml.bos_token_id"}},
      {"add_bos_not_bool",
       [](auto* m) { SetKey(m, "tokenizer.ggml.add_bos_token", uint32_t{1}); },
       {"tokenizer.ggml.add_bos_token"}},
      {"duplicate_tokens",
       [](auto* m) {
         SetKey(m, "tokenizer.ggml.tokens", Strings({"a", "b", "a"}));
         SetKey(m, "tokenizer.ggml.token_type", Ints({1, 1, 1}));
         SetKey(m, "tokenizer.ggml.merges", Strings({}));
       },
       {"duplicate", "ids 0 and 2"}},
      {"empty_vocab",
       [](auto* m) {
         SetKey(m, "tokenizer.ggml.tokens", Strings({}));
         SetKey(m, "tokenizer.ggml.token_type", Ints({}));
         SetKey(m, "tokenizer.ggml.merges", Strings({}));
       },
       {"tokenizer.ggml.tokens", "0 tokens"}},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto metadata = TinyBpeMetadata("gpt-2");
    c.edit(&metadata);
    std::string path;
    auto t = LoadFromMetadata(c.name, std::move(metadata), &path);
    ASSERT_FALSE(t.ok());
    const std::string message(t.status().message());
    for (const std::string& word : c.words) {
      EXPECT_THAT(message, HasSubstr(word));
    }
    EXPECT_THAT(message, HasSubstr(path));
  }
}

TEST(TokenizerTest, OutOfRangeSpecialIdKeepsDefault) {
  auto t = TinyBpe("gpt-2", {});
  ASSERT_NE(t, nullptr);
  auto metadata = TinyBpeMetadata("gpt-2");
  SetKey(&metadata, "tokenizer.ggml.bos_token_id", uint32_t{5000});
  SetKey(&metadata, "tokenizer.ggml.eos_token_id", uint32_t{5000});
  auto u = LoadFromMetadata("bad_bos", std::move(metadata));
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ((*u)->bos_id(), 11);  // llama.cpp's gpt2 default
  EXPECT_EQ((*u)->eos_id(), 11);
}

// ---------------------------------------------------------------------------
// Incremental detokenization.

std::string Stream(IncrementalDetokenizer* d, const std::vector<TokenId>& ids,
                   std::vector<std::string>* outputs = nullptr) {
  std::string all;
  for (TokenId id : ids) {
    std::string out = d->Add(id);
    EXPECT_TRUE(IsValidUtf8(out)) << Hex(out);
    if (outputs != nullptr) outputs->push_back(out);
    all += out;
  }
  std::string rest = d->Finish();
  EXPECT_TRUE(IsValidUtf8(rest)) << Hex(rest);
  if (outputs != nullptr) outputs->push_back(rest);
  return all + rest;
}

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

// Random streams: the concatenated output must equal the sanitized
// Detokenize of the whole sequence, whatever the flags.
void CheckRandomStreams(const Tokenizer& t, const std::vector<TokenId>& pool,
                        int rounds, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int round = 0; round < rounds; ++round) {
    std::vector<TokenId> ids(rng() % 24);
    for (TokenId& id : ids) id = pool[rng() % pool.size()];
    for (int flags = 0; flags < 4; ++flags) {
      const bool remove = flags & 1, unparse = flags & 2;
      IncrementalDetokenizer d(t, remove, unparse);
      const std::string streamed = Stream(&d, ids);
      ASSERT_EQ(Hex(streamed),
                Hex(SanitizeUtf8(t.Detokenize(ids, remove, unparse))))
          << "ids " << absl::StrJoin(ids, ",") << " remove " << remove
          << " unparse " << unparse;
    }
  }
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

// ---------------------------------------------------------------------------
// Goldens from llama.cpp.

std::string CaseText(const Json& c) {
  if (const Json* hex = c.Find("hex")) {
    return absl::HexStringToBytes(hex->string);
  }
  return c["text"].string;
}

// Checks one vocabulary against its golden cases, pieces and facts.
void CheckGolden(const Tokenizer& t, const Json& golden) {
  const Json& facts = golden["facts"];
  EXPECT_EQ(t.vocab_size(), facts["vocab_size"].Int());
  auto id_or_none = [](const Json& v) {
    return v.kind == Json::Kind::kNull ? kNoToken
                                       : static_cast<TokenId>(v.number);
  };
  EXPECT_EQ(t.bos_id(), id_or_none(facts["bos"]));
  EXPECT_EQ(t.eos_id(), id_or_none(facts["eos"]));
  EXPECT_EQ(t.eot_id(), id_or_none(facts["eot"]));
  EXPECT_EQ(t.add_bos(), facts["add_bos"].boolean);
  EXPECT_EQ(t.add_eos(), facts["add_eos"].boolean);
  EXPECT_THAT(t.end_of_generation_ids(), ElementsAreArray(facts["eog"].Ints()));
  if (const Json* control = facts.Find("control")) {
    std::vector<TokenId> ours;
    for (TokenId id = 0; id < t.vocab_size(); ++id) {
      if (t.IsControl(id)) ours.push_back(id);
    }
    EXPECT_THAT(ours, ElementsAreArray(control->Ints()));
  }
  for (const Json& c : golden["cases"].array) {
    const std::string text = CaseText(c);
    const bool add_special = c["add_special"].boolean;
    const bool parse_special = c["parse_special"].boolean;
    SCOPED_TRACE(absl::StrCat("text '", absl::CHexEscape(text),
                              "' add_special ", add_special, " parse_special ",
                              parse_special));
    const std::vector<TokenId> ids = t.Encode(text, add_special, parse_special);
    EXPECT_THAT(ids, ElementsAreArray(c["ids"].Ints()));
    const Json* ff = c.Find("detok_ff");
    const Json* tt = c.Find("detok_tt");
    const std::vector<TokenId> expected_ids = c["ids"].Ints();
    EXPECT_EQ(Hex(t.Detokenize(expected_ids, false, false)),
              ff ? ff->string : Hex(text));
    EXPECT_EQ(Hex(t.Detokenize(expected_ids, true, true)),
              tt ? tt->string : Hex(text));
  }
  if (const Json* pieces = golden.Find("pieces")) {
    for (const Json& p : pieces->array) {
      const TokenId id = static_cast<TokenId>(p["id"].number);
      const std::string& piece = p["piece"].string;
      const Json* special = p.Find("special_piece");
      EXPECT_EQ(Hex(*t.TokenToPiece(id, false)), piece) << "id " << id;
      EXPECT_EQ(Hex(*t.TokenToPiece(id, true)),
                special ? special->string : piece)
          << "id " << id;
    }
  }
}

TEST(TokenizerGoldenTest, SentencePiece) {
  std::optional<Json> golden = LoadGolden("spm_tokenizer_golden.json");
  ASSERT_TRUE(golden.has_value());
  const Json& vocab = (*golden)["vocab"];
  std::vector<std::string> tokens;
  for (const Json& s : vocab["tokens"].array) tokens.push_back(s.string);
  std::vector<float> scores;
  for (const Json& s : vocab["scores"].array) {
    scores.push_back(static_cast<float>(s.number));
  }
  ASSERT_FALSE((*golden)["variants"].array.empty());
  for (const Json& variant : (*golden)["variants"].array) {
    SCOPED_TRACE(variant["name"].string);
    std::vector<std::pair<std::string, GgufValue>> metadata = {
        {"tokenizer.ggml.model", std::string("llama")},
        {"tokenizer.ggml.tokens", Strings(tokens)},
        {"tokenizer.ggml.scores", Floats(scores)},
        {"tokenizer.ggml.token_type", Ints(vocab["token_types"].Ints())}};
    for (const auto& [key, value] : variant["metadata"].object) {
      if (value.kind == Json::Kind::kBool) {
        metadata.emplace_back(key, value.boolean);
      } else {
        metadata.emplace_back(key, static_cast<uint32_t>(value.number));
      }
    }
    auto t = LoadFromMetadata(variant["name"].string, std::move(metadata));
    ASSERT_TRUE(t.ok()) << t.status();
    CheckGolden(**t, variant);

    std::vector<TokenId> pool = {(*t)->bos_id(), (*t)->eos_id()};
    for (TokenId id = 0; id < (*t)->vocab_size(); id += 3) pool.push_back(id);
    CheckRandomStreams(**t, pool, 300, 2);
  }
}

TEST(TokenizerGoldenTest, DefaultModel) {
  const char* path = DefaultModel();
  if (path == nullptr) {
    GTEST_SKIP() << "PDSERVE_DEFAULT_MODEL not set or not readable";
  }
  std::optional<Json> golden = LoadGolden("smollm2_tokenizer_golden.json");
  ASSERT_TRUE(golden.has_value());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->pre(), "smollm");
  CheckGolden(**t, *golden);

  // Streaming the golden ids gives the detokenized text.
  for (const Json& c : (*golden)["cases"].array) {
    const std::vector<TokenId> ids = c["ids"].Ints();
    IncrementalDetokenizer d(**t, false, false);
    EXPECT_EQ(Hex(Stream(&d, ids)),
              Hex(SanitizeUtf8((*t)->Detokenize(ids, false, false))));
  }
  // A long prompt: a round trip, and quickly (no timing asserted).
  std::string long_text;
  for (int i = 0; i < 400; ++i) {
    absl::StrAppend(&long_text, "Paragraph ", i,
                    ": the quick brown fox, naïve café, 日本語, 😀 "
                    "def f(x): return x * 2\n");
  }
  const std::vector<TokenId> ids = (*t)->Encode(long_text, false, false);
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_EQ((*t)->Detokenize(ids, false, false), long_text);
}

TEST(TokenizerGoldenTest, PreTokenizerVariantsOfDefaultModel) {
  const char* path = DefaultModel();
  if (path == nullptr) {
    GTEST_SKIP() << "PDSERVE_DEFAULT_MODEL not set or not readable";
  }
  std::optional<Json> golden = LoadGolden("bpe_pretokenizers_golden.json");
  ASSERT_TRUE(golden.has_value());
  auto base = GgufFile::Open(path);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_FALSE((*golden)["variants"].array.empty());
  for (const Json& variant : (*golden)["variants"].array) {
    SCOPED_TRACE(variant["name"].string);
    // The default model's metadata with another pre-tokenizer, as the
    // generator derived it.
    std::set<std::string> drop = {"tokenizer.ggml.pre", "general.alignment",
                                  "general.architecture"};
    for (const Json& key : variant["drop_keys"].array) drop.insert(key.string);
    std::vector<std::pair<std::string, GgufValue>> metadata;
    for (const auto& [key, value] : (*base)->metadata()) {
      if (drop.count(key) == 0) metadata.emplace_back(key, value);
    }
    metadata.emplace_back("tokenizer.ggml.pre", variant["pre"].string);
    auto t = LoadFromMetadata(variant["name"].string, std::move(metadata));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->pre(), variant["pre"].string);
    CheckGolden(**t, variant);
  }
}

}  // namespace
}  // namespace pdserve::model
