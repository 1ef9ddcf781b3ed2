#include "model/model_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "model/default_model.h"

ABSL_FLAG(std::string, model, "",
          "GGUF model file (default: the project's default model)");
ABSL_FLAG(std::string, served_model_name, "",
          "the model id clients use (default: the model file's name "
          "without .gguf)");

namespace pdserve::model {

std::string ModelPathFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_model);
  return path.empty() ? DefaultModelPath() : path;
}

std::string ServedModelName(const std::string& model_path) {
  if (const std::string name = absl::GetFlag(FLAGS_served_model_name);
      !name.empty()) {
    return name;
  }
  std::string base = model_path.substr(model_path.rfind('/') + 1);
  if (absl::EndsWith(base, ".gguf")) base.resize(base.size() - 5);
  return base;
}

}  // namespace pdserve::model
