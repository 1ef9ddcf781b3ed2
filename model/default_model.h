// Where the default model (SmolLM2-135M-Instruct, Q4_1) lives: the file
// scripts/setup.sh downloads. Binaries use it when no --model is given.
//
// Thread-safety: reads the environment; call before starting threads that
// modify it.
#ifndef PDSERVE_MODEL_DEFAULT_MODEL_H_
#define PDSERVE_MODEL_DEFAULT_MODEL_H_

#include <cstdlib>
#include <string>

namespace pdserve::model {

inline constexpr char kDefaultModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";

// $PDSERVE_DEFAULT_MODEL when set, else
// $HOME/.cache/pdserve/models/SmolLM2-135M-Instruct.Q4_1.gguf.
inline std::string DefaultModelPath() {
  if (const char* env = std::getenv("PDSERVE_DEFAULT_MODEL");
      env != nullptr && *env != '\0') {
    return env;
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") + "/.cache/pdserve/models/" +
         kDefaultModelFile;
}

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_DEFAULT_MODEL_H_
