// A small JSON reader for test goldens (files written by the project's
// tools/gen_*_goldens.py scripts with Python's json module).
//
// Test-only: it accepts valid JSON and refuses (nullopt) what it cannot
// parse, without error positions or limits; production code that parses
// untrusted JSON needs a hardened parser.
//
// Thread-safety: values are plain data; ParseGoldenJson is reentrant.
#ifndef PDSERVE_MODEL_TESTING_GOLDEN_JSON_H_
#define PDSERVE_MODEL_TESTING_GOLDEN_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace pdserve::model::golden {

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* Find(absl::string_view key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  bool Has(absl::string_view key) const { return Find(key) != nullptr; }
  // The value under `key`, or a null value when there is none (a test that
  // needs the key checks Has first).
  const Json& operator[](absl::string_view key) const;
  int64_t Int() const { return static_cast<int64_t>(number); }
  std::vector<int32_t> Ints() const {
    std::vector<int32_t> out;
    for (const Json& v : array) out.push_back(static_cast<int32_t>(v.number));
    return out;
  }
};

// The value `text` holds, or nullopt when it is not valid JSON.
std::optional<Json> ParseGoldenJson(absl::string_view text);

// Reads and parses the file at `path` (relative to the working directory,
// the workspace root under bazel test); nullopt when it cannot be read or
// parsed.
std::optional<Json> LoadGoldenJson(const std::string& path);

}  // namespace pdserve::model::golden

#endif  // PDSERVE_MODEL_TESTING_GOLDEN_JSON_H_
