// model/tokenizer.h against goldens produced by llama.cpp itself
// (tools/gen_tokenizer_goldens.py -> model/testdata/*_golden.json). The
// goldens that need the default model skip when PDSERVE_DEFAULT_MODEL is
// unset; the SentencePiece golden carries its own vocabulary and always
// runs.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/default_model.h"
#include "model/gguf.h"
#include "model/gguf_types.h"
#include "model/testing/golden_json.h"
#include "model/testing/tokenizer_fixtures.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace pdserve::model {
namespace {

using ::testing::ElementsAreArray;
using tokenizer_fixtures::CheckRandomStreams;
using tokenizer_fixtures::Floats;
using tokenizer_fixtures::Hex;
using tokenizer_fixtures::Ints;
using tokenizer_fixtures::LoadFromMetadata;
using tokenizer_fixtures::Stream;
using tokenizer_fixtures::Strings;

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
  const std::string path = FindDefaultModel();
  if (path.empty()) GTEST_SKIP() << kNoDefaultModel;
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
  const std::string path = FindDefaultModel();
  if (path.empty()) GTEST_SKIP() << kNoDefaultModel;
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
