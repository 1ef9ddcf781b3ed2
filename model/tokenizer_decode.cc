// Token ids -> text (llama_token_to_piece, llama_detokenize), whole or as
// a stream (IncrementalDetokenizer), with llama.cpp's space clean-up.
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace pdserve::model {
namespace {

using tokenizer_internal::kAttrHidden;

// llama.cpp's space clean-up after detokenizing (the three passes of
// llama_vocab::impl::detokenize), done in place with the same reads and
// writes so that even its corner cases agree.
void CleanSpaces(std::string* s) {
  if (s->empty()) return;
  char* t = s->data();
  size_t n = s->size();
  // " ?", " !", " .", " ," lose the space.
  size_t w = 1;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) {
      --w;
    }
    t[w++] = x;
  }
  n = w;
  // " ' " becomes "'".
  w = 1;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --w;
      t[++i] = '\0';
    }
    t[w++] = x;
  }
  n = w;
  // " 's", " 'm", " 're", " 've" lose the space.
  w = 1;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --w;
      } else if (i + 2 < n) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --w;
      }
    }
    t[w++] = x;
  }
  s->resize(w);
}

}  // namespace

absl::string_view Tokenizer::PieceForDetokenize(TokenId id,
                                                bool unparse_special) const {
  if (id < 0 || id >= vocab_size()) return {};
  const Token& token = tokens_[id];
  if (!unparse_special && (token.attr & kAttrHidden)) return {};
  return token.piece;
}

absl::StatusOr<std::string> Tokenizer::TokenToPiece(TokenId id,
                                                    bool render_special) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " out of range [0, ", vocab_size(), ")"));
  }
  return std::string(PieceForDetokenize(id, render_special));
}

std::string Tokenizer::Detokenize(absl::Span<const TokenId> ids,
                                  bool remove_special,
                                  bool unparse_special) const {
  bool strip_space = add_space_prefix_;
  if (remove_special && add_bos_ && !ids.empty() && ids.front() == bos_id_) {
    strip_space = false;
    ids.remove_prefix(1);
  }
  if (remove_special && add_eos_ && !ids.empty() && ids.back() == eos_id_) {
    ids.remove_suffix(1);
  }
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::string_view piece = PieceForDetokenize(ids[i], unparse_special);
    if (i == 0 && strip_space && absl::StartsWith(piece, " ")) {
      piece.remove_prefix(1);
    }
    text.append(piece.data(), piece.size());
  }
  if (clean_spaces_) CleanSpaces(&text);
  return text;
}

// ---- IncrementalDetokenizer ------------------------------------------------

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               bool remove_special,
                                               bool unparse_special,
                                               bool continues_text)
    : tokenizer_(tokenizer),
      remove_special_(remove_special),
      unparse_special_(unparse_special),
      continues_text_(continues_text),
      strip_next_space_(tokenizer.add_space_prefix_ && !continues_text) {}

void IncrementalDetokenizer::Append(TokenId id) {
  absl::string_view piece = tokenizer_.PieceForDetokenize(id, unparse_special_);
  if (!first_piece_done_) {
    first_piece_done_ = true;
    if (strip_next_space_ && absl::StartsWith(piece, " ")) {
      piece.remove_prefix(1);
    }
  }
  raw_.append(piece.data(), piece.size());
}

std::string IncrementalDetokenizer::Add(TokenId id) {
  const Tokenizer& t = tokenizer_;
  const size_t index = tokens_seen_++;
  if (index == 0 && remove_special_ && t.add_bos_ && id == t.bos_id_) {
    strip_next_space_ = false;
    return "";
  }
  if (eos_held_) {
    eos_held_ = false;
    Append(t.eos_id_);
  }
  // Detokenize drops a trailing EOS, so an EOS waits until it is known not
  // to be the last token.
  if (remove_special_ && t.add_eos_ && id == t.eos_id_) {
    eos_held_ = true;
  } else {
    Append(id);
  }
  return Drain(/*final=*/false);
}

std::string IncrementalDetokenizer::Finish() {
  std::string out = Drain(/*final=*/true);
  tokens_seen_ = 0;
  strip_next_space_ = tokenizer_.add_space_prefix_ && !continues_text_;
  first_piece_done_ = false;
  eos_held_ = false;
  raw_.clear();
  utf8_.clear();
  return out;
}

std::string IncrementalDetokenizer::Drain(bool final) {
  // The clean-up looks at most three bytes around a space, so text up to a
  // point preceded by three non-space bytes cleans up the same whatever
  // follows (and the bytes before an earlier cut were non-space too).
  size_t cut = raw_.size();
  if (tokenizer_.clean_spaces_ && !final) {
    while (cut > 0) {
      bool settled = true;
      for (size_t k = 1; k <= 3 && k <= cut; ++k) {
        if (raw_[cut - k] == ' ') {
          settled = false;
          cut -= k;
          break;
        }
      }
      if (settled) break;
    }
  }
  std::string settled = raw_.substr(0, cut);
  raw_.erase(0, cut);
  if (tokenizer_.clean_spaces_) CleanSpaces(&settled);
  utf8_ += settled;
  const size_t keep = final ? 0 : IncompleteUtf8SuffixLength(utf8_);
  std::string out =
      SanitizeUtf8(absl::string_view(utf8_).substr(0, utf8_.size() - keep));
  utf8_.erase(0, utf8_.size() - keep);
  return out;
}

}  // namespace pdserve::model
