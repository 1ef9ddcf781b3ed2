// ModelConfig: a transformer's hyperparameters, read from GGUF metadata.
//
// Every number the forward pass needs comes from the file ("{arch}.*" keys,
// as llama.cpp's converter writes them), never from a table of known models.
// Supported architectures:
//   llama  Llama 2, Llama 3.x, SmolLM2, TinyLlama, Mistral-style models:
//          GQA, RMSNorm, SwiGLU, RoPE on adjacent element pairs (the
//          converter permutes Q/K weights for that), optional per-dimension
//          RoPE frequency factors (the `rope_freqs.weight` tensor that Llama
//          3.1+ files carry for llama3 RoPE scaling), linear RoPE scaling.
//   qwen2  As llama plus Q/K/V biases, with NeoX-style RoPE (first half /
//          second half pairs).
// Anything else, and features we do not implement (YaRN scaling, per-layer
// head counts, ALiBi), is refused with an error naming the file and key.
//
// Value type; thread-safe after construction.
#ifndef PDSERVE_MODEL_MODEL_CONFIG_H_
#define PDSERVE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/gguf.h"

namespace pdserve::model {

enum class ModelArch { kLlama, kQwen2 };

// How RoPE pairs the elements of a head.
enum class RopeStyle {
  kAdjacentPairs,  // (x[2i], x[2i+1]): ggml's "normal" mode (llama)
  kHalves,         // (x[i], x[i + dims/2]): ggml's NeoX mode (qwen2)
};

struct ModelConfig {
  std::string architecture;  // general.architecture as written
  ModelArch arch = ModelArch::kLlama;
  int32_t num_layers = 0;
  int32_t hidden_size = 0;  // embedding length
  int32_t ffn_size = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  float rms_norm_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  // Positions are multiplied by this before rotation (1 / linear factor).
  float rope_freq_scale = 1.0f;
  // Leading elements of each head that RoPE rotates (the rest pass through).
  int32_t rope_dims = 0;
  RopeStyle rope_style = RopeStyle::kAdjacentPairs;
  bool has_qkv_bias = false;
  // Sliding-window attention ("{arch}.attention.sliding_window", llama.cpp's
  // key; 0 or absent: full attention). A query at position p attends the
  // keys k with p - k < sliding_window, itself included: llama.cpp's
  // standard SWA masks when p - k >= n_swa. Which layers are windowed:
  // every one, unless "{arch}.attention.sliding_window_pattern" (uint32 N,
  // as llama.cpp's Gemma 2/3 use it) is present, in which case layer l is
  // windowed when l % N < N - 1 (every Nth layer attends the whole context).
  int32_t sliding_window = 0;
  int32_t sliding_window_pattern = 0;

  int32_t q_size() const { return num_heads * head_dim; }
  int32_t kv_size() const { return num_kv_heads * head_dim; }
  // The window of layer `layer` (0: the whole context).
  int32_t LayerWindow(int layer) const {
    if (sliding_window <= 0) return 0;
    if (sliding_window_pattern > 1 &&
        layer % sliding_window_pattern == sliding_window_pattern - 1) {
      return 0;
    }
    return sliding_window;
  }

  // Reads and validates the metadata. Errors name the file and the key.
  static absl::StatusOr<ModelConfig> FromGguf(const GgufFile& file);
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_MODEL_CONFIG_H_
