// Whitespace as Python's str.isspace() sees it, for the chat templates:
// Jinja's `trim` filter, Python's str.strip() and the \s of Jinja's lexer
// regexes all use this set, which is wider than Unicode White_Space
// (model/unicode.h's IsUnicodeWhitespace): it also holds U+001C..U+001F.
// Rendering must strip exactly what Python strips for the output to match
// Hugging Face's byte for byte.
//
// Text is UTF-8; a byte that does not start a valid sequence is never
// whitespace, so it ends a run.
//
// Thread-safety: pure functions.
#ifndef PDSERVE_MODEL_PYTHON_WHITESPACE_H_
#define PDSERVE_MODEL_PYTHON_WHITESPACE_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace pdserve::model {

// Python's str.isspace() for one code point.
bool IsPyWhitespace(uint32_t cp);

// Length in bytes of the whitespace run starting at s[i].
size_t PyWhitespaceRunAt(absl::string_view s, size_t i);

// Where the whitespace run that ends `s` starts (s.size() when none).
size_t PyTrailingWhitespaceStart(absl::string_view s);

// Python's str.strip() with no argument.
absl::string_view PyStrip(absl::string_view s);

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_PYTHON_WHITESPACE_H_
