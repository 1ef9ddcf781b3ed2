#include "model/model_config.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pdserve::model {
namespace {

// An optional key: its value, `fallback` when absent, an error when present
// with a bad type.
template <typename T, typename Getter>
absl::StatusOr<T> Optional(const GgufFile& file, const std::string& key,
                           T fallback, Getter getter) {
  if (!file.HasMetadata(key)) return fallback;
  return (file.*getter)(key);
}

absl::Status Invalid(const GgufFile& file, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " in ", file.path()));
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& file) {
  ModelConfig c;
  PD_ASSIGN_OR_RETURN(c.architecture, file.architecture());
  if (c.architecture == "llama") {
    c.arch = ModelArch::kLlama;
    c.rope_style = RopeStyle::kAdjacentPairs;
  } else if (c.architecture == "qwen2") {
    c.arch = ModelArch::kQwen2;
    c.rope_style = RopeStyle::kHalves;
    c.has_qkv_bias = true;
  } else {
    return Invalid(file,
                   absl::StrCat("unsupported architecture '", c.architecture,
                                "' (supported: llama, qwen2)"));
  }
  const std::string a = c.architecture + ".";

  // Per-layer head counts are stored as arrays; we need one count.
  for (const char* key : {"attention.head_count", "attention.head_count_kv"}) {
    const GgufValue* v = file.FindMetadata(a + key);
    if (v != nullptr && v->array() != nullptr) {
      return Invalid(file, absl::StrCat("key ", a, key,
                                        " varies per layer, which is not "
                                        "supported"));
    }
  }
  PD_ASSIGN_OR_RETURN(uint32_t layers, file.GetU32(a + "block_count"));
  PD_ASSIGN_OR_RETURN(uint32_t hidden, file.GetU32(a + "embedding_length"));
  PD_ASSIGN_OR_RETURN(uint32_t ffn, file.GetU32(a + "feed_forward_length"));
  PD_ASSIGN_OR_RETURN(uint32_t heads, file.GetU32(a + "attention.head_count"));
  PD_ASSIGN_OR_RETURN(uint32_t kv_heads,
                      Optional<uint32_t>(file, a + "attention.head_count_kv",
                                         heads, &GgufFile::GetU32));
  PD_ASSIGN_OR_RETURN(uint32_t ctx, file.GetU32(a + "context_length"));
  if (layers == 0 || hidden == 0 || ffn == 0 || heads == 0 || kv_heads == 0 ||
      ctx == 0) {
    return Invalid(file, "a zero layer, width, head or context count");
  }
  if (heads % kv_heads != 0) {
    return Invalid(file, absl::StrCat(heads,
                                      " query heads are not a multiple "
                                      "of ",
                                      kv_heads, " KV heads"));
  }
  PD_ASSIGN_OR_RETURN(uint32_t head_dim,
                      Optional<uint32_t>(file, a + "attention.key_length",
                                         hidden / heads, &GgufFile::GetU32));
  PD_ASSIGN_OR_RETURN(uint32_t value_dim,
                      Optional<uint32_t>(file, a + "attention.value_length",
                                         head_dim, &GgufFile::GetU32));
  if (value_dim != head_dim || head_dim == 0 || head_dim % 2 != 0) {
    return Invalid(file, absl::StrCat("unsupported head sizes (key ", head_dim,
                                      ", value ", value_dim, ")"));
  }
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.ffn_size = ffn;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.context_length = ctx;

  PD_ASSIGN_OR_RETURN(c.rms_norm_eps,
                      file.GetF32(a + "attention.layer_norm_rms_epsilon"));
  PD_ASSIGN_OR_RETURN(
      c.rope_freq_base,
      Optional<float>(file, a + "rope.freq_base", 10000.0f, &GgufFile::GetF32));
  PD_ASSIGN_OR_RETURN(uint32_t rope_dims,
                      Optional<uint32_t>(file, a + "rope.dimension_count",
                                         head_dim, &GgufFile::GetU32));
  if (rope_dims == 0 || rope_dims > head_dim || rope_dims % 2 != 0) {
    return Invalid(file, absl::StrCat("bad rope.dimension_count ", rope_dims));
  }
  c.rope_dims = rope_dims;

  // RoPE scaling. llama3-style scaling reaches us as the rope_freqs tensor
  // (handled with the weights); here only the scalar kinds.
  PD_ASSIGN_OR_RETURN(std::string scaling,
                      Optional<std::string>(file, a + "rope.scaling.type",
                                            "none", &GgufFile::GetString));
  if (scaling == "linear") {
    PD_ASSIGN_OR_RETURN(float factor, file.GetF32(a + "rope.scaling.factor"));
    if (!(factor > 0)) return Invalid(file, "rope.scaling.factor <= 0");
    c.rope_freq_scale = 1.0f / factor;
  } else if (scaling != "none" && scaling != "llama3") {
    return Invalid(file, absl::StrCat("unsupported RoPE scaling '", scaling,
                                      "' (supported: none, linear, llama3)"));
  } else if (file.HasMetadata(a + "rope.scale_linear")) {
    // Older converters wrote the linear factor under this key.
    PD_ASSIGN_OR_RETURN(float factor, file.GetF32(a + "rope.scale_linear"));
    if (!(factor > 0)) return Invalid(file, "rope.scale_linear <= 0");
    c.rope_freq_scale = 1.0f / factor;
  }

  PD_ASSIGN_OR_RETURN(uint32_t window,
                      Optional<uint32_t>(file, a + "attention.sliding_window",
                                         0u, &GgufFile::GetU32));
  PD_ASSIGN_OR_RETURN(
      uint32_t window_pattern,
      Optional<uint32_t>(file, a + "attention.sliding_window_pattern", 0u,
                         &GgufFile::GetU32));
  if (window > static_cast<uint32_t>(INT32_MAX) ||
      window_pattern > static_cast<uint32_t>(INT32_MAX)) {
    return Invalid(file, "attention.sliding_window out of range");
  }
  c.sliding_window = static_cast<int32_t>(window);
  c.sliding_window_pattern = static_cast<int32_t>(window_pattern);

  // Vocabulary size: the explicit key, else the token list.
  if (file.HasMetadata(a + "vocab_size")) {
    PD_ASSIGN_OR_RETURN(uint32_t vocab, file.GetU32(a + "vocab_size"));
    c.vocab_size = vocab;
  } else {
    PD_ASSIGN_OR_RETURN(const GgufArray* tokens,
                        file.GetArray("tokenizer.ggml.tokens"));
    c.vocab_size = static_cast<int32_t>(tokens->size());
  }
  if (c.vocab_size <= 0) return Invalid(file, "empty vocabulary");
  return c;
}

}  // namespace pdserve::model
