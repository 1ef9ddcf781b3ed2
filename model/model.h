// Model: everything the engine needs from one GGUF file — hyperparameters,
// weights, tokenizer, chat template and an identity — loaded together.
//
// The fingerprint identifies the weights and tokenizer without reading the
// whole file (models run to tens of GiB): XXH3 over the metadata, the tensor
// directory and a sample of every tensor's bytes. Two workers agree on it
// exactly when they serve the same file, which is what KV transfer and
// routing need to know (v1::KvLayout.model_fingerprint).
//
// Ownership: owns the mapped file; config, weights and tokenizer refer into
// it and live as long as the Model. Thread-safety: immutable after Open.
#ifndef PDSERVE_MODEL_MODEL_H_
#define PDSERVE_MODEL_MODEL_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "model/tokenizer.h"

namespace pdserve::model {

class Model {
 public:
  // Opens and validates `path`. Errors name the file and, where one is at
  // fault, the tensor or metadata key.
  static absl::StatusOr<std::unique_ptr<Model>> Open(const std::string& path);

  const GgufFile& file() const { return *file_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
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

  const std::string& fingerprint() const { return fingerprint_; }
  // general.name, or the file's base name.
  const std::string& name() const { return name_; }
  // Weight format summary as llama.cpp names file types, e.g. "Q4_1",
  // falling back to the most common matrix block format.
  const std::string& quantization() const { return quantization_; }

 private:
  Model() = default;

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_ =
      absl::NotFoundError("no chat template");
  std::string fingerprint_;
  std::string name_;
  std::string quantization_;
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_MODEL_H_
