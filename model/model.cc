#include "model/model.h"

#include <xxhash.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/ggml_type.h"

namespace pdserve::model {
namespace {

// Bytes of each tensor that go into the fingerprint: enough to tell apart
// two quantizations or fine-tunes of one architecture, little enough that a
// 70B file fingerprints in milliseconds.
constexpr uint64_t kSampleBytes = 4096;

std::string Fingerprint(const GgufFile& file) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  for (const auto& [key, value] : file.metadata()) {
    XXH3_128bits_update(state, key.data(), key.size());
    std::string rendered = value.DebugString(/*max_elements=*/1u << 20);
    XXH3_128bits_update(state, rendered.data(), rendered.size());
  }
  for (const GgufTensorInfo& t : file.tensors()) {
    XXH3_128bits_update(state, t.name.data(), t.name.size());
    const uint32_t type = static_cast<uint32_t>(t.type);
    XXH3_128bits_update(state, &type, sizeof(type));
    XXH3_128bits_update(state, t.dims.data(), t.dims.size() * sizeof(uint64_t));
    const uint64_t head = std::min(t.n_bytes, kSampleBytes);
    if (head > 0) XXH3_128bits_update(state, t.data, head);
    if (t.n_bytes > head) {
      const uint64_t tail = std::min(t.n_bytes - head, kSampleBytes);
      XXH3_128bits_update(state, t.data + t.n_bytes - tail, tail);
    }
  }
  XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return absl::StrFormat("%016x%016x", h.high64, h.low64);
}

std::string Quantization(const GgufFile& file, const ModelWeights& w) {
  // llama.cpp's general.file_type values for the formats we run.
  if (file.HasMetadata("general.file_type")) {
    absl::StatusOr<uint32_t> ft = file.GetU32("general.file_type");
    static const std::map<uint32_t, const char*>* kNames =
        new std::map<uint32_t, const char*>{
            {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},
            {7, "Q8_0"},    {8, "Q5_0"},    {9, "Q5_1"},    {14, "Q4_K_S"},
            {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},
            {32, "BF16"}};
    if (ft.ok() && kNames->count(*ft)) return kNames->at(*ft);
  }
  std::map<std::string, uint64_t> bytes;
  for (const LayerWeights& l : w.layers) {
    for (const WeightMatrix* m :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      bytes[kernels::GgmlTypeName(m->type)] += m->row_bytes * m->rows;
    }
  }
  auto top = std::max_element(
      bytes.begin(), bytes.end(),
      [](const auto& a, const auto& b) { return a.second < b.second; });
  return top == bytes.end() ? "unknown" : top->first;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Open(const std::string& path) {
  std::unique_ptr<Model> m(new Model());
  PD_RETURN_IF_ERROR(m->OpenFile(path));
  PD_ASSIGN_OR_RETURN(m->weights_, ModelWeights::Load(m->file(), m->config()));
  PD_RETURN_IF_ERROR(m->LoadText(path));
  m->fingerprint_ = Fingerprint(m->file());
  absl::StatusOr<std::string> name = m->file().GetString("general.name");
  m->name_ = name.ok() ? *name : path.substr(path.find_last_of('/') + 1);
  m->quantization_ = Quantization(m->file(), m->weights_);
  return m;
}

}  // namespace pdserve::model
