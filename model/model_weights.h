// ModelWeights: the tensors of a llama/qwen2 model, located in a mapped GGUF
// file and checked against the model's configuration.
//
// Weight matrices stay in their quantized form inside the file mapping
// (dequantizing a model at load multiplies its memory and the bytes every
// decode step reads); only the small vectors (norm weights, biases, RoPE
// frequency factors) are converted to float copies, whatever type the file
// stores them in.
//
// Ownership: a ModelWeights borrows the GgufFile it was loaded from (the
// matrices point into its mapping), which must outlive it.
// Thread-safety: immutable after Load; safe to share between threads.
#ifndef PDSERVE_MODEL_MODEL_WEIGHTS_H_
#define PDSERVE_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ggml_type.h"
#include "model/gguf.h"
#include "model/model_config.h"

namespace pdserve::model {

// A [rows x cols] weight matrix in a GGUF block format, row-major: row r is
// the row_bytes bytes at data + r * row_bytes.
struct WeightMatrix {
  std::string name;
  kernels::GgmlType type = kernels::GgmlType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t row_bytes = 0;
  const uint8_t* data = nullptr;

  const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  WeightMatrix wq;               // [q_size x hidden]
  WeightMatrix wk;               // [kv_size x hidden]
  WeightMatrix wv;               // [kv_size x hidden]
  WeightMatrix wo;               // [hidden x q_size]
  // qwen2 only (empty otherwise).
  std::vector<float> bq, bk, bv;
  std::vector<float> ffn_norm;  // [hidden]
  WeightMatrix ffn_gate;        // [ffn x hidden]
  WeightMatrix ffn_up;          // [ffn x hidden]
  WeightMatrix ffn_down;        // [hidden x ffn]
};

struct ModelWeights {
  WeightMatrix token_embedding;  // [vocab x hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm;  // [hidden]
  // [vocab x hidden]; the token embedding when the file has no output.weight
  // (tied embeddings).
  WeightMatrix output;
  bool tied_output = false;
  // Per-pair RoPE frequency divisors (llama3 scaling), rope_dims / 2 of
  // them; empty when the file has none.
  std::vector<float> rope_freq_factors;

  // Bytes of weight data one decode step reads (every matrix once, the
  // embedding row aside): the numerator of the decode roofline.
  uint64_t matrix_bytes = 0;

  // Locates and validates every tensor. Errors (naming file and tensor): a
  // missing tensor, a shape that disagrees with `config`, a block format the
  // kernels do not support.
  static absl::StatusOr<ModelWeights> Load(const GgufFile& file,
                                           const ModelConfig& config);
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_MODEL_WEIGHTS_H_
