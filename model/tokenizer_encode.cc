// Text -> token ids (llama_tokenize): special tokens split off first, then
// byte-level BPE merges by rank over each pre-tokenized word, or
// SentencePiece merges by score with byte fallback.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace pdserve::model {
namespace {

using tokenizer_internal::kAttrHidden;
using tokenizer_internal::kAttrLstrip;
using tokenizer_internal::kAttrRstrip;
using tokenizer_internal::kSpmSpace;
using tokenizer_internal::MergeKey;

// C isspace in the "C" locale, as llama.cpp's lstrip / rstrip use it.
bool IsCSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// A symbol of the BPE / SPM merge loops: a stretch of the word, linked to
// its neighbours; length 0 once merged into its left neighbour.
struct Symbol {
  int prev;
  int next;
  size_t offset;
  size_t length;
  TokenId id;  // BPE only
};

struct BpeBigram {
  int32_t rank;
  int left;
  int right;
  size_t length;
  TokenId result;
};

struct BpeBigramLater {
  bool operator()(const BpeBigram& a, const BpeBigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

struct SpmBigram {
  float score;
  int left;
  int right;
  size_t length;
};

struct SpmBigramLater {
  bool operator()(const SpmBigram& a, const SpmBigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

// Links `symbols` as a chain in order.
void LinkSymbols(std::vector<Symbol>* symbols) {
  const int n = static_cast<int>(symbols->size());
  for (int i = 0; i < n; ++i) {
    (*symbols)[i].prev = i - 1;
    (*symbols)[i].next = i + 1 < n ? i + 1 : -1;
  }
}

// Merges symbol `right` into `left`.
void MergeSymbols(std::vector<Symbol>* symbols, int left, int right) {
  Symbol& l = (*symbols)[left];
  Symbol& r = (*symbols)[right];
  l.length += r.length;
  r.length = 0;
  l.next = r.next;
  if (r.next >= 0) (*symbols)[r.next].prev = left;
}

}  // namespace

std::vector<Tokenizer::Fragment> Tokenizer::PartitionSpecial(
    absl::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({kNoToken, 0, text.size()});
  std::vector<Fragment> next;
  // Each special token in turn splits every remaining text fragment at all
  // its occurrences, longest tokens first (llama.cpp's
  // tokenizer_st_partition).
  for (TokenId special : special_tokens_) {
    const Token& token = tokens_[special];
    // User-defined tokens are split off even without parse_special.
    if (!parse_special && (token.attr & kAttrHidden)) continue;
    const absl::string_view needle = token.text;
    next.clear();
    bool changed = false;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t begin = f.offset;
      size_t end = f.offset + f.length;
      while (true) {
        const size_t match = text.substr(0, end).find(needle, begin);
        if (match == absl::string_view::npos) {
          if (end > begin) next.push_back({kNoToken, begin, end - begin});
          break;
        }
        changed = true;
        size_t left_end = match;
        if (token.attr & kAttrLstrip) {
          while (left_end > begin && IsCSpace(text[left_end - 1])) --left_end;
        }
        if (left_end > begin)
          next.push_back({kNoToken, begin, left_end - begin});
        next.push_back({special, match, needle.size()});
        begin = match + needle.size();
        if (token.attr & kAttrRstrip) {
          while (begin < end && IsCSpace(text[begin])) ++begin;
        }
        if (begin >= end) break;
      }
    }
    if (changed) fragments.swap(next);
  }
  return fragments;
}

std::vector<TokenId> Tokenizer::Encode(absl::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<TokenId> out;
  const std::vector<Fragment> fragments = PartitionSpecial(text, parse_special);
  if (add_special && add_bos_ && bos_id_ != kNoToken) out.push_back(bos_id_);
  if (type_ == Type::kSpm) {
    bool after_special = true;
    std::string escaped;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      escaped.clear();
      if (add_space_prefix_ && after_special) escaped = kSpmSpace;
      for (char c : text.substr(f.offset, f.length)) {
        if (c == ' ') {
          escaped += kSpmSpace;
        } else {
          escaped += c;
        }
      }
      EncodeSpm(escaped, &out);
      after_special = false;
    }
  } else {
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        EncodeBpe(text.substr(f.offset, f.length), &out);
      }
    }
  }
  if (add_special && add_eos_ && eos_id_ != kNoToken) out.push_back(eos_id_);
  return out;
}

void Tokenizer::EncodeBpe(absl::string_view text,
                          std::vector<TokenId>* out) const {
  for (const std::string& word : PreTokenize(text, pre_rules_)) {
    EncodeBpeWord(word, out);
  }
}

void Tokenizer::EncodeBpeWord(absl::string_view word,
                              std::vector<TokenId>* out) const {
  if (ignore_merges_) {
    std::string encoded;
    for (char c : word) encoded += ByteToUnicodeUtf8(static_cast<uint8_t>(c));
    const TokenId id = Find(encoded);
    if (id != kNoToken) {
      out->push_back(id);
      return;
    }
  }
  // One symbol per byte: each byte is one character of the byte-level
  // alphabet.
  if (word.empty()) return;
  std::vector<Symbol> symbols(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    symbols[i].offset = i;
    symbols[i].length = 1;
    symbols[i].id = byte_tokens_[static_cast<uint8_t>(word[i])];
  }
  LinkSymbols(&symbols);
  std::priority_queue<BpeBigram, std::vector<BpeBigram>, BpeBigramLater> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    if (l.id == kNoToken || r.id == kNoToken) return;
    auto it = merges_.find(MergeKey(l.id, r.id));
    if (it == merges_.end()) return;
    queue.push(
        {it->second.rank, left, right, l.length + r.length, it->second.result});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const BpeBigram bigram = queue.top();
    queue.pop();
    Symbol& l = symbols[bigram.left];
    const Symbol& r = symbols[bigram.right];
    // Symbols only grow, so an unchanged total length means both are
    // still what the bigram was made of.
    if (l.length == 0 || r.length == 0 ||
        l.length + r.length != bigram.length) {
      continue;
    }
    MergeSymbols(&symbols, bigram.left, bigram.right);
    l.id = bigram.result;
    try_add(l.prev, bigram.left);
    try_add(bigram.left, l.next);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id != kNoToken) {
      out->push_back(s.id);
      continue;
    }
    // Not a token: llama.cpp looks up each byte of the symbol's byte-level
    // spelling as a one-character token and drops the bytes that are not.
    for (size_t k = s.offset; k < s.offset + s.length; ++k) {
      for (char c : ByteToUnicodeUtf8(static_cast<uint8_t>(word[k]))) {
        const TokenId id = Find(absl::string_view(&c, 1));
        if (id != kNoToken) out->push_back(id);
      }
    }
  }
}

void Tokenizer::EncodeSpm(absl::string_view text,
                          std::vector<TokenId>* out) const {
  if (text.empty()) return;
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < text.size();) {
    const size_t length =
        std::min(Utf8SequenceLength(static_cast<uint8_t>(text[offset])),
                 text.size() - offset);
    symbols.push_back({0, 0, offset, length, kNoToken});
    offset += length;
  }
  LinkSymbols(&symbols);
  std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmBigramLater> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t length = symbols[left].length + symbols[right].length;
    const TokenId id = Find(text.substr(symbols[left].offset, length));
    if (id == kNoToken) return;
    queue.push({tokens_[id].score, left, right, length});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const SpmBigram bigram = queue.top();
    queue.pop();
    const Symbol& l = symbols[bigram.left];
    const Symbol& r = symbols[bigram.right];
    if (l.length == 0 || r.length == 0 ||
        l.length + r.length != bigram.length) {
      continue;
    }
    MergeSymbols(&symbols, bigram.left, bigram.right);
    try_add(symbols[bigram.left].prev, bigram.left);
    try_add(bigram.left, symbols[bigram.left].next);
  }
  // Merges only ever form vocabulary tokens, so a symbol that is not one is
  // a single character: spelled with byte tokens.
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const absl::string_view piece = text.substr(s.offset, s.length);
    const TokenId id = Find(piece);
    if (id != kNoToken) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      // llama.cpp throws when a byte has no token; fall back to UNK.
      const TokenId byte = byte_tokens_[static_cast<uint8_t>(c)];
      if (byte != kNoToken) {
        out->push_back(byte);
      } else if (unk_id_ != kNoToken) {
        out->push_back(unk_id_);
      }
    }
  }
}

}  // namespace pdserve::model
