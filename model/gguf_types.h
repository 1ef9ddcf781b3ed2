// Types that appear in GGUF files:
//  - GgmlType: tensor element types (ggml type ids) and their storage sizes;
//  - GgufValueType / GgufValue: metadata value types and a value holding any
//    of them (scalars, strings, arrays, arrays of arrays).
//
// Quantized ggml types store elements in fixed-size blocks: `block_size`
// elements occupy `type_size` bytes. Plain types are blocks of one element.
// The numeric values of `GgmlType` are the ggml type ids written in GGUF
// tensor infos, so they must never change.
//
// Thread-safety: the ggml type functions are stateless (a constant table and
// pure functions) and safe to call from any thread. GgufValue is a plain
// value type: const access from many threads is safe, mutation is not.
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
#include "absl/types/span.h"

namespace pdserve::model {

// ggml type ids that pdserve can size (and therefore load). Ids that ggml
// defines but pdserve does not support (the IQ*/TQ* families, MXFP4, ...) are
// rejected by GgmlTypeFromId with an error that names them.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

// Storage description of one supported type.
struct GgmlTypeInfo {
  GgmlType type;
  // ggml's lower-case name: "f32", "q4_0", "q6_K", "bf16", ...
  absl::string_view name;
  // Elements per block (1 for plain types, 32 or 256 for quantized ones).
  uint32_t block_size;
  // Bytes per block.
  uint32_t type_size;
};

// Every supported type, in ascending id order.
absl::Span<const GgmlTypeInfo> AllGgmlTypes();

// Maps a raw type id read from a file to a supported type. Unknown or
// unsupported ids give InvalidArgument naming the id (and ggml's name for
// it when ggml defines one).
absl::StatusOr<GgmlType> GgmlTypeFromId(uint32_t id);

// Looks a type up by its ggml name (case-sensitive, e.g. "q4_K").
absl::StatusOr<GgmlType> GgmlTypeFromName(absl::string_view name);

// Storage description of `type`; InvalidArgument for a value outside the
// enum (only possible through a cast).
absl::StatusOr<GgmlTypeInfo> GetGgmlTypeInfo(GgmlType type);

// ggml's name for `type`, or "unknown(<id>)".
std::string GgmlTypeName(GgmlType type);

// Bytes occupied by `n_elements` consecutive elements of `type` (a row, or a
// whole tensor whose rows are block-aligned). InvalidArgument when
// `n_elements` is not a multiple of the block size, when the byte count
// would overflow uint64, or for an unknown type.
absl::StatusOr<uint64_t> GgmlTypeBytes(GgmlType type, uint64_t n_elements);

// ---------------------------------------------------------------------------
// Metadata values.

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
