// The renderers of the Llama 2 and Mistral families: the "[INST] ... [/INST]"
// templates, which insist on alternating user and assistant turns and raise
// an exception (an INVALID_ARGUMENT here) when a conversation breaks their
// rules.
#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/chat_template.h"
#include "model/chat_template_variants.h"
#include "model/python_whitespace.h"

namespace pdserve::model {
namespace {

using chat_template_internal::Info;
using chat_template_internal::Variant;

// The templates' raise_exception(message).
absl::Status TemplateRaised(Variant variant, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("the ", Info(variant).name,
                   " chat template rejects this conversation: ", message));
}

constexpr absl::string_view kAlternateLegacy =
    "Conversation roles must alternate user/assistant/user/assistant/...";
constexpr absl::string_view kAlternateAfterSystem =
    "After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...";
constexpr absl::string_view kOnlyUserAssistant =
    "Only user and assistant roles are supported!";
constexpr absl::string_view kOnlyUserAssistantAfterSystem =
    "Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!";

}  // namespace

absl::StatusOr<std::string> ChatTemplate::RenderLlama2(
    absl::Span<const ChatMessage> messages) const {
  std::optional<absl::string_view> system;
  if (messages[0].role == "system") {
    system = messages[0].content;
    messages.remove_prefix(1);
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if ((message.role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateLegacy);
    }
    const std::string content =
        i == 0 && system.has_value()
            ? absl::StrCat("<<SYS>>\n", *system, "\n<</SYS>>\n\n",
                           message.content)
            : message.content;
    if (message.role == "user") {
      absl::StrAppend(&out, bos_token_, "[INST] ", PyStrip(content),
                      " [/INST]");
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, " ", PyStrip(content), " ", eos_token_);
    }
    // A system message in an assistant's place renders nothing.
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderMistralLegacy(
    absl::Span<const ChatMessage> messages) const {
  std::string out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if ((message.role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateLegacy);
    }
    if (message.role == "user") {
      absl::StrAppend(&out, "[INST] ", message.content, " [/INST]");
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, message.content, eos_token_,
                      variant_ == Variant::kMistralLegacyV01 ? " " : "");
    } else {
      return TemplateRaised(variant_, kOnlyUserAssistant);
    }
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderMistralV1(
    absl::Span<const ChatMessage> messages) const {
  std::optional<absl::string_view> system;
  if (messages[0].role == "system") {
    system = messages[0].content;
    messages.remove_prefix(1);
  }
  std::string out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if ((message.role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateAfterSystem);
    }
    if (message.role == "user") {
      if (i == 0 && system.has_value()) {
        absl::StrAppend(&out, " [INST] ", *system, "\n\n", message.content,
                        " [/INST]");
      } else {
        absl::StrAppend(&out, " [INST] ", message.content, " [/INST]");
      }
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, " ", message.content, eos_token_);
    } else {
      return TemplateRaised(variant_, kOnlyUserAssistantAfterSystem);
    }
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderMistralV3(
    absl::Span<const ChatMessage> messages) const {
  std::optional<absl::string_view> system;
  if (messages[0].role == "system") {
    system = messages[0].content;
    messages.remove_prefix(1);
  }
  // The template checks the whole order before it renders anything.
  for (size_t i = 0; i < messages.size(); ++i) {
    if ((messages[i].role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateAfterSystem);
    }
  }
  std::string out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "user") {
      if (i + 1 == messages.size() && system.has_value()) {
        absl::StrAppend(&out, "[INST] ", *system, "\n\n", message.content,
                        "[/INST]");
      } else {
        absl::StrAppend(&out, "[INST] ", message.content, "[/INST]");
      }
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, " ", PyStrip(message.content), eos_token_);
    } else {
      return TemplateRaised(variant_, kOnlyUserAssistantAfterSystem);
    }
  }
  return out;
}

}  // namespace pdserve::model
