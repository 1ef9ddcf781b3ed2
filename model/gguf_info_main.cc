// pd-gguf-info FILE: what pdserve reads from a GGUF model file.
//
// Prints the model's architecture and hyperparameters, its tokenizer, the
// tensor types it uses and the KV-cache size per token, then every metadata
// key (long arrays shortened) with --all. Exit code 1 with a clear message
// for a file that is not a valid GGUF.
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "kernels/ggml_type.h"
#include "model/gguf.h"

ABSL_FLAG(bool, all, false, "also print every metadata key");

namespace pdserve::model {
namespace {

// "llama.block_count" etc.; "?" when absent.
std::string U64Or(const GgufFile& file, const std::string& key) {
  absl::StatusOr<uint64_t> v = file.GetU64(key);
  return v.ok() ? absl::StrCat(*v) : "?";
}

int Run(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> opened = GgufFile::Open(path);
  if (!opened.ok()) {
    std::cerr << "pd-gguf-info: " << opened.status() << "\n";
    return 1;
  }
  const GgufFile& file = **opened;
  const std::string arch = file.architecture().value_or("?");
  const std::string p = arch + ".";
  std::cout << "file          " << path << " (GGUF v" << file.version() << ", "
            << file.file_size() / (1 << 20) << " MiB, " << file.tensors().size()
            << " tensors)\n";
  std::cout << "name          " << file.GetString("general.name").value_or("?")
            << "\n";
  std::cout << "architecture  " << arch << "\n";
  std::cout << "layers        " << U64Or(file, p + "block_count") << "\n";
  std::cout << "hidden        " << U64Or(file, p + "embedding_length")
            << ", ffn " << U64Or(file, p + "feed_forward_length") << "\n";
  std::cout << "heads         " << U64Or(file, p + "attention.head_count")
            << " query, " << U64Or(file, p + "attention.head_count_kv")
            << " KV\n";
  std::cout << "context       " << U64Or(file, p + "context_length") << "\n";
  const absl::StatusOr<std::vector<std::string>> tokens =
      file.GetStringArray("tokenizer.ggml.tokens");
  std::cout << "tokenizer     "
            << file.GetString("tokenizer.ggml.model").value_or("?") << " (pre "
            << file.GetString("tokenizer.ggml.pre").value_or("-") << "), "
            << (tokens.ok() ? tokens->size() : 0) << " tokens\n";

  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t total_bytes = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    auto& [count, bytes] = by_type[std::string(kernels::GgmlTypeName(t.type))];
    ++count;
    bytes += t.n_bytes;
    total_bytes += t.n_bytes;
  }
  std::cout << "weights       " << total_bytes / (1 << 20) << " MiB:";
  for (const auto& [type, entry] : by_type) {
    std::cout << " " << entry.first << "x" << type;
  }
  std::cout << "\n";

  // KV cache per token at f16: 2 (K,V) * layers * kv_heads * head_dim * 2 B.
  absl::StatusOr<uint64_t> layers = file.GetU64(p + "block_count");
  absl::StatusOr<uint64_t> heads = file.GetU64(p + "attention.head_count");
  absl::StatusOr<uint64_t> kv_heads =
      file.GetU64(p + "attention.head_count_kv");
  absl::StatusOr<uint64_t> hidden = file.GetU64(p + "embedding_length");
  if (layers.ok() && heads.ok() && kv_heads.ok() && hidden.ok() && *heads > 0) {
    const uint64_t head_dim = *hidden / *heads;
    const uint64_t per_token = 2 * *layers * *kv_heads * head_dim * 2;
    std::cout << "KV cache      " << per_token << " bytes/token at f16 ("
              << per_token * 16 / 1024 << " KiB per 16-token block)\n";
  }
  if (absl::GetFlag(FLAGS_all)) {
    std::cout << "\nmetadata:\n";
    for (const auto& [key, value] : file.metadata()) {
      std::string text = value.DebugString();
      if (text.size() > 120) text = text.substr(0, 117) + "...";
      std::cout << "  " << key << " = " << text << "\n";
    }
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::model

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("pd-gguf-info FILE [--all]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: pd-gguf-info FILE [--all]\n";
    return 2;
  }
  return pdserve::model::Run(args[1]);
}
