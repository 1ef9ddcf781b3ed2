// Model: everything the engine needs from one GGUF file — hyperparameters,
// weights, tokenizer, chat template and an identity — loaded together. The
// text side (config, tokenizer, chat template, prompt encoding) is
// ModelText's, which a Model is; what only a Model has is the weights and
// what is derived from them.
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
#include <string>

#include "absl/status/statusor.h"
#include "model/model_text.h"
#include "model/model_weights.h"

namespace pdserve::model {

class Model : public ModelText {
 public:
  // Opens and validates `path`. Errors name the file and, where one is at
  // fault, the tensor or metadata key.
  static absl::StatusOr<std::unique_ptr<Model>> Open(const std::string& path);

  const ModelWeights& weights() const { return weights_; }

  const std::string& fingerprint() const { return fingerprint_; }
  // general.name, or the file's base name.
  const std::string& name() const { return name_; }
  // Weight format summary as llama.cpp names file types, e.g. "Q4_1",
  // falling back to the most common matrix block format.
  const std::string& quantization() const { return quantization_; }

 private:
  Model() = default;

  ModelWeights weights_;
  std::string fingerprint_;
  std::string name_;
  std::string quantization_;
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_MODEL_H_
