#include "model/python_whitespace.h"

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "model/unicode.h"

namespace pdserve::model {

bool IsPyWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

size_t PyWhitespaceRunAt(absl::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size()) {
    uint32_t cp;
    const size_t n = DecodeUtf8StrictAt(s, j, &cp);
    if (n == 0 || !IsPyWhitespace(cp)) break;
    j += n;
  }
  return j - i;
}

size_t PyTrailingWhitespaceStart(absl::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    uint32_t cp;
    if (DecodeUtf8StrictAt(s, start, &cp) != end - start ||
        !IsPyWhitespace(cp)) {
      break;
    }
    end = start;
  }
  return end;
}

absl::string_view PyStrip(absl::string_view s) {
  s.remove_prefix(PyWhitespaceRunAt(s, 0));
  return s.substr(0, PyTrailingWhitespaceStart(s));
}

}  // namespace pdserve::model
