#include "model/gguf_types.h"

#include <algorithm>
#include <array>
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
#include "absl/types/span.h"

namespace pdserve::model {
namespace {

constexpr std::array<GgmlTypeInfo, 20> kTypes = {{
    {GgmlType::kF32, "f32", 1, 4},       {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kQ4_0, "q4_0", 32, 18},   {GgmlType::kQ4_1, "q4_1", 32, 20},
    {GgmlType::kQ5_0, "q5_0", 32, 22},   {GgmlType::kQ5_1, "q5_1", 32, 24},
    {GgmlType::kQ8_0, "q8_0", 32, 34},   {GgmlType::kQ8_1, "q8_1", 32, 36},
    {GgmlType::kQ2_K, "q2_K", 256, 84},  {GgmlType::kQ3_K, "q3_K", 256, 110},
    {GgmlType::kQ4_K, "q4_K", 256, 144}, {GgmlType::kQ5_K, "q5_K", 256, 176},
    {GgmlType::kQ6_K, "q6_K", 256, 210}, {GgmlType::kQ8_K, "q8_K", 256, 292},
    {GgmlType::kI8, "i8", 1, 1},         {GgmlType::kI16, "i16", 1, 2},
    {GgmlType::kI32, "i32", 1, 4},       {GgmlType::kI64, "i64", 1, 8},
    {GgmlType::kF64, "f64", 1, 8},       {GgmlType::kBF16, "bf16", 1, 2},
}};

// Ids ggml defines (or once defined) that pdserve cannot size or load; named
// in error messages so a user knows what to re-quantize away from.
absl::string_view UnsupportedTypeName(uint32_t id) {
  switch (id) {
    case 4:
      return "q4_2 (removed from ggml)";
    case 5:
      return "q4_3 (removed from ggml)";
    case 16:
      return "iq2_xxs";
    case 17:
      return "iq2_xs";
    case 18:
      return "iq3_xxs";
    case 19:
      return "iq1_s";
    case 20:
      return "iq4_nl";
    case 21:
      return "iq3_s";
    case 22:
      return "iq2_s";
    case 23:
      return "iq4_xs";
    case 29:
      return "iq1_m";
    case 31:
      return "q4_0_4_4 (removed from ggml)";
    case 32:
      return "q4_0_4_8 (removed from ggml)";
    case 33:
      return "q4_0_8_8 (removed from ggml)";
    case 34:
      return "tq1_0";
    case 35:
      return "tq2_0";
    case 39:
      return "mxfp4";
    default:
      return {};
  }
}

const GgmlTypeInfo* FindInfo(GgmlType type) {
  for (const GgmlTypeInfo& info : kTypes) {
    if (info.type == type) return &info;
  }
  return nullptr;
}

}  // namespace

absl::Span<const GgmlTypeInfo> AllGgmlTypes() { return kTypes; }

absl::StatusOr<GgmlType> GgmlTypeFromId(uint32_t id) {
  const GgmlTypeInfo* info = FindInfo(static_cast<GgmlType>(id));
  if (info != nullptr) return info->type;
  absl::string_view known = UnsupportedTypeName(id);
  if (!known.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported ggml type ", known, " (id ", id, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown ggml type id ", id));
}

absl::StatusOr<GgmlType> GgmlTypeFromName(absl::string_view name) {
  for (const GgmlTypeInfo& info : kTypes) {
    if (info.name == name) return info.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ggml type name '", name, "'"));
}

absl::StatusOr<GgmlTypeInfo> GetGgmlTypeInfo(GgmlType type) {
  const GgmlTypeInfo* info = FindInfo(type);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown ggml type id ", static_cast<uint32_t>(type)));
  }
  return *info;
}

std::string GgmlTypeName(GgmlType type) {
  const GgmlTypeInfo* info = FindInfo(type);
  if (info == nullptr) {
    return absl::StrCat("unknown(", static_cast<uint32_t>(type), ")");
  }
  return std::string(info->name);
}

absl::StatusOr<uint64_t> GgmlTypeBytes(GgmlType type, uint64_t n_elements) {
  const GgmlTypeInfo* info = FindInfo(type);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown ggml type id ", static_cast<uint32_t>(type)));
  }
  if (n_elements % info->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        n_elements, " elements of type ", info->name,
        " is not a multiple of its block size ", info->block_size));
  }
  const uint64_t blocks = n_elements / info->block_size;
  if (blocks > std::numeric_limits<uint64_t>::max() / info->type_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte size of ", n_elements, " elements of type ",
                     info->name, " overflows uint64"));
  }
  return blocks * info->type_size;
}

// ---------------------------------------------------------------------------
// Metadata values.

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
