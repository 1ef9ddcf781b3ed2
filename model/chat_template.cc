#include "model/chat_template.h"

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/chat_template_variants.h"
#include "model/unicode.h"

namespace pdserve::model {

using chat_template_internal::Info;
absl::string_view ChatTemplateFamilyName(ChatTemplateFamily family) {
  switch (family) {
    case ChatTemplateFamily::kChatMl:
      return "chatml";
    case ChatTemplateFamily::kLlama3:
      return "llama3";
    case ChatTemplateFamily::kLlama2:
      return "llama2";
    case ChatTemplateFamily::kMistral:
      return "mistral";
  }
  return "unknown";
}

ChatTemplateFamily ChatTemplate::family() const {
  return Info(variant_).family;
}

absl::string_view ChatTemplate::variant_name() const {
  return Info(variant_).name;
}

bool ChatTemplate::renders_bos() const { return Info(variant_).renders_bos; }

absl::StatusOr<std::string> ChatTemplate::Render(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt,
    const ChatRenderOptions& options) const {
  if (messages.empty()) {
    return absl::InvalidArgumentError("the conversation has no messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role != "system" && message.role != "user" &&
        message.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", i, " has role \"", absl::CHexEscape(message.role),
          "\"; the roles are \"system\", \"user\" and \"assistant\""));
    }
    if (!IsValidUtf8(message.content)) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " content is not valid UTF-8"));
    }
  }
  if (options.date_string.has_value() && !IsValidUtf8(*options.date_string)) {
    return absl::InvalidArgumentError("date_string is not valid UTF-8");
  }
  switch (variant_) {
    case Variant::kChatMl:
    case Variant::kChatMlBos:
    case Variant::kChatMlDefaultSystem:
    case Variant::kQwen25:
      return RenderChatMl(messages, add_generation_prompt);
    case Variant::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
    case Variant::kLlama31:
    case Variant::kLlama32:
      return RenderLlama31(messages, add_generation_prompt, options);
    case Variant::kLlama2:
      return RenderLlama2(messages);
    case Variant::kMistralLegacyV01:
    case Variant::kMistralLegacy:
      return RenderMistralLegacy(messages);
    case Variant::kMistralV1:
      return RenderMistralV1(messages);
    case Variant::kMistralV3:
      return RenderMistralV3(messages);
  }
  return absl::InternalError("unknown chat template variant");
}

}  // namespace pdserve::model
