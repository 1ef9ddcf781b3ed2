#include "model/testing/tokenizer_fixtures.h"

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/gguf_types.h"
#include "model/gguf_writer.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace pdserve::model::tokenizer_fixtures {
namespace {

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "/tokenizer_test_", ::getpid(), "_",
                      name);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromMetadata(
    absl::string_view name,
    std::vector<std::pair<std::string, GgufValue>> metadata,
    std::string* path_out) {
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
    std::vector<std::pair<std::string, GgufValue>> extra) {
  auto metadata = TinyBpeMetadata(pre);
  for (auto& kv : extra) metadata.push_back(std::move(kv));
  auto t = LoadFromMetadata(absl::StrCat("tiny_", pre), std::move(metadata));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::string Stream(IncrementalDetokenizer* d, const std::vector<TokenId>& ids,
                   std::vector<std::string>* outputs) {
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

}  // namespace pdserve::model::tokenizer_fixtures
