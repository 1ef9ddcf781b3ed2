// The renderers of the ChatML and Llama 3 families: the templates that
// write a header per message ("<|im_start|>ROLE\n",
// "<|start_header_id|>ROLE<|end_header_id|>\n\n") and accept any order of
// roles.
#include <time.h>

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/chat_template.h"
#include "model/chat_template_variants.h"
#include "model/python_whitespace.h"

namespace pdserve::model {
namespace {

// strftime_now("%d %b %Y") as Python computes it: local time, C-locale
// month names.
std::string TodayDateString() {
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr",
                                            "May", "Jun", "Jul", "Aug",
                                            "Sep", "Oct", "Nov", "Dec"};
  const time_t now = time(nullptr);
  struct tm local;
  localtime_r(&now, &local);
  return absl::StrFormat("%02d %s %d", local.tm_mday, kMonths[local.tm_mon],
                         local.tm_year + 1900);
}

}  // namespace

std::string ChatTemplate::RenderChatMl(absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt) const {
  std::string out;
  if (variant_ == Variant::kChatMlBos) out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (i == 0 && default_system_.has_value() && message.role != "system") {
      absl::StrAppend(&out, "<|im_start|>system\n", *default_system_,
                      "<|im_end|>\n");
    }
    absl::StrAppend(&out, "<|im_start|>", message.role, "\n", message.content,
                    "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string ChatTemplate::RenderLlama3(absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt) const {
  std::string out = bos_token_;
  for (const ChatMessage& message : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", message.role,
                    "<|end_header_id|>\n\n", PyStrip(message.content),
                    "<|eot_id|>");
  }
  if (add_generation_prompt) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

std::string ChatTemplate::RenderLlama31(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt,
    const ChatRenderOptions& options) const {
  absl::string_view system;
  if (messages[0].role == "system") {
    system = PyStrip(messages[0].content);
    messages.remove_prefix(1);
  }
  const std::string date = options.date_string.has_value()
                               ? *options.date_string
                           : variant_ == Variant::kLlama32 ? TodayDateString()
                                                           : default_date_;
  std::string out = bos_token_;
  absl::StrAppend(&out, "<|start_header_id|>system<|end_header_id|>\n\n",
                  "Cutting Knowledge Date: ", knowledge_cutoff_, "\n",
                  "Today Date: ", date, "\n\n", system, "<|eot_id|>");
  for (const ChatMessage& message : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", message.role,
                    "<|end_header_id|>\n\n", PyStrip(message.content),
                    "<|eot_id|>");
  }
  if (add_generation_prompt) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

}  // namespace pdserve::model
