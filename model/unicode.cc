#include "model/unicode.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pdserve::model {

namespace unicode_internal {
// Defined in the generated model/unicode_tables.cc.
extern const char kUnicodeVersion[];
extern const uint32_t kCategoryRanges[];
extern const size_t kCategoryRangesSize;
}  // namespace unicode_internal

namespace {

using unicode_internal::kCategoryRanges;
using unicode_internal::kCategoryRangesSize;

// ASCII categories are looked up on every character of typical text, so
// they get a direct table.
std::array<UnicodeCategory, 128> BuildAsciiCategories() {
  std::array<UnicodeCategory, 128> table{};
  size_t r = 0;
  for (uint32_t cp = 0; cp < 128; ++cp) {
    while (r + 1 < kCategoryRangesSize && (kCategoryRanges[r + 1] >> 3) <= cp) {
      ++r;
    }
    table[cp] = static_cast<UnicodeCategory>(kCategoryRanges[r] & 7);
  }
  return table;
}

const std::array<UnicodeCategory, 128>& AsciiCategories() {
  static const std::array<UnicodeCategory, 128> table = BuildAsciiCategories();
  return table;
}

struct ByteMapping {
  std::array<uint32_t, 256> to_unicode{};
  std::array<std::string, 256> to_utf8;
  // Indexed by code point; every mapped code point is below 0x144.
  std::array<int16_t, 0x144> to_byte{};
};

const ByteMapping& GetByteMapping() {
  static const ByteMapping* mapping = [] {
    auto* m = new ByteMapping;
    m->to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
             (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      m->to_unicode[b] = cp;
      AppendUtf8(cp, &m->to_utf8[b]);
      m->to_byte[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return *mapping;
}

// ---- Pre-tokenizer matching ------------------------------------------------

// Per code point: the category in the low 3 bits, kWhitespaceBit for \s.
constexpr uint8_t kWhitespaceBit = 0x08;

// Looks at code points [begin, end) of the text, one piece of the current
// split. Positions at or past `end` read as "nothing" (no category at all),
// which is how llama.cpp's matchers see the end of a piece.
class Piece {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFF;

  Piece(const std::vector<uint32_t>& cps, const std::vector<uint8_t>& info,
        size_t begin, size_t end)
      : cps_(cps), info_(info), end_(end), begin_(begin) {}

  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  bool Has(size_t i) const { return i < end_; }
  uint32_t Cp(size_t i) const { return Has(i) ? cps_[i] : kNone; }
  bool Letter(size_t i) const { return Is(i, UnicodeCategory::kLetter); }
  bool Number(size_t i) const { return Is(i, UnicodeCategory::kNumber); }
  bool Mark(size_t i) const { return Is(i, UnicodeCategory::kMark); }
  bool Space(size_t i) const {
    return Has(i) && (info_[i] & kWhitespaceBit) != 0;
  }
  bool CrLf(size_t i) const { return Cp(i) == '\r' || Cp(i) == '\n'; }

 private:
  bool Is(size_t i, UnicodeCategory c) const {
    return Has(i) && (info_[i] & 7) == static_cast<uint8_t>(c);
  }

  const std::vector<uint32_t>& cps_;
  const std::vector<uint8_t>& info_;
  size_t end_;
  size_t begin_;
};

uint32_t AsciiLower(uint32_t cp) {
  return (cp >= 'A' && cp <= 'Z') ? cp + ('a' - 'A') : cp;
}

// Length of an English contraction ('s 't 'm 'd 're 've 'll) at `pos`, or
// 0. Only the letters' case is optional, and only when `ignore_case`.
size_t ContractionLength(const Piece& p, size_t pos, bool ignore_case) {
  if (p.Cp(pos) != '\'' || !p.Has(pos + 1)) return 0;
  auto lower = [&](size_t i) {
    return ignore_case ? AsciiLower(p.Cp(i)) : p.Cp(i);
  };
  const uint32_t c1 = lower(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (!p.Has(pos + 2)) return 0;
  const uint32_t c2 = lower(pos + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
      (c1 == 'l' && c2 == 'l')) {
    return 3;
  }
  return 0;
}

// One token of the GPT-2 rule starting at `pos`; returns its end.
size_t Gpt2Token(const Piece& p, size_t pos) {
  if (size_t n = ContractionLength(p, pos, /*ignore_case=*/false)) {
    return pos + n;
  }
  // " ?X+" alternatives: an optional leading space, then a run of one class.
  const size_t lead = p.Cp(pos) == ' ' ? pos + 1 : pos;
  if (p.Letter(lead)) {
    size_t i = lead;
    while (p.Letter(i)) ++i;
    return i;
  }
  if (p.Number(lead)) {
    size_t i = lead;
    while (p.Number(i)) ++i;
    return i;
  }
  auto other = [&](size_t i) {
    return p.Has(i) && !p.Space(i) && !p.Letter(i) && !p.Number(i);
  };
  if (other(lead)) {
    size_t i = lead;
    while (other(i)) ++i;
    return i;
  }
  size_t spaces = 0;
  while (p.Space(pos + spaces)) ++spaces;
  // \s+(?!\S): a run followed by non-space leaves its last space to the
  // next token.
  if (spaces > 1 && p.Has(pos + spaces)) return pos + spaces - 1;
  if (spaces > 0) return pos + spaces;
  return pos + 1;
}

enum class NumberStyle { kUpToThree, kSingle };

// One token of the Llama 3 / Qwen2 / Qwen3.5 rules starting at `pos`. Digits
// found by kUpToThree may form several tokens, so tokens go to `emit`
// (called with each end) and the function returns the end of the last one.
template <typename Emit>
size_t Llama3Token(const Piece& p, size_t pos, NumberStyle numbers,
                   bool with_marks, Emit&& emit) {
  if (size_t n = ContractionLength(p, pos, /*ignore_case=*/true)) {
    emit(pos + n);
    return pos + n;
  }
  auto letter = [&](size_t i) {
    return p.Letter(i) || (with_marks && p.Mark(i));
  };
  // [^\r\n\p{L}\p{N}]?\p{L}+ : the first code point is taken whatever it
  // is (letter or not) once a letter is at it or right after it.
  if (!p.CrLf(pos) && !p.Number(pos) && (letter(pos) || letter(pos + 1))) {
    size_t i = pos + 1;
    while (letter(i)) ++i;
    emit(i);
    return i;
  }
  if (p.Number(pos)) {
    if (numbers == NumberStyle::kSingle) {
      emit(pos + 1);
      return pos + 1;
    }
    size_t i = pos;
    size_t group = pos;
    while (p.Number(i)) {
      if (++i - group >= 3) {
        emit(i);
        group = i;
      }
    }
    if (i > group) emit(i);
    return i;
  }
  // ?[^\s\p{L}\p{N}]+[\r\n]* . After a lone space at the end of the piece
  // the class test sees "nothing", which counts as a match here (as in
  // llama.cpp), so the space becomes a token of its own.
  auto other = [&](size_t i) {
    return !p.Space(i) && !letter(i) && !p.Number(i);
  };
  const size_t lead = p.Cp(pos) == ' ' ? pos + 1 : pos;
  if (other(lead)) {
    size_t i = lead;
    while (p.Has(i) && other(i)) ++i;
    while (p.CrLf(i)) ++i;
    emit(i);
    return i;
  }
  size_t spaces = 0;
  size_t after_last_newline = 0;
  while (p.Space(pos + spaces)) {
    if (p.CrLf(pos + spaces)) after_last_newline = pos + spaces + 1;
    ++spaces;
  }
  size_t end;
  if (after_last_newline > 0) {
    end = after_last_newline;  // \s*[\r\n]+
  } else if (spaces > 1 && p.Has(pos + spaces)) {
    end = pos + spaces - 1;  // \s+(?!\S)
  } else if (spaces > 0) {
    end = pos + spaces;  // \s+
  } else {
    end = pos + 1;
  }
  emit(end);
  return end;
}

bool InPunctuationClass(const Piece& p, size_t i, bool backtick,
                        const std::vector<uint32_t>& cps,
                        const std::vector<uint8_t>& info) {
  if (!p.Has(i)) return false;
  const uint32_t cp = cps[i];
  if (cp < 128) {
    if (cp == '`') return backtick;
    // All ASCII punctuation and symbols: the \p{P} ones plus $+<=>^|~.
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
           (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
  }
  // llama.cpp's std::regex path sees non-ASCII code points only through
  // their category, with whitespace taking precedence.
  return (info[i] & kWhitespaceBit) == 0 &&
         (info[i] & 7) == static_cast<uint8_t>(UnicodeCategory::kPunctuation);
}

// Splits every piece of `lengths` with `rule`; returns the new lengths.
std::vector<size_t> ApplyRule(PreTokenizerRule rule,
                              const std::vector<uint32_t>& cps,
                              const std::vector<uint8_t>& info,
                              const std::vector<size_t>& lengths) {
  std::vector<size_t> out;
  out.reserve(lengths.size() * 2);
  size_t begin = 0;
  for (size_t length : lengths) {
    const Piece p(cps, info, begin, begin + length);
    begin += length;
    size_t last = p.begin();
    auto emit = [&](size_t end) {
      if (end > last) out.push_back(end - last);
      last = end;
    };
    // Rules that isolate matches of a pattern: `match` gives the length of
    // the match at a position (0 for none); stretches between matches
    // become pieces too.
    auto isolate = [&](auto&& match) {
      size_t i = p.begin();
      while (i < p.end()) {
        const size_t n = match(i);
        if (n == 0) {
          ++i;
          continue;
        }
        emit(i);
        emit(i + n);
        i += n;
      }
      emit(p.end());
    };
    auto run_of = [&](auto&& in_class) {
      return [&p, in_class](size_t i) {
        size_t j = i;
        while (p.Has(j) && in_class(j)) ++j;
        return j - i;
      };
    };
    switch (rule) {
      case PreTokenizerRule::kGpt2:
        for (size_t pos = p.begin(); pos < p.end();) {
          pos = Gpt2Token(p, pos);
          emit(pos);
        }
        break;
      case PreTokenizerRule::kLlama3:
      case PreTokenizerRule::kQwen2:
      case PreTokenizerRule::kQwen35: {
        const NumberStyle numbers = rule == PreTokenizerRule::kLlama3
                                        ? NumberStyle::kUpToThree
                                        : NumberStyle::kSingle;
        const bool marks = rule == PreTokenizerRule::kQwen35;
        for (size_t pos = p.begin(); pos < p.end();) {
          pos = Llama3Token(p, pos, numbers, marks, emit);
        }
        break;
      }
      case PreTokenizerRule::kIsolateNumbers:
        isolate([&](size_t i) -> size_t { return p.Number(i) ? 1 : 0; });
        break;
      case PreTokenizerRule::kNumberRuns:
        isolate(run_of([&](size_t i) { return p.Number(i); }));
        break;
      case PreTokenizerRule::kPunctuationRuns:
      case PreTokenizerRule::kPunctuationRunsWithBacktick: {
        const bool backtick =
            rule == PreTokenizerRule::kPunctuationRunsWithBacktick;
        isolate(run_of([&](size_t i) {
          return InPunctuationClass(p, i, backtick, cps, info);
        }));
        break;
      }
      case PreTokenizerRule::kAsciiDigitTriples: {
        auto digit = [&](size_t i) {
          return p.Has(i) && cps[i] >= '0' && cps[i] <= '9';
        };
        isolate([&](size_t i) -> size_t {
          return digit(i) && digit(i + 1) && digit(i + 2) ? 3 : 0;
        });
        break;
      }
      case PreTokenizerRule::kNewlineRuns: {
        for (size_t i = p.begin(); i < p.end();) {
          const bool newline = cps[i] == '\n';
          while (i < p.end() && (cps[i] == '\n') == newline) ++i;
          emit(i);
        }
        break;
      }
    }
  }
  return out;
}

// Continuation-byte range allowed right after a strict UTF-8 lead byte, and
// the sequence length; length 0 for bytes that cannot start a sequence.
struct LeadInfo {
  int length;
  uint8_t second_min;
  uint8_t second_max;
};

LeadInfo StrictLead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Bytes of the well-formed prefix of the sequence starting at `i` that
// belong to it: returns {consumed, complete}. A sequence that fails at a
// byte consumes the bytes before that byte (at least the lead).
struct StrictStep {
  size_t consumed;
  bool complete;
};

StrictStep StrictDecodeAt(absl::string_view s, size_t i) {
  const LeadInfo lead = StrictLead(static_cast<uint8_t>(s[i]));
  if (lead.length == 0) return {1, false};
  if (lead.length == 1) return {1, true};
  size_t k = 1;
  for (; k < static_cast<size_t>(lead.length); ++k) {
    if (i + k >= s.size()) return {k, false};
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    const uint8_t lo = k == 1 ? lead.second_min : 0x80;
    const uint8_t hi = k == 1 ? lead.second_max : 0xBF;
    if (b < lo || b > hi) return {k, false};
  }
  return {k, true};
}

}  // namespace

UnicodeCategory GetUnicodeCategory(uint32_t cp) {
  if (cp < 128) return AsciiCategories()[cp];
  if (cp > kMaxCodePoint) return UnicodeCategory::kUndefined;
  // The last range whose start is <= cp.
  const uint32_t* end = kCategoryRanges + kCategoryRangesSize;
  const uint32_t* it = std::upper_bound(
      kCategoryRanges, end, cp,
      [](uint32_t value, uint32_t entry) { return value < (entry >> 3); });
  return static_cast<UnicodeCategory>(it[-1] & 7);
}

bool IsUnicodeWhitespace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x0085:
    case 0x00A0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

absl::string_view UnicodeTableVersion() {
  return unicode_internal::kUnicodeVersion;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp > kMaxCodePoint) cp = kReplacementCharacter;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<uint32_t> DecodeUtf8Lenient(absl::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const size_t n = text.size();
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  auto continuation = [&](size_t i) {
    return i < n && (byte(i) & 0xC0) == 0x80;
  };
  size_t i = 0;
  while (i < n) {
    const uint8_t b = byte(i);
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    size_t length = 0;
    uint32_t cp = 0;
    if ((b & 0xE0) == 0xC0) {
      length = 2;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      length = 3;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      length = 4;
      cp = b & 0x07;
    }
    bool ok = length > 0;
    for (size_t k = 1; ok && k < length; ++k) {
      ok = continuation(i + k);
      if (ok) cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    if (ok && cp <= kMaxCodePoint) {
      out.push_back(cp);
      i += length;
    } else {
      out.push_back(kReplacementCharacter);
      ++i;
    }
  }
  return out;
}

size_t Utf8SequenceLength(uint8_t lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                           1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

bool IsValidUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const StrictStep step = StrictDecodeAt(text, i);
    if (!step.complete) return false;
    i += step.consumed;
  }
  return true;
}

size_t DecodeUtf8StrictAt(absl::string_view text, size_t i, uint32_t* cp) {
  const StrictStep step = StrictDecodeAt(text, i);
  if (!step.complete) return 0;
  // Payload bits of the lead byte, by sequence length.
  static constexpr uint8_t kLeadBits[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t value = static_cast<uint8_t>(text[i]) & kLeadBits[step.consumed];
  for (size_t k = 1; k < step.consumed; ++k) {
    value = (value << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
  }
  *cp = value;
  return step.consumed;
}

std::string SanitizeUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const StrictStep step = StrictDecodeAt(text, i);
    if (step.complete) {
      out.append(text.data() + i, step.consumed);
    } else {
      AppendUtf8(kReplacementCharacter, &out);
    }
    i += step.consumed;
  }
  return out;
}

size_t IncompleteUtf8SuffixLength(absl::string_view text) {
  const size_t n = text.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const uint8_t b = static_cast<uint8_t>(text[n - k]);
    if ((b & 0xC0) == 0x80) continue;  // continuation: look further back
    const LeadInfo lead = StrictLead(b);
    if (lead.length <= static_cast<int>(k)) return 0;
    const StrictStep step = StrictDecodeAt(text, n - k);
    return (!step.complete && step.consumed == k) ? k : 0;
  }
  return 0;
}

uint32_t ByteToUnicode(uint8_t byte) {
  return GetByteMapping().to_unicode[byte];
}

const std::string& ByteToUnicodeUtf8(uint8_t byte) {
  return GetByteMapping().to_utf8[byte];
}

int UnicodeToByte(uint32_t cp) {
  const ByteMapping& m = GetByteMapping();
  return cp < m.to_byte.size() ? m.to_byte[cp] : -1;
}

std::vector<std::string> PreTokenize(absl::string_view text,
                                     absl::Span<const PreTokenizerRule> rules) {
  const std::vector<uint32_t> cps = DecodeUtf8Lenient(text);
  if (cps.empty()) return {};
  std::vector<uint8_t> info(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    info[i] = static_cast<uint8_t>(GetUnicodeCategory(cps[i])) |
              (IsUnicodeWhitespace(cps[i]) ? kWhitespaceBit : 0);
  }
  std::vector<size_t> lengths = {cps.size()};
  for (PreTokenizerRule rule : rules) {
    lengths = ApplyRule(rule, cps, info, lengths);
  }
  std::vector<std::string> pieces;
  pieces.reserve(lengths.size());
  size_t begin = 0;
  for (size_t length : lengths) {
    std::string& piece = pieces.emplace_back();
    for (size_t i = begin; i < begin + length; ++i) AppendUtf8(cps[i], &piece);
    begin += length;
  }
  return pieces;
}

}  // namespace pdserve::model
