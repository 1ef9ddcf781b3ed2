// ModelText: what a GGUF model file says about text, without its weights:
// hyperparameters, tokenizer and chat template, and prompt encoding with
// them. The router turns requests into tokens with it and so never links
// the kernels a model's weights need; Model (model.h) is a ModelText with
// the weights loaded.
//
// Ownership: owns the mapped file; config and tokenizer refer into it and
// live as long as the ModelText. Thread-safety: immutable after Open.
#ifndef PDSERVE_MODEL_MODEL_TEXT_H_
#define PDSERVE_MODEL_MODEL_TEXT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

namespace pdserve::model {

class ModelText {
 public:
  // Opens `path` and validates what this class reads of it. Errors name the
  // file and, where one is at fault, the metadata key.
  static absl::StatusOr<std::unique_ptr<ModelText>> Open(
      const std::string& path);
  virtual ~ModelText() = default;
  ModelText(const ModelText&) = delete;
  ModelText& operator=(const ModelText&) = delete;

  const GgufFile& file() const { return *file_; }
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Absent when the file has no tokenizer.chat_template; an error when it
  // has one we do not recognise (the message says which, and how to choose
  // a family explicitly).
  const absl::StatusOr<ChatTemplate>& chat_template() const {
    return chat_template_;
  }
  // Renders `messages` with the chat template and tokenizes the result
  // (special-token text such as <|im_start|> becomes its id). BOS is added
  // when the tokenizer wants one and the template does not write it itself,
  // so it is never doubled. Errors: no usable template, or messages the
  // template refuses (INVALID_ARGUMENT).
  absl::StatusOr<std::vector<TokenId>> EncodeChat(
      absl::Span<const ChatMessage> messages,
      bool add_generation_prompt = true) const;
  // Tokenizes a plain prompt with BOS/EOS as the model file asks.
  std::vector<TokenId> EncodePrompt(absl::string_view text) const;

 protected:
  ModelText() = default;
  // The two halves of Open, for Model to load the weights in between (so a
  // file's errors are reported in the order they always were): the file
  // and its hyperparameters; then the tokenizer and the chat template.
  absl::Status OpenFile(const std::string& path);
  absl::Status LoadText(const std::string& path);

 private:
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_ =
      absl::NotFoundError("no chat template");
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_MODEL_TEXT_H_
