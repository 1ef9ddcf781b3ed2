// pd-make-tiny-model: writes a random-weight GGUF model (model/tiny_model.h)
// so that tools outside the project (llama.cpp, for reference outputs) can
// load exactly the file the engine tests generate.
//
//   pd-make-tiny-model --out /tmp/tiny.gguf --arch qwen2 --type q4_k
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "kernels/ggml_type.h"
#include "model/tiny_model.h"

ABSL_FLAG(std::string, out, "", "Output file (required)");
ABSL_FLAG(std::string, preset, "",
          "A named option set (see tiny_model.h); other flags are ignored");
ABSL_FLAG(std::string, arch, "llama", "llama or qwen2");
ABSL_FLAG(std::string, type, "q4_1", "Block format of the matrices");
ABSL_FLAG(std::string, embedding_type, "q8_0", "Block format of embeddings");
ABSL_FLAG(int32_t, layers, 2, "Layers");
ABSL_FLAG(int32_t, hidden, 64, "Embedding width (256 for K-quants)");
ABSL_FLAG(int32_t, ffn, 128, "FFN width");
ABSL_FLAG(int32_t, heads, 4, "Query heads");
ABSL_FLAG(int32_t, kv_heads, 2, "KV heads");
ABSL_FLAG(bool, tied, true, "Tie the output to the token embedding");
ABSL_FLAG(bool, rope_freqs, false, "Add a llama3-style rope_freqs tensor");
ABSL_FLAG(int32_t, sliding_window, 0,
          "Declare sliding-window attention of this many tokens (0: none)");
ABSL_FLAG(int32_t, sliding_window_pattern, 0,
          "With --sliding_window: every Nth layer attends the whole context");
ABSL_FLAG(uint64_t, seed, 1, "Weights seed");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // ggml names are lower case but for the K of K-quants ("q4_K").
  auto parse_type = [](std::string name) {
    name = absl::AsciiStrToLower(name);
    if (name.size() > 2 && name.substr(name.size() - 2) == "_k") {
      name.back() = 'K';
    }
    return pdserve::kernels::GgmlTypeFromName(name);
  };
  pdserve::model::TinyModelOptions o;
  o.architecture = absl::GetFlag(FLAGS_arch);
  auto matrix = parse_type(absl::GetFlag(FLAGS_type));
  auto emb = parse_type(absl::GetFlag(FLAGS_embedding_type));
  if (!matrix.ok() || !emb.ok()) {
    std::cerr << "pd-make-tiny-model: unknown block format\n";
    return 2;
  }
  o.matrix_type = *matrix;
  o.embedding_type = *emb;
  o.num_layers = absl::GetFlag(FLAGS_layers);
  o.hidden_size = absl::GetFlag(FLAGS_hidden);
  o.ffn_size = absl::GetFlag(FLAGS_ffn);
  o.num_heads = absl::GetFlag(FLAGS_heads);
  o.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  o.tied_output = absl::GetFlag(FLAGS_tied);
  o.rope_freq_factors = absl::GetFlag(FLAGS_rope_freqs);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.sliding_window = absl::GetFlag(FLAGS_sliding_window);
  o.sliding_window_pattern = absl::GetFlag(FLAGS_sliding_window_pattern);
  if (!absl::GetFlag(FLAGS_preset).empty()) {
    auto preset = pdserve::model::TinyModelPreset(absl::GetFlag(FLAGS_preset));
    if (!preset.ok()) {
      std::cerr << "pd-make-tiny-model: " << preset.status().message() << "\n";
      return 2;
    }
    o = *preset;
  }
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::cerr << "pd-make-tiny-model: --out is required\n";
    return 2;
  }
  absl::Status s = pdserve::model::WriteTinyModel(o, absl::GetFlag(FLAGS_out));
  if (!s.ok()) {
    std::cerr << "pd-make-tiny-model: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
