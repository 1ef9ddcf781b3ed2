// Where the default model (SmolLM2-135M-Instruct, Q4_1) lives: the file
// scripts/setup.sh downloads. Binaries use it when no --model is given;
// tests that need a real model find it with FindDefaultModel, so that a
// plain `bazel test` runs them wherever setup.sh has run.
//
// Thread-safety: reads the environment; call before starting threads that
// modify it.
#ifndef PDSERVE_MODEL_DEFAULT_MODEL_H_
#define PDSERVE_MODEL_DEFAULT_MODEL_H_

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace pdserve::model {

inline constexpr char kDefaultModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Where setup.sh puts the default model under the home folder `home`.
inline std::string CachedDefaultModel(const char* home) {
  return std::string(home != nullptr ? home : "") + "/.cache/pdserve/models/" +
         kDefaultModelFile;
}

// $PDSERVE_DEFAULT_MODEL when set, else
// $HOME/.cache/pdserve/models/SmolLM2-135M-Instruct.Q4_1.gguf.
inline std::string DefaultModelPath() {
  if (const char* env = std::getenv("PDSERVE_DEFAULT_MODEL");
      env != nullptr && *env != '\0') {
    return env;
  }
  return CachedDefaultModel(std::getenv("HOME"));
}

// The default model for a test: $PDSERVE_DEFAULT_MODEL when set (readable
// or not: a test given a path it cannot open fails), else the file
// setup.sh downloads, under $HOME or under the account's home directory
// (`bazel test` sets HOME to a scratch directory), when it is there; else
// empty, and the test skips with kNoDefaultModel.
inline std::string FindDefaultModel() {
  if (const char* env = std::getenv("PDSERVE_DEFAULT_MODEL");
      env != nullptr && *env != '\0') {
    return env;
  }
  std::string path = CachedDefaultModel(std::getenv("HOME"));
  if (::access(path.c_str(), R_OK) == 0) return path;
  if (const passwd* account = ::getpwuid(::getuid()); account != nullptr) {
    path = CachedDefaultModel(account->pw_dir);
    if (::access(path.c_str(), R_OK) == 0) return path;
  }
  return "";
}

// Why a test that needs the default model skipped.
inline constexpr char kNoDefaultModel[] =
    "SKIPPED, NOT PASSED: no default model (run scripts/setup.sh, which "
    "downloads it to ~/.cache/pdserve/models, or set PDSERVE_DEFAULT_MODEL)";

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_DEFAULT_MODEL_H_
