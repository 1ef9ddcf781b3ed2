// Tests of model/tokenizer.h on vocabularies written by hand: BPE merges,
// special tokens, decoding, SentencePiece, and the errors of loading.
#include "model/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf_types.h"
#include "model/testing/tokenizer_fixtures.h"

namespace pdserve::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tokenizer_fixtures::Floats;
using tokenizer_fixtures::Ints;
using tokenizer_fixtures::kAb;
using tokenizer_fixtures::kBc;
using tokenizer_fixtures::kBos;
using tokenizer_fixtures::kEndOfText;
using tokenizer_fixtures::kHe;
using tokenizer_fixtures::kHell;
using tokenizer_fixtures::kHello;
using tokenizer_fixtures::kLd;
using tokenizer_fixtures::kLl;
using tokenizer_fixtures::kOr;
using tokenizer_fixtures::kSpaceW;
using tokenizer_fixtures::kSpaceWor;
using tokenizer_fixtures::kSpaceWorld;
using tokenizer_fixtures::LoadFromMetadata;
using tokenizer_fixtures::Strings;
using tokenizer_fixtures::TinyBpe;
using tokenizer_fixtures::TinyBpeMetadata;
using tokenizer_fixtures::Utf8;

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

}  // namespace
}  // namespace pdserve::model
