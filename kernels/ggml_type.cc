#include "kernels/ggml_type.h"

#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pdserve::kernels {
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

}  // namespace pdserve::kernels
