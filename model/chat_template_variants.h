// The chat template variants that model/chat_template.h's file comment
// lists, and what the implementation knows of each: a table of their
// properties and the known template texts they are recognised by. Internal
// to the :chat_template library, whose files share it: recognition
// (chat_template_recognize.cc), the texts (chat_template_sources.cc) and
// the renderers (chat_template_render_*.cc).
#ifndef PDSERVE_MODEL_CHAT_TEMPLATE_VARIANTS_H_
#define PDSERVE_MODEL_CHAT_TEMPLATE_VARIANTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "model/chat_template.h"

namespace pdserve::model {

enum class ChatTemplate::Variant : uint8_t {
  kChatMl,
  kChatMlBos,
  kChatMlDefaultSystem,
  kQwen25,
  kLlama3,
  kLlama31,
  kLlama32,
  kLlama2,
  kMistralLegacyV01,
  kMistralLegacy,
  kMistralV1,
  kMistralV3,
};

namespace chat_template_internal {

using Variant = ChatTemplate::Variant;

struct VariantInfo {
  Variant variant;
  absl::string_view name;
  ChatTemplateFamily family;
  bool renders_bos;  // the template outputs bos_token
  bool uses_eos;     // the template outputs eos_token
  bool overridable;  // FromFamilyName accepts the name
};

inline constexpr VariantInfo kVariants[] = {
    {Variant::kChatMl, "chatml", ChatTemplateFamily::kChatMl, false, false,
     true},
    {Variant::kChatMlBos, "chatml-bos", ChatTemplateFamily::kChatMl, true,
     false, true},
    // These two need their default system prompt from a template.
    {Variant::kChatMlDefaultSystem, "chatml-default-system",
     ChatTemplateFamily::kChatMl, false, false, false},
    {Variant::kQwen25, "qwen2.5", ChatTemplateFamily::kChatMl, false, false,
     false},
    {Variant::kLlama3, "llama3", ChatTemplateFamily::kLlama3, true, false,
     true},
    {Variant::kLlama31, "llama3.1", ChatTemplateFamily::kLlama3, true, false,
     true},
    {Variant::kLlama32, "llama3.2", ChatTemplateFamily::kLlama3, true, false,
     true},
    {Variant::kLlama2, "llama2", ChatTemplateFamily::kLlama2, true, true, true},
    {Variant::kMistralLegacyV01, "mistral-legacy-v0.1",
     ChatTemplateFamily::kMistral, true, true, true},
    {Variant::kMistralLegacy, "mistral-legacy", ChatTemplateFamily::kMistral,
     true, true, true},
    {Variant::kMistralV1, "mistral-v1", ChatTemplateFamily::kMistral, true,
     true, true},
    {Variant::kMistralV3, "mistral-v3", ChatTemplateFamily::kMistral, true,
     true, true},
};

inline const VariantInfo& Info(Variant variant) {
  for (const VariantInfo& info : kVariants) {
    if (info.variant == variant) return info;
  }
  return kVariants[0];  // unreachable: every variant is in the table
}

// A known template text. It is verbatim except for holes: a string literal
// holding "@@NAME@@" matches a literal holding any text in its place, and
// that text is captured as NAME ("_": not kept).
struct KnownTemplate {
  Variant variant;
  std::string source;
};

// Every known template text, several for some variants (edits that render
// alike); model/testdata/chat_templates/sources/ holds the originals.
std::vector<KnownTemplate> KnownTemplates();

}  // namespace chat_template_internal
}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_CHAT_TEMPLATE_VARIANTS_H_
