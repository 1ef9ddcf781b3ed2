#include "model/tiny_model.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ggml_type.h"
#include "kernels/quant.h"
#include "model/gguf_writer.h"
#include "model/unicode.h"

namespace pdserve::model {

using kernels::GgmlType;
using kernels::GgmlTypeBytes;
using kernels::GgmlTypeName;

namespace {

// splitmix64: tiny, and identical everywhere (std:: distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() {
    return static_cast<float>((Next() >> 40) * (1.0 / (1 << 23)) - 1.0);
  }
  uint8_t Byte() { return static_cast<uint8_t>(Next() >> 56); }

 private:
  uint64_t state_;
};

void PutF16(std::vector<uint8_t>& out, size_t at, float v) {
  uint16_t h = kernels::Fp32ToFp16(v);
  std::memcpy(out.data() + at, &h, 2);
}

// Random blocks of `type` whose elements have a standard deviation of about
// `stddev` and mean about 0. Any bit pattern is a valid quantized value, so
// the quants are random bytes and only the scales are chosen.
absl::StatusOr<std::vector<uint8_t>> RandomTensor(GgmlType type, int64_t rows,
                                                  int64_t cols, float stddev,
                                                  Rng& rng) {
  const int64_t n = rows * cols;
  PD_ASSIGN_OR_RETURN(uint64_t bytes, GgmlTypeBytes(type, n));
  std::vector<uint8_t> out(bytes);
  for (auto& b : out) b = rng.Byte();
  auto jitter = [&] { return 1.0f + 0.25f * rng.Symmetric(); };
  switch (type) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < n; ++i) {
        float v = stddev * 1.7f * rng.Symmetric();
        std::memcpy(out.data() + 4 * i, &v, 4);
      }
      return out;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        PutF16(out, 2 * i, stddev * 1.7f * rng.Symmetric());
      }
      return out;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        float v = stddev * 1.7f * rng.Symmetric();
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t top = static_cast<uint16_t>(bits >> 16);
        std::memcpy(out.data() + 2 * i, &top, 2);
      }
      return out;
    case GgmlType::kQ8_0:  // d; q in [-128, 127] (std ~74)
      for (size_t b = 0; b < out.size(); b += 34) {
        PutF16(out, b, stddev / 74.0f * jitter());
      }
      return out;
    case GgmlType::kQ4_0:  // d; x = d*(q-8), q in [0, 15] (std ~4.6)
      for (size_t b = 0; b < out.size(); b += 18) {
        PutF16(out, b, stddev / 4.6f * jitter());
      }
      return out;
    case GgmlType::kQ4_1:  // d, m; x = d*q + m
      for (size_t b = 0; b < out.size(); b += 20) {
        float d = stddev / 4.6f * jitter();
        PutF16(out, b, d);
        PutF16(out, b + 2, -7.5f * d);
      }
      return out;
    case GgmlType::kQ5_0:  // d; x = d*(q-16), q in [0, 31] (std ~9.2)
      for (size_t b = 0; b < out.size(); b += 22) {
        PutF16(out, b, stddev / 9.2f * jitter());
      }
      return out;
    case GgmlType::kQ5_1:
      for (size_t b = 0; b < out.size(); b += 24) {
        float d = stddev / 9.2f * jitter();
        PutF16(out, b, d);
        PutF16(out, b + 2, -15.5f * d);
      }
      return out;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      // x = d*sc*q - dmin*m with 6-bit sc, m (mean ~31.5) and q of 4 or 5
      // bits: dmin = d * mean(q) makes the sub-block means cancel on average.
      const size_t block = type == GgmlType::kQ4_K ? 144 : 176;
      const float q_mean = type == GgmlType::kQ4_K ? 7.5f : 15.5f;
      const float q_std = type == GgmlType::kQ4_K ? 4.6f : 9.2f;
      for (size_t b = 0; b < out.size(); b += block) {
        float d = stddev / (q_std * 36.0f) * jitter();
        PutF16(out, b, d);
        PutF16(out, b + 2, d * q_mean);
      }
      return out;
    }
    case GgmlType::kQ6_K:  // x = d*sc*(q-32), sc int8 (std ~74), q 6 bits
      for (size_t b = 0; b < out.size(); b += 210) {
        PutF16(out, b + 208, stddev / (18.5f * 74.0f) * jitter());
      }
      return out;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tiny models do not support block format ", GgmlTypeName(type)));
  }
}

// The 256 byte tokens of a byte-level BPE vocabulary, in byte order.
std::vector<std::string> ByteTokens() {
  std::vector<std::string> tokens(256);
  for (int b = 0; b < 256; ++b) tokens[b] = ByteToUnicodeUtf8(b);
  return tokens;
}

}  // namespace

absl::StatusOr<TinyModelOptions> TinyModelPreset(absl::string_view name) {
  TinyModelOptions o;
  // "<arch>-<format>": the matrices in that format, small dimensions unless
  // the format's 256-element super-blocks need wider rows (or the arch is
  // llama1b).
  const size_t dash = name.find('-');
  if (dash == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tiny model preset ", name));
  }
  const absl::string_view arch = name.substr(0, dash);
  const absl::string_view format = name.substr(dash + 1);
  if (arch == "llama") {
  } else if (arch == "qwen2") {
    o.architecture = "qwen2";
    o.tied_output = false;
    o.embedding_type = GgmlType::kF16;
  } else if (arch == "llama3") {
    o.rope_freq_factors = true;
    o.rope_freq_base = 500000.0f;
    o.num_heads = 8;
    o.tied_output = false;
  } else if (arch == "llama1b") {
    // Llama-3.2-1B's matrices, for benchmarks where the default model is
    // small enough to sit partly in cache: 16 layers, width 2048, FFN 8192,
    // 32 query and 8 KV heads, rope_freqs, tied Q8_0 embeddings. Only the
    // vocabulary stays tiny, so its output head is negligible where the
    // real model's (128256 rows) is a fifth to a third of the bytes a
    // decode step reads.
    o.num_layers = 16;
    o.hidden_size = 2048;
    o.ffn_size = 8192;
    o.num_heads = 32;
    o.num_kv_heads = 8;
    o.context_length = 2048;
    o.rope_freq_factors = true;
    o.rope_freq_base = 500000.0f;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tiny model preset ", name));
  }
  static const std::pair<const char*, GgmlType> kFormats[] = {
      {"f32", GgmlType::kF32},   {"f16", GgmlType::kF16},
      {"bf16", GgmlType::kBF16}, {"q8_0", GgmlType::kQ8_0},
      {"q4_0", GgmlType::kQ4_0}, {"q4_1", GgmlType::kQ4_1},
      {"q5_0", GgmlType::kQ5_0}, {"q5_1", GgmlType::kQ5_1},
      {"q4_k", GgmlType::kQ4_K}, {"q5_k", GgmlType::kQ5_K},
      {"q6_k", GgmlType::kQ6_K}};
  for (const auto& [fname, type] : kFormats) {
    if (format != fname) continue;
    o.matrix_type = type;
    if (format.back() == 'k' && o.hidden_size < 256) {
      o.hidden_size = 256;
      o.ffn_size = 512;
      o.embedding_type = GgmlType::kQ6_K;
    }
    return o;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tiny model preset ", name));
}

absl::Status WriteTinyModel(const TinyModelOptions& o,
                            const std::string& path) {
  if (o.architecture != "llama" && o.architecture != "qwen2") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tiny model architecture ", o.architecture));
  }
  if (o.num_heads <= 0 || o.num_kv_heads <= 0 ||
      o.num_heads % o.num_kv_heads != 0 || o.hidden_size % o.num_heads != 0) {
    return absl::InvalidArgumentError("bad tiny model head counts");
  }
  const int32_t head_dim = o.hidden_size / o.num_heads;
  const int32_t kv_size = head_dim * o.num_kv_heads;

  // Vocabulary: bytes, merges, then the ChatML control tokens.
  std::vector<std::string> tokens = ByteTokens();
  const std::vector<std::string> merges = {
      "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s",
      "r e", "a t", "e n",   "o r", "Ġ o", "Ġ w", "i s", "Ġ c"};
  for (const std::string& m : merges) {
    std::string merged = m;
    merged.erase(merged.find(' '), 1);
    tokens.push_back(merged);
  }
  const int32_t im_start = tokens.size();
  tokens.push_back("<|im_start|>");
  const int32_t im_end = tokens.size();
  tokens.push_back("<|im_end|>");
  std::vector<int32_t> token_types(tokens.size(), 1);  // normal
  token_types[im_start] = 3;                           // control
  token_types[im_end] = 3;
  const int32_t vocab = tokens.size();

  PD_ASSIGN_OR_RETURN(std::unique_ptr<GgufWriter> w, GgufWriter::Create());
  const std::string a = o.architecture + ".";
  PD_RETURN_IF_ERROR(w->AddMetadata("general.architecture", o.architecture));
  PD_RETURN_IF_ERROR(w->AddMetadata(
      "general.name",
      absl::StrCat("pdserve tiny ", o.architecture, " seed ", o.seed)));
  PD_RETURN_IF_ERROR(
      w->AddMetadata(a + "block_count", static_cast<uint32_t>(o.num_layers)));
  PD_RETURN_IF_ERROR(w->AddMetadata(a + "context_length",
                                    static_cast<uint32_t>(o.context_length)));
  PD_RETURN_IF_ERROR(w->AddMetadata(a + "embedding_length",
                                    static_cast<uint32_t>(o.hidden_size)));
  PD_RETURN_IF_ERROR(w->AddMetadata(a + "feed_forward_length",
                                    static_cast<uint32_t>(o.ffn_size)));
  PD_RETURN_IF_ERROR(w->AddMetadata(a + "attention.head_count",
                                    static_cast<uint32_t>(o.num_heads)));
  PD_RETURN_IF_ERROR(w->AddMetadata(a + "attention.head_count_kv",
                                    static_cast<uint32_t>(o.num_kv_heads)));
  PD_RETURN_IF_ERROR(
      w->AddMetadata(a + "attention.layer_norm_rms_epsilon", 1e-5f));
  if (o.sliding_window > 0) {
    PD_RETURN_IF_ERROR(w->AddMetadata(a + "attention.sliding_window",
                                      static_cast<uint32_t>(o.sliding_window)));
  }
  if (o.sliding_window_pattern > 0) {
    PD_RETURN_IF_ERROR(
        w->AddMetadata(a + "attention.sliding_window_pattern",
                       static_cast<uint32_t>(o.sliding_window_pattern)));
  }
  PD_RETURN_IF_ERROR(w->AddMetadata(a + "rope.freq_base", o.rope_freq_base));
  PD_RETURN_IF_ERROR(w->AddMetadata(a + "rope.dimension_count",
                                    static_cast<uint32_t>(head_dim)));
  PD_RETURN_IF_ERROR(
      w->AddMetadata(a + "vocab_size", static_cast<uint32_t>(vocab)));
  PD_RETURN_IF_ERROR(w->AddMetadata("general.file_type", uint32_t{1}));
  PD_RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.model", "gpt2"));
  PD_RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.pre", "default"));
  PD_RETURN_IF_ERROR(
      w->AddMetadata("tokenizer.ggml.tokens", GgufValue::ArrayOf(tokens)));
  PD_RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.token_type",
                                    GgufValue::ArrayOf(token_types)));
  PD_RETURN_IF_ERROR(
      w->AddMetadata("tokenizer.ggml.merges", GgufValue::ArrayOf(merges)));
  PD_RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.bos_token_id",
                                    static_cast<uint32_t>(im_start)));
  PD_RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.eos_token_id",
                                    static_cast<uint32_t>(im_end)));
  PD_RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.add_bos_token", false));
  PD_RETURN_IF_ERROR(w->AddMetadata(
      "tokenizer.chat_template",
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
      "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
      "{% endif %}"));

  Rng rng(o.seed);
  auto add_matrix = [&](const std::string& name, GgmlType type, int64_t rows,
                        int64_t cols, float stddev) -> absl::Status {
    PD_ASSIGN_OR_RETURN(std::vector<uint8_t> data,
                        RandomTensor(type, rows, cols, stddev, rng));
    return w->AddTensor(
        name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, type,
        data);
  };
  auto add_vector = [&](const std::string& name, int64_t n, float center,
                        float spread) -> absl::Status {
    std::vector<float> v(n);
    for (float& x : v) x = center + spread * rng.Symmetric();
    return w->AddF32Tensor(name, {static_cast<uint64_t>(n)}, v);
  };

  // Matrices scaled so each output has variance ~1 for unit-variance input.
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(o.hidden_size));
  const float ffn_scale = 1.0f / std::sqrt(static_cast<float>(o.ffn_size));
  PD_RETURN_IF_ERROR(add_matrix("token_embd.weight", o.embedding_type, vocab,
                                o.hidden_size, 1.0f));
  PD_RETURN_IF_ERROR(
      add_vector("output_norm.weight", o.hidden_size, 1.0f, 0.2f));
  if (!o.tied_output) {
    PD_RETURN_IF_ERROR(add_matrix("output.weight", o.embedding_type, vocab,
                                  o.hidden_size, in_scale * 2));
  }
  if (o.rope_freq_factors) {
    // Shaped like llama3 scaling: high frequencies untouched, low ones
    // divided by up to 8.
    std::vector<float> f(head_dim / 2);
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = 1.0f + 7.0f * i / (f.size() - 1);
    }
    PD_RETURN_IF_ERROR(w->AddF32Tensor("rope_freqs.weight",
                                       {static_cast<uint64_t>(f.size())}, f));
  }
  for (int l = 0; l < o.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    PD_RETURN_IF_ERROR(
        add_vector(p + "attn_norm.weight", o.hidden_size, 1.0f, 0.2f));
    PD_RETURN_IF_ERROR(add_matrix(p + "attn_q.weight", o.matrix_type,
                                  o.hidden_size, o.hidden_size, in_scale * 2));
    PD_RETURN_IF_ERROR(add_matrix(p + "attn_k.weight", o.matrix_type, kv_size,
                                  o.hidden_size, in_scale * 2));
    PD_RETURN_IF_ERROR(add_matrix(p + "attn_v.weight", o.matrix_type, kv_size,
                                  o.hidden_size, in_scale));
    if (o.architecture == "qwen2") {
      PD_RETURN_IF_ERROR(add_vector(p + "attn_q.bias", o.hidden_size, 0, 0.5f));
      PD_RETURN_IF_ERROR(add_vector(p + "attn_k.bias", kv_size, 0, 0.5f));
      PD_RETURN_IF_ERROR(add_vector(p + "attn_v.bias", kv_size, 0, 0.5f));
    }
    PD_RETURN_IF_ERROR(add_matrix(p + "attn_output.weight", o.matrix_type,
                                  o.hidden_size, o.hidden_size, in_scale));
    PD_RETURN_IF_ERROR(
        add_vector(p + "ffn_norm.weight", o.hidden_size, 1.0f, 0.2f));
    PD_RETURN_IF_ERROR(add_matrix(p + "ffn_gate.weight", o.matrix_type,
                                  o.ffn_size, o.hidden_size, in_scale * 2));
    PD_RETURN_IF_ERROR(add_matrix(p + "ffn_up.weight", o.matrix_type,
                                  o.ffn_size, o.hidden_size, in_scale));
    PD_RETURN_IF_ERROR(add_matrix(p + "ffn_down.weight", o.matrix_type,
                                  o.hidden_size, o.ffn_size, ffn_scale));
  }
  return w->WriteFile(path);
}

}  // namespace pdserve::model
