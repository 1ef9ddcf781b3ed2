#include "model/jinja_lexer.h"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "model/python_whitespace.h"
#include "model/unicode.h"

namespace pdserve::model {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

absl::Status LexError(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A string literal's body, decoded as Jinja does (Python's "unicode-escape"
// codec). \N{...}, escapes of non-ASCII characters and surrogates are
// refused.
absl::StatusOr<std::string> DecodeStringLiteral(absl::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\') {
      out.push_back(body[i]);
      continue;
    }
    if (++i == body.size()) return LexError("string ends in a backslash");
    const char e = body[i];
    switch (e) {
      case '\n':  // a line continuation: both are dropped
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(e);
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (body.size() - i - 1 < digits)
          return LexError("short \\x/\\u escape");
        char32_t cp = 0;
        for (size_t k = 1; k <= digits; ++k) {
          const int v = HexValue(body[i + k]);
          if (v < 0) return LexError("bad \\x/\\u escape");
          cp = cp * 16 + v;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
          return LexError("escape is not a Unicode scalar value");
        }
        AppendUtf8(cp, &out);
        i += digits;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' &&
                          body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + (body[++i] - '0');
          }
          AppendUtf8(cp, &out);
        } else if (static_cast<unsigned char>(e) >= 0x80 || e == 'N') {
          return LexError("unsupported escape in a string literal");
        } else {
          // Python keeps unknown escapes as they are.
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<JinjaToken>> LexJinjaTemplate(
    absl::string_view source) {
  if (!IsValidUtf8(source)) return LexError("the template is not valid UTF-8");
  // Jinja reads "\r\n" and "\r" as "\n" and drops one final newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  const absl::string_view s = src;
  const size_t n = s.size();

  std::vector<JinjaToken> out;
  const auto emit_text = [&out](absl::string_view text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == JinjaTokenKind::kText) {
      out.back().text.append(text.data(), text.size());
    } else {
      out.push_back({JinjaTokenKind::kText, std::string(text)});
    }
  };

  size_t pos = 0;
  // Whether the last token consumed ended a line (lstrip_blocks needs it).
  bool line_starting = true;
  while (pos < n) {
    size_t start = pos;
    char kind = 0;
    while ((start = s.find('{', start)) != absl::string_view::npos &&
           start + 1 < n) {
      const char c = s[start + 1];
      if (c == '{' || c == '%' || c == '#') {
        kind = c;
        break;
      }
      ++start;
    }
    if (kind == 0) {
      emit_text(s.substr(pos));
      break;
    }
    size_t body = start + 2;
    char sign = 0;
    if (body < n && (s[body] == '-' || s[body] == '+')) sign = s[body++];

    // Whitespace control of the text before the tag.
    absl::string_view text = s.substr(pos, start - pos);
    if (sign == '-') {
      text = text.substr(0, PyTrailingWhitespaceStart(text));
    } else if (sign != '+' && kind != '{') {
      // lstrip_blocks: blanks between a line start and a block or comment.
      const size_t newline = text.rfind('\n');
      const size_t l_pos = newline == absl::string_view::npos ? 0 : newline + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          PyWhitespaceRunAt(text, l_pos) == text.size() - l_pos) {
        text = text.substr(0, l_pos);
      }
    }
    emit_text(text);

    if (kind == '#') {
      const size_t close = s.find("#}", body);
      if (close == absl::string_view::npos) return LexError("open comment");
      const char end_sign =
          close > body && (s[close - 1] == '-' || s[close - 1] == '+')
              ? s[close - 1]
              : 0;
      size_t after = close + 2;
      if (end_sign == '-') {
        after += PyWhitespaceRunAt(s, after);
      } else if (end_sign != '+' && after < n && s[after] == '\n') {
        ++after;  // trim_blocks
      }
      line_starting = after > close + 2 && s[after - 1] == '\n';
      pos = after;
      continue;
    }

    out.push_back(
        {JinjaTokenKind::kBegin, std::string(s.substr(start, body - start))});
    if (kind == '%') {
      const size_t k = body + PyWhitespaceRunAt(s, body);
      if (s.substr(k, 3) == "raw" && (k + 3 >= n || !IsNameChar(s[k + 3]))) {
        return LexError("{% raw %} blocks are not supported");
      }
    }
    std::vector<char> closers;  // brackets still open inside the tag
    size_t i = body;
    for (;;) {
      i += PyWhitespaceRunAt(s, i);
      if (i >= n) return LexError("open tag at the end of the template");
      if (closers.empty()) {
        const absl::string_view rest = s.substr(i);
        absl::string_view end;
        if (kind == '%') {
          for (absl::string_view e : {"-%}", "+%}", "%}"}) {
            if (absl::StartsWith(rest, e)) {
              end = e;
              break;
            }
          }
        } else {
          for (absl::string_view e : {"-}}", "}}"}) {
            if (absl::StartsWith(rest, e)) {
              end = e;
              break;
            }
          }
        }
        if (!end.empty()) {
          out.push_back({JinjaTokenKind::kEnd, std::string(end)});
          size_t after = i + end.size();
          if (end[0] == '-') {
            after += PyWhitespaceRunAt(s, after);
          } else if (end == "%}" && after < n && s[after] == '\n') {
            ++after;  // trim_blocks
          }
          line_starting = after > i + end.size() && s[after - 1] == '\n';
          pos = after;
          break;
        }
      }
      const char c = s[i];
      if (IsDigit(c)) {
        size_t j = i;
        while (j < n && (IsDigit(s[j]) || s[j] == '_')) ++j;
        if (j + 1 < n && s[j] == '.' && IsDigit(s[j + 1])) {
          ++j;
          while (j < n && (IsDigit(s[j]) || s[j] == '_')) ++j;
        }
        if (j < n && (s[j] == 'e' || s[j] == 'E')) {
          size_t k = j + 1;
          if (k < n && (s[k] == '+' || s[k] == '-')) ++k;
          if (k < n && IsDigit(s[k])) {
            j = k;
            while (j < n && (IsDigit(s[j]) || s[j] == '_')) ++j;
          }
        }
        out.push_back(
            {JinjaTokenKind::kNumber, std::string(s.substr(i, j - i))});
        i = j;
      } else if (IsNameStart(c)) {
        size_t j = i + 1;
        while (j < n && IsNameChar(s[j])) ++j;
        out.push_back({JinjaTokenKind::kName, std::string(s.substr(i, j - i))});
        i = j;
      } else if (c == '\'' || c == '"') {
        size_t j = i + 1;
        while (j < n && s[j] != c) j += s[j] == '\\' ? 2 : 1;
        if (j >= n) return LexError("open string literal");
        PD_ASSIGN_OR_RETURN(std::string value,
                            DecodeStringLiteral(s.substr(i + 1, j - i - 1)));
        out.push_back({JinjaTokenKind::kString, std::move(value)});
        i = j + 1;
      } else {
        absl::string_view op;
        for (absl::string_view two : {"//", "**", "==", "!=", ">=", "<="}) {
          if (absl::StartsWith(s.substr(i), two)) {
            op = two;
            break;
          }
        }
        if (op.empty()) {
          if (absl::string_view("+-/*%~[](){}=.:|,;<>").find(c) ==
              absl::string_view::npos) {
            return LexError("unexpected character in a tag");
          }
          op = s.substr(i, 1);
        }
        if (op == "(" || op == "[" || op == "{") {
          closers.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (closers.empty() || closers.back() != op[0]) {
            return LexError("unbalanced brackets in a tag");
          }
          closers.pop_back();
        }
        out.push_back({JinjaTokenKind::kOp, std::string(op)});
        i += op.size();
      }
    }
  }
  return out;
}

}  // namespace pdserve::model
