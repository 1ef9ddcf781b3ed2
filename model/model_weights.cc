#include "model/model_weights.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/ggml_type.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

namespace pdserve::model {
namespace {

std::string Where(const GgufFile& file, absl::string_view tensor) {
  return absl::StrCat("tensor ", tensor, " in ", file.path());
}

absl::StatusOr<WeightMatrix> Matrix(const GgufFile& file,
                                    const std::string& name, int64_t rows,
                                    int64_t cols) {
  PD_ASSIGN_OR_RETURN(const GgufTensorInfo* t, file.FindTensor(name));
  if (t->dims.size() != 2 || static_cast<int64_t>(t->dims[0]) != cols ||
      static_cast<int64_t>(t->dims[1]) != rows) {
    std::string dims;
    for (uint64_t d : t->dims)
      absl::StrAppend(&dims, dims.empty() ? "" : "x", d);
    return absl::InvalidArgumentError(
        absl::StrCat(Where(file, name), " has dims ", dims, ", expected ", cols,
                     "x", rows, " (ggml order)"));
  }
  if (!kernels::VecDotType(t->type).ok()) {
    return absl::UnimplementedError(absl::StrCat(
        Where(file, name), " uses block format ",
        kernels::GgmlTypeName(t->type), ", which the kernels do not support"));
  }
  WeightMatrix m;
  m.name = name;
  m.type = t->type;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = t->n_bytes / rows;
  m.data = t->data;
  return m;
}

absl::StatusOr<std::vector<float>> Vector(const GgufFile& file,
                                          const std::string& name,
                                          int64_t size) {
  PD_ASSIGN_OR_RETURN(const GgufTensorInfo* t, file.FindTensor(name));
  if (static_cast<int64_t>(t->n_elements) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(file, name), " has ", t->n_elements,
                     " elements, expected ", size));
  }
  std::vector<float> out(size);
  absl::Status s = kernels::DequantizeRow(t->type, t->data, size, out.data());
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(file, name), ": ", s.message()));
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelWeights> ModelWeights::Load(const GgufFile& file,
                                                const ModelConfig& c) {
  ModelWeights w;
  PD_ASSIGN_OR_RETURN(w.token_embedding, Matrix(file, "token_embd.weight",
                                                c.vocab_size, c.hidden_size));
  PD_ASSIGN_OR_RETURN(w.output_norm,
                      Vector(file, "output_norm.weight", c.hidden_size));
  if (file.FindTensor("output.weight").ok()) {
    PD_ASSIGN_OR_RETURN(
        w.output, Matrix(file, "output.weight", c.vocab_size, c.hidden_size));
  } else {
    w.output = w.token_embedding;
    w.tied_output = true;
  }
  if (file.FindTensor("rope_freqs.weight").ok()) {
    PD_ASSIGN_OR_RETURN(w.rope_freq_factors,
                        Vector(file, "rope_freqs.weight", c.rope_dims / 2));
  }
  w.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerWeights& L = w.layers[l];
    PD_ASSIGN_OR_RETURN(L.attn_norm,
                        Vector(file, p + "attn_norm.weight", c.hidden_size));
    PD_ASSIGN_OR_RETURN(
        L.wq, Matrix(file, p + "attn_q.weight", c.q_size(), c.hidden_size));
    PD_ASSIGN_OR_RETURN(
        L.wk, Matrix(file, p + "attn_k.weight", c.kv_size(), c.hidden_size));
    PD_ASSIGN_OR_RETURN(
        L.wv, Matrix(file, p + "attn_v.weight", c.kv_size(), c.hidden_size));
    PD_ASSIGN_OR_RETURN(L.wo, Matrix(file, p + "attn_output.weight",
                                     c.hidden_size, c.q_size()));
    if (c.has_qkv_bias) {
      PD_ASSIGN_OR_RETURN(L.bq, Vector(file, p + "attn_q.bias", c.q_size()));
      PD_ASSIGN_OR_RETURN(L.bk, Vector(file, p + "attn_k.bias", c.kv_size()));
      PD_ASSIGN_OR_RETURN(L.bv, Vector(file, p + "attn_v.bias", c.kv_size()));
    }
    PD_ASSIGN_OR_RETURN(L.ffn_norm,
                        Vector(file, p + "ffn_norm.weight", c.hidden_size));
    PD_ASSIGN_OR_RETURN(L.ffn_gate, Matrix(file, p + "ffn_gate.weight",
                                           c.ffn_size, c.hidden_size));
    PD_ASSIGN_OR_RETURN(
        L.ffn_up, Matrix(file, p + "ffn_up.weight", c.ffn_size, c.hidden_size));
    PD_ASSIGN_OR_RETURN(L.ffn_down, Matrix(file, p + "ffn_down.weight",
                                           c.hidden_size, c.ffn_size));
    for (const WeightMatrix* m :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      w.matrix_bytes += m->row_bytes * m->rows;
    }
  }
  w.matrix_bytes += w.output.row_bytes * w.output.rows;
  return w;
}

}  // namespace pdserve::model
