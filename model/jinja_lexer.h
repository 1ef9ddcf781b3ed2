// Lexes a Jinja template the way Jinja2 (jinja2/lexer.py, 3.1) lexes it
// under Hugging Face's environment settings (trim_blocks, lstrip_blocks,
// "\r\n" and "\r" read as "\n", one final newline dropped), into the form
// the chat templates are recognised in (model/chat_template.h): the text
// between tags as Jinja's whitespace control leaves it; tags with their
// whitespace-control signs; names, numbers and operators inside tags
// regardless of the spaces between them; string literals by their decoded
// value; comments dropped.
//
// It is a lexer for recognition, not for rendering: anything it does not
// handle ({% raw %} blocks, \N{...} escapes, ...) is an error, which makes
// the template unknown. It may refuse a valid template, but it must never
// make two templates that render differently lex alike.
//
// Thread-safety: a pure function.
#ifndef PDSERVE_MODEL_JINJA_LEXER_H_
#define PDSERVE_MODEL_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::model {

enum class JinjaTokenKind : uint8_t {
  kText,    // template data, after whitespace control
  kBegin,   // "{{", "{%", with their sign ("{%-", "{{+", ...)
  kEnd,     // "}}", "-}}", "%}", "-%}", "+%}"
  kName,    // identifiers and keywords
  kNumber,  // as written
  kString,  // the decoded value of a string literal
  kOp,      // operators and brackets
};

struct JinjaToken {
  JinjaTokenKind kind;
  std::string text;
};

// The tokens of `source`; INVALID_ARGUMENT, saying why, when it is not valid
// UTF-8 or holds something this lexer does not handle.
absl::StatusOr<std::vector<JinjaToken>> LexJinjaTemplate(
    absl::string_view source);

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_JINJA_LEXER_H_
