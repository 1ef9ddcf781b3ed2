// Fixtures shared by the tokenizer tests (tokenizer_test,
// incremental_detokenizer_test, tokenizer_golden_test): vocabularies written
// into small GGUF files, a hand-made byte-level BPE vocabulary, and a check
// that streaming detokenization agrees with Detokenize. Test-only.
#ifndef PDSERVE_MODEL_TESTING_TOKENIZER_FIXTURES_H_
#define PDSERVE_MODEL_TESTING_TOKENIZER_FIXTURES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/gguf_types.h"
#include "model/tokenizer.h"

namespace pdserve::model::tokenizer_fixtures {

// Writes `metadata` (and general.architecture = llama) to a GGUF file named
// after `name` in the test's temporary directory and loads a Tokenizer from
// it; *path_out, when given, receives the file's path.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromMetadata(
    absl::string_view name,
    std::vector<std::pair<std::string, GgufValue>> metadata,
    std::string* path_out = nullptr);

// Array metadata values.
GgufValue Strings(std::vector<std::string> v);
GgufValue Ints(std::vector<int32_t> v);
GgufValue Floats(std::vector<float> v);

// The UTF-8 of `cp`.
std::string Utf8(uint32_t cp);
// Lower-case hex of `bytes`, for readable failures on binary text.
std::string Hex(absl::string_view bytes);

// A byte-level BPE vocabulary written by hand:
//   ids 0..255   the byte-level characters, id b standing for byte b;
//   256 "<|endoftext|>" (control), 257.. merged tokens (kMerged below).
// Merges in rank order: h e, l l, he ll, hell o, Ġ w, o r, Ġw or, l d,
// Ġwor ld, b c, a b.
inline constexpr TokenId kEndOfText = 256;
inline constexpr TokenId kHe = 257, kLl = 258, kHell = 259, kHello = 260,
                         kSpaceW = 261, kOr = 262, kSpaceWor = 263, kLd = 264,
                         kSpaceWorld = 265, kAb = 266, kBc = 267, kBos = 268;

// The metadata of that vocabulary with tokenizer.ggml.pre = `pre`.
std::vector<std::pair<std::string, GgufValue>> TinyBpeMetadata(
    const std::string& pre);
// That vocabulary loaded, with `extra` metadata added; null (after a test
// failure) when it does not load.
std::unique_ptr<Tokenizer> TinyBpe(
    const std::string& pre,
    std::vector<std::pair<std::string, GgufValue>> extra = {});

// Feeds `ids` to `d` and finishes the stream; returns everything it handed
// out, each piece checked to be valid UTF-8 and kept in *outputs when given
// (Finish's last).
std::string Stream(IncrementalDetokenizer* d, const std::vector<TokenId>& ids,
                   std::vector<std::string>* outputs = nullptr);

// Random streams drawn from `pool`: the concatenated output must equal the
// sanitized Detokenize of the whole sequence, whatever the flags.
void CheckRandomStreams(const Tokenizer& t, const std::vector<TokenId>& pool,
                        int rounds, uint32_t seed);

}  // namespace pdserve::model::tokenizer_fixtures

#endif  // PDSERVE_MODEL_TESTING_TOKENIZER_FIXTURES_H_
