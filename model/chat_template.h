// Chat-template rendering: turns an OpenAI-style conversation (messages with
// a role and a content) into the prompt text a model was fine-tuned on. The
// result is byte for byte what Hugging Face's
//   tokenizer.apply_chat_template(messages, tokenize=False,
//                                 add_generation_prompt=...)
// renders with Jinja2 from the model's template (the GGUF's
// `tokenizer.chat_template`), for the templates listed below. pdserve has no
// Jinja interpreter: it recognises known templates and renders them with
// hand-written code, as llama.cpp does without --jinja.
//
// Recognition (FromSource). The template is compared with a table of known
// templates. Both are lexed the way Jinja2 lexes them under HF's settings
// (trim_blocks, lstrip_blocks, "\r\n" read as "\n", one final newline
// dropped) and compared token by token: the text between tags as Jinja's
// whitespace control leaves it; tags with their whitespace-control signs;
// names, numbers and operators inside tags regardless of the spaces between
// them; string literals by their decoded value (so '\n' and a literal line
// break are the same); comments ignored. A few string literals are holes that
// may hold any text, which is read out and rendered as the template would:
// ChatML default system prompts and Llama 3.1/3.2's knowledge cutoff and
// default date. So a match renders exactly like the known template; anything
// else - a fine-tune's edited copy, Qwen3, Gemma, Mistral Nemo, ... - is
// UNIMPLEMENTED, with the family its markers suggest ("<|im_start|>": ChatML,
// "<|start_header_id|>": Llama 3, "<<SYS>>": Llama 2, "[INST]": Mistral).
// The caller may then name a variant explicitly (FromFamilyName), taking
// responsibility for it matching the model.
//
// Known templates (variant name: what is recognised; how it renders). The
// original texts are in model/testdata/chat_templates/sources/, and where
// each came from in tools/gen_chat_template_goldens.py.
//  chatml: `{% for message in messages %}{{'<|im_start|>' + message['role']
//      + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if
//      add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`
//      (OpenHermes-2.5 and many fine-tunes). Each message as
//      "<|im_start|>ROLE\nCONTENT<|im_end|>\n", content untouched; then
//      "<|im_start|>assistant\n" when add_generation_prompt.
//  chatml-bos: the same preceded by {{bos_token}} (Nous-Hermes-2-Mixtral).
//  chatml-default-system: SmolLM2-Instruct, Qwen2-Instruct, Qwen1.5-Chat:
//      ChatML, plus "<|im_start|>system\nDEFAULT<|im_end|>\n" first when the
//      first message is not a system message. DEFAULT is read from the
//      template (SmolLM2: "You are a helpful AI assistant named SmolLM,
//      trained by Hugging Face"; Qwen2: "You are a helpful assistant.").
//  qwen2.5: Qwen2.5-Instruct (and -Coder-Instruct): the same rendering, with
//      DEFAULT read from the template ("You are Qwen, created by Alibaba
//      Cloud. You are a helpful assistant."); its tool branches are never
//      taken (no tools are passed).
//  llama3: Meta-Llama-3-8B/70B-Instruct. BOS, then per message
//      "<|start_header_id|>ROLE<|end_header_id|>\n\n" + trim(CONTENT) +
//      "<|eot_id|>"; "<|start_header_id|>assistant<|end_header_id|>\n\n" when
//      add_generation_prompt.
//  llama3.1: Llama-3.1-Instruct (the July 2024 text and the later one with
//      `tools = none`) and Llama-3.3-70B-Instruct. BOS and a system block that
//      is always there: "<|start_header_id|>system<|end_header_id|>\n\n"
//      "Cutting Knowledge Date: CUTOFF\nToday Date: DATE\n\n" + trim(first
//      message's content if it is a system message, else "") + "<|eot_id|>";
//      then the other messages as llama3 (later system messages included).
//      CUTOFF is read from the template ("December 2023"). DATE is
//      ChatRenderOptions::date_string when given (the template's
//      `date_string` variable), else the template's literal default, read
//      from it ("26 Jul 2024") - as in HF, which leaves date_string unset.
//  llama3.2: Llama-3.2-1B/3B-Instruct. As llama3.1, but without date_string
//      the template calls strftime_now("%d %b %Y"), which HF defines as the
//      current local date: pdserve uses the server's local date, with English
//      month abbreviations ("05 Mar 2025").
//  llama2: Llama-2-chat (and CodeLlama-Instruct, which spells .strip() as
//      | trim). A first system message becomes "<<SYS>>\nSYSTEM\n<</SYS>>\n\n"
//      in front of the first user message; then per message user:
//      BOS + "[INST] " + strip(CONTENT) + " [/INST]", assistant:
//      " " + strip(CONTENT) + " " + EOS. Roles after the optional system
//      message must alternate user/assistant (else "Conversation roles must
//      alternate user/assistant/user/assistant/..."); a later system message
//      in an assistant's place renders nothing, as in the template.
//  mistral-legacy-v0.1: Mistral-7B-Instruct-v0.1's original template: BOS,
//      then user: "[INST] " + CONTENT + " [/INST]", assistant:
//      CONTENT + EOS + " "; roles must alternate from the first message, no
//      system role ("Only user and assistant roles are supported!").
//  mistral-legacy: Mistral-7B-Instruct-v0.2's original template (and
//      Mixtral-8x7B-Instruct-v0.1's): as above, assistant: CONTENT + EOS.
//  mistral-v1: the 2024 template of Mistral-7B-Instruct-v0.1/v0.2: BOS, then
//      user: " [INST] " + CONTENT + " [/INST]", the first user message
//      prefixed by SYSTEM + "\n\n" when the conversation starts with a system
//      message; assistant: " " + CONTENT + EOS.
//  mistral-v3: Mistral-7B-Instruct-v0.3 (and Mistral-Large-2407): BOS, then
//      user: "[INST] " + CONTENT + "[/INST]", with SYSTEM + "\n\n" in front of
//      the content of the LAST message if that is a user message (otherwise
//      the system message is dropped, as in the template); assistant:
//      " " + trim(CONTENT) + EOS.
// trim/strip are Python's str.strip(): all Unicode whitespace that Python's
// str.isspace() accepts (U+00A0, U+3000, U+001C..U+001F, ... included).
// add_generation_prompt is ignored by the llama2 and mistral* templates.
//
// BOS: renders_bos() is true when the rendered text already contains the
// BOS token text (llama3*, llama2, mistral*, chatml-bos): the caller must
// tokenize it with special-token parsing and must not add another BOS.
//
// Input checks (Render, INVALID_ARGUMENT): an empty message list; a role
// other than "system", "user" or "assistant"; role or content that is not
// valid UTF-8; and whatever the template itself raises (raise_exception),
// with the template's message.
//
// Ownership: a ChatTemplate is a small value (copyable, movable) holding the
// variant, the BOS/EOS texts and the data read from the template; it keeps
// no reference to the source. Thread-safety: immutable after construction;
// const methods may be called concurrently (Render only reads the local
// clock, for llama3.2).
#ifndef PDSERVE_MODEL_CHAT_TEMPLATE_H_
#define PDSERVE_MODEL_CHAT_TEMPLATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/gguf.h"

namespace pdserve::model {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatTemplateFamily {
  kChatMl,   // "chatml": chatml, chatml-bos, chatml-default-system, qwen2.5
  kLlama3,   // "llama3": llama3, llama3.1, llama3.2
  kLlama2,   // "llama2": llama2
  kMistral,  // "mistral": mistral-legacy-v0.1, mistral-legacy, mistral-v1/v3
};

// "chatml", "llama3", "llama2", "mistral".
absl::string_view ChatTemplateFamilyName(ChatTemplateFamily family);

struct ChatRenderOptions {
  // The templates' `date_string` variable ("Today Date: ..." of llama3.1 and
  // llama3.2); unset: the template's own rule (see above). Ignored by the
  // other templates.
  std::optional<std::string> date_string;
};

class ChatTemplate {
 public:
  // Recognises `source` (a GGUF's tokenizer.chat_template). `bos_token` and
  // `eos_token` are the token texts the template's bos_token / eos_token
  // variables stand for (e.g. "<s>", "</s>"). UNIMPLEMENTED (naming the
  // family the markers suggest) when the template is not a known one.
  static absl::StatusOr<ChatTemplate> FromSource(absl::string_view source,
                                                 std::string bos_token,
                                                 std::string eos_token);

  // Explicit override, for a model whose template is missing or not
  // recognised: one of OverrideNames() ("chatml", "chatml-bos", "llama3",
  // "llama3.1", "llama3.2", "llama2", "mistral-legacy-v0.1",
  // "mistral-legacy", "mistral-v1", "mistral-v3"), rendering as that known
  // template does; llama3.1/3.2 use Meta's cutoff "December 2023" and
  // default date "26 Jul 2024". INVALID_ARGUMENT for any other name.
  static absl::StatusOr<ChatTemplate> FromFamilyName(absl::string_view name,
                                                     std::string bos_token,
                                                     std::string eos_token);
  static std::vector<std::string> OverrideNames();

  // FromSource on the file's tokenizer.chat_template, with the BOS/EOS texts
  // taken from tokenizer.ggml.tokens at tokenizer.ggml.bos_token_id /
  // eos_token_id. NOT_FOUND when the file has no template;
  // FAILED_PRECONDITION when the template needs a BOS or EOS text the file
  // does not give.
  static absl::StatusOr<ChatTemplate> FromGguf(const GgufFile& file);

  // Renders `messages` as described in the file comment.
  absl::StatusOr<std::string> Render(
      absl::Span<const ChatMessage> messages, bool add_generation_prompt,
      const ChatRenderOptions& options = {}) const;

  ChatTemplateFamily family() const;
  absl::string_view family_name() const {
    return ChatTemplateFamilyName(family());
  }
  // The variant name of the file comment ("chatml-default-system", ...).
  absl::string_view variant_name() const;
  // True when the template itself outputs the BOS token text (llama2: in
  // front of every user turn), so the caller must not add a BOS.
  bool renders_bos() const;
  // The ChatML default system prompt read from the template, if any.
  const std::optional<std::string>& default_system_prompt() const {
    return default_system_;
  }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

  // The variants; public so that the implementation's tables can name them.
  enum class Variant : uint8_t;

 private:
  ChatTemplate(Variant variant, std::string bos_token, std::string eos_token)
      : variant_(variant),
        bos_token_(std::move(bos_token)),
        eos_token_(std::move(eos_token)) {}

  std::string RenderChatMl(absl::Span<const ChatMessage> messages,
                           bool add_generation_prompt) const;
  std::string RenderLlama3(absl::Span<const ChatMessage> messages,
                           bool add_generation_prompt) const;
  std::string RenderLlama31(absl::Span<const ChatMessage> messages,
                            bool add_generation_prompt,
                            const ChatRenderOptions& options) const;
  absl::StatusOr<std::string> RenderLlama2(
      absl::Span<const ChatMessage> messages) const;
  absl::StatusOr<std::string> RenderMistralLegacy(
      absl::Span<const ChatMessage> messages) const;
  absl::StatusOr<std::string> RenderMistralV1(
      absl::Span<const ChatMessage> messages) const;
  absl::StatusOr<std::string> RenderMistralV3(
      absl::Span<const ChatMessage> messages) const;

  Variant variant_;
  std::string bos_token_;
  std::string eos_token_;
  std::optional<std::string> default_system_;  // ChatML variants
  std::string knowledge_cutoff_;               // llama3.1 / llama3.2
  std::string default_date_;                   // llama3.1
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_CHAT_TEMPLATE_H_
