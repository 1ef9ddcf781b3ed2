#include "model/model_text.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pdserve::model {

absl::StatusOr<std::unique_ptr<ModelText>> ModelText::Open(
    const std::string& path) {
  std::unique_ptr<ModelText> m(new ModelText());
  PD_RETURN_IF_ERROR(m->OpenFile(path));
  PD_RETURN_IF_ERROR(m->LoadText(path));
  return m;
}

absl::Status ModelText::OpenFile(const std::string& path) {
  PD_ASSIGN_OR_RETURN(file_, GgufFile::Open(path));
  PD_ASSIGN_OR_RETURN(config_, ModelConfig::FromGguf(*file_));
  return absl::OkStatus();
}

absl::Status ModelText::LoadText(const std::string& path) {
  PD_ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromGguf(*file_));
  if (tokenizer_->vocab_size() != config_.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer has ", tokenizer_->vocab_size(),
                     " tokens but the model's vocabulary is ",
                     config_.vocab_size, " in ", path));
  }
  if (file_->HasMetadata("tokenizer.chat_template")) {
    chat_template_ = ChatTemplate::FromGguf(*file_);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenId>> ModelText::EncodeChat(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  if (!chat_template_.ok()) return chat_template_.status();
  PD_ASSIGN_OR_RETURN(std::string text,
                      chat_template_->Render(messages, add_generation_prompt));
  std::vector<TokenId> ids =
      tokenizer_->Encode(text, /*add_special=*/false, /*parse_special=*/true);
  if (tokenizer_->add_bos() && tokenizer_->bos_id() >= 0 &&
      !chat_template_->renders_bos()) {
    ids.insert(ids.begin(), tokenizer_->bos_id());
  }
  return ids;
}

std::vector<TokenId> ModelText::EncodePrompt(absl::string_view text) const {
  return tokenizer_->Encode(text, /*add_special=*/true,
                            /*parse_special=*/false);
}

}  // namespace pdserve::model
