#include "model/gguf_types.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pdserve::model {

// Variant alternative indices must equal the GGUF type ids.
static_assert(
    std::is_same_v<GgufValue::CppType<GgufValueType::kUint8>, uint8_t>);
static_assert(
    std::is_same_v<GgufValue::CppType<GgufValueType::kFloat32>, float>);
static_assert(std::is_same_v<GgufValue::CppType<GgufValueType::kBool>, bool>);
static_assert(
    std::is_same_v<GgufValue::CppType<GgufValueType::kString>, std::string>);
static_assert(
    std::is_same_v<GgufValue::CppType<GgufValueType::kArray>, GgufArray>);
static_assert(
    std::is_same_v<GgufValue::CppType<GgufValueType::kFloat64>, double>);
static_assert(std::variant_size_v<GgufValue::Storage> == 13);
static_assert(std::variant_size_v<GgufArray::Storage> == 13);
static_assert(
    std::is_same_v<
        std::variant_alternative_t<static_cast<size_t>(GgufValueType::kArray),
                                   GgufArray::Storage>,
        std::vector<GgufArray>>);
static_assert(
    std::is_same_v<
        std::variant_alternative_t<static_cast<size_t>(GgufValueType::kInt64),
                                   GgufArray::Storage>,
        std::vector<int64_t>>);

std::string GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return absl::StrCat("unknown(", static_cast<uint32_t>(type), ")");
}

absl::StatusOr<GgufValueType> GgufValueTypeFromId(uint32_t id) {
  if (id > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown metadata value type id ", id));
  }
  return static_cast<GgufValueType>(id);
}

size_t GgufScalarSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

size_t GgufArray::size() const {
  return std::visit([](const auto& v) { return v.size(); }, storage_);
}

GgufValue GgufArray::Get(size_t i) const {
  return std::visit(
      [i](const auto& v) -> GgufValue {
        using T = typename std::decay_t<decltype(v)>::value_type;
        return GgufValue(static_cast<T>(v[i]));
      },
      storage_);
}

int GgufArray::Depth() const {
  int deepest = 0;
  if (const auto* arrays = get_if<GgufArray>()) {
    for (const GgufArray& a : *arrays) deepest = std::max(deepest, a.Depth());
  }
  return 1 + deepest;
}

bool operator==(const GgufArray& a, const GgufArray& b) {
  return a.storage_ == b.storage_;
}

std::optional<uint64_t> GgufValue::AsUint64() const {
  return std::visit(
      [](const auto& v) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_signed_v<T>) {
            if (v < 0) return std::nullopt;
          }
          return static_cast<uint64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      storage_);
}

std::optional<int64_t> GgufValue::AsInt64() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_same_v<T, uint64_t>) {
            if (v >
                static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
              return std::nullopt;
            }
          }
          return static_cast<int64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      storage_);
}

std::optional<double> GgufValue::AsDouble() const {
  if (const float* f = get_if<float>()) return static_cast<double>(*f);
  if (const double* d = get_if<double>()) return *d;
  return std::nullopt;
}

std::string GgufValue::TypeString() const {
  const GgufArray* arr = array();
  if (arr == nullptr) return GgufValueTypeName(type());
  return absl::StrCat("array[", GgufValueTypeName(arr->element_type()), "]");
}

std::string GgufValue::DebugString(size_t max_elements) const {
  constexpr size_t kMaxStringBytes = 200;
  if (const std::string* s = string()) {
    if (s->size() <= kMaxStringBytes) {
      return absl::StrCat("\"", absl::CHexEscape(*s), "\"");
    }
    return absl::StrCat(
        "\"",
        absl::CHexEscape(absl::string_view(*s).substr(0, kMaxStringBytes)),
        "\"... (", s->size(), " bytes)");
  }
  if (const GgufArray* arr = array()) {
    std::string out = absl::StrCat("[", GgufValueTypeName(arr->element_type()),
                                   " x ", arr->size(), ":");
    const size_t n = std::min(arr->size(), max_elements);
    for (size_t i = 0; i < n; ++i) {
      absl::StrAppend(&out, i == 0 ? " " : ", ",
                      arr->Get(i).DebugString(max_elements));
    }
    if (n < arr->size()) absl::StrAppend(&out, ", ...");
    absl::StrAppend(&out, "]");
    return out;
  }
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, uint8_t> ||
                             std::is_same_v<T, int8_t>) {
          return absl::StrCat(static_cast<int>(v));
        } else if constexpr (std::is_arithmetic_v<T>) {
          return absl::StrCat(v);
        } else {
          return "?";  // string and array handled above
        }
      },
      storage_);
}

absl::Status GgufValue::Validate(int max_depth) const {
  const GgufArray* arr = array();
  if (arr != nullptr && arr->Depth() > max_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("arrays nested ", arr->Depth(), " deep; at most ",
                     max_depth, " are allowed"));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::model
