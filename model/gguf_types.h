// Metadata types of GGUF files: GgufValueType / GgufValue, the value types
// and a value holding any of them (scalars, strings, arrays, arrays of
// arrays). The tensor element types (GgmlType) are kernels/ggml_type.h's.
//
// Thread-safety: GgufValue is a plain value type: const access from many
// threads is safe, mutation is not.
#ifndef PDSERVE_MODEL_GGUF_TYPES_H_
#define PDSERVE_MODEL_GGUF_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::model {

// Default value of general.alignment when a file does not set it.
inline constexpr uint32_t kGgufDefaultAlignment = 32;

// GGUF metadata value type ids (gguf_type in ggml). The numeric values are
// the ids written in the file.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", "int32", "float32", "bool", "string", "array", ... or
// "unknown(<id>)".
std::string GgufValueTypeName(GgufValueType type);

// Maps a raw value type id read from a file; InvalidArgument when unknown.
absl::StatusOr<GgufValueType> GgufValueTypeFromId(uint32_t id);

// Size in bytes of a fixed-size scalar type in a GGUF file; 0 for string and
// array (variable length) and unknown types.
size_t GgufScalarSize(GgufValueType type);

class GgufValue;

// A GGUF array, stored compactly as one typed vector whose variant index is
// the element type id: array[uint8] is a std::vector<uint8_t>, array[string]
// a std::vector<std::string>, an array of arrays a std::vector<GgufArray>
// (each inner array has its own element type). Homogeneous by construction.
// Scalar elements cost their file size in memory, so a large tokenizer
// vocabulary or a corrupt count cannot blow memory up by a large factor.
class GgufArray {
 public:
  using Storage = std::variant<
      std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>,
      std::vector<int16_t>, std::vector<uint32_t>, std::vector<int32_t>,
      std::vector<float>, std::vector<bool>, std::vector<std::string>,
      std::vector<GgufArray>, std::vector<uint64_t>, std::vector<int64_t>,
      std::vector<double>>;

  // An empty array[uint8].
  GgufArray() = default;
  // An array of the GGUF type matching T (T is a scalar listed in Storage,
  // std::string or GgufArray).
  template <typename T>
  explicit GgufArray(std::vector<T> elements) : storage_(std::move(elements)) {}

  GgufValueType element_type() const {
    return static_cast<GgufValueType>(storage_.index());
  }
  size_t size() const;
  bool empty() const { return size() == 0; }
  const Storage& storage() const { return storage_; }

  // The elements when they have C++ type T (e.g. get_if<std::string>() for
  // array[string]), else null.
  template <typename T>
  const std::vector<T>* get_if() const {
    return std::get_if<std::vector<T>>(&storage_);
  }

  // Element `i` (< size()) as a value (a copy).
  GgufValue Get(size_t i) const;

  // Nesting depth: 1 for an array of non-arrays, 1 + the deepest element
  // for an array of arrays.
  int Depth() const;

  friend bool operator==(const GgufArray& a, const GgufArray& b);

 private:
  Storage storage_;
};

// One metadata value. A thin wrapper over a std::variant whose alternative
// index equals the GgufValueType id, so `type()` is free.
//
// Construction from a C++ scalar picks the matching GGUF type (uint32_t ->
// kUint32, float -> kFloat32, bool -> kBool, std::string / const char* ->
// kString, ...); the constructors are implicit on purpose so that
// `writer.AddMetadata("llama.block_count", uint32_t{30})` reads naturally.
class GgufValue {
 public:
  using Storage =
      std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float,
                   bool, std::string, GgufArray, uint64_t, int64_t, double>;

  // The C++ type stored for GGUF type `T` (e.g. CppType<kFloat32> = float).
  template <GgufValueType T>
  using CppType = std::variant_alternative_t<static_cast<size_t>(T), Storage>;

  // A uint8 zero.
  GgufValue() = default;
  GgufValue(uint8_t v) : storage_(v) {}                         // NOLINT
  GgufValue(int8_t v) : storage_(v) {}                          // NOLINT
  GgufValue(uint16_t v) : storage_(v) {}                        // NOLINT
  GgufValue(int16_t v) : storage_(v) {}                         // NOLINT
  GgufValue(uint32_t v) : storage_(v) {}                        // NOLINT
  GgufValue(int32_t v) : storage_(v) {}                         // NOLINT
  GgufValue(float v) : storage_(v) {}                           // NOLINT
  GgufValue(bool v) : storage_(v) {}                            // NOLINT
  GgufValue(std::string v) : storage_(std::move(v)) {}          // NOLINT
  GgufValue(absl::string_view v) : storage_(std::string(v)) {}  // NOLINT
  GgufValue(std::string_view v) : storage_(std::string(v)) {}   // NOLINT
  GgufValue(const char* v) : storage_(std::string(v)) {}        // NOLINT
  GgufValue(GgufArray v) : storage_(std::move(v)) {}            // NOLINT
  GgufValue(uint64_t v) : storage_(v) {}                        // NOLINT
  GgufValue(int64_t v) : storage_(v) {}                         // NOLINT
  GgufValue(double v) : storage_(v) {}                          // NOLINT

  // An array value, e.g. ArrayOf(std::vector<std::string>{...}),
  // ArrayOf(std::vector<float>{...}), ArrayOf(std::vector<GgufArray>{...}).
  template <typename T>
  static GgufValue ArrayOf(std::vector<T> elements) {
    return GgufValue(GgufArray(std::move(elements)));
  }

  GgufValueType type() const {
    return static_cast<GgufValueType>(storage_.index());
  }
  const Storage& storage() const { return storage_; }

  // Pointer to the stored value when it holds exactly C++ type T, else null.
  template <typename T>
  const T* get_if() const {
    return std::get_if<T>(&storage_);
  }
  const std::string* string() const { return get_if<std::string>(); }
  const GgufArray* array() const { return get_if<GgufArray>(); }

  // Integer conversions that accept any integer width and signedness and
  // return nullopt when the value is not an integer or does not fit. bool
  // is not an integer here.
  std::optional<uint64_t> AsUint64() const;
  std::optional<int64_t> AsInt64() const;
  // float32 or float64 as double; nullopt otherwise.
  std::optional<double> AsDouble() const;

  // Type as a human-readable string, e.g. "uint32", "array[string]",
  // "array[array]".
  std::string TypeString() const;

  // Short rendering for logs and dumps; arrays show at most `max_elements`
  // elements and strings at most 200 bytes (C-escaped).
  std::string DebugString(size_t max_elements = 8) const;

  // Deepest array nesting the reader and writer accept.
  static constexpr int kMaxArrayDepth = 16;

  // OK unless arrays are nested more than `max_depth` deep.
  absl::Status Validate(int max_depth = kMaxArrayDepth) const;

  friend bool operator==(const GgufValue& a, const GgufValue& b) {
    return a.storage_ == b.storage_;
  }

 private:
  Storage storage_;
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_GGUF_TYPES_H_
