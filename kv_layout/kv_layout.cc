#include "kv_layout/kv_layout.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace pdserve::kv_layout {
namespace {

// a * b, or false on 64-bit overflow.
bool MultiplyChecked(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

}  // namespace

uint64_t KvDtypeBytes(v1::KvDtype dtype) {
  switch (dtype) {
    case v1::KV_DTYPE_F32:
      return 4;
    case v1::KV_DTYPE_F16:
    case v1::KV_DTYPE_BF16:
      return 2;
    case v1::KV_DTYPE_FP8_E4M3:
    case v1::KV_DTYPE_FP8_E5M2:
      return 1;
    default:
      return 0;
  }
}

absl::StatusOr<KvGeometry> KvGeometry::FromProto(const v1::KvLayout& layout) {
  if (layout.layout_version() != kKvLayoutVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout version ", layout.layout_version(),
        " is not supported (this build implements ", kKvLayoutVersion, ")"));
  }
  if (KvDtypeBytes(layout.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout has unknown dtype ", layout.dtype()));
  }
  if (layout.num_layers() == 0 || layout.num_kv_heads() == 0 ||
      layout.head_dim() == 0 || layout.block_size_tokens() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout has a zero dimension: layers=", layout.num_layers(),
        " kv_heads=", layout.num_kv_heads(), " head_dim=", layout.head_dim(),
        " block_size_tokens=", layout.block_size_tokens()));
  }
  uint64_t token = 0;
  uint64_t pool = 0;
  uint64_t block = 0;
  if (!MultiplyChecked(layout.num_kv_heads(), layout.head_dim(), &token) ||
      !MultiplyChecked(token, KvDtypeBytes(layout.dtype()), &token) ||
      !MultiplyChecked(token, layout.block_size_tokens(), &block) ||
      !MultiplyChecked(block, 2, &block) ||
      !MultiplyChecked(block, layout.num_blocks(), &pool) ||
      !MultiplyChecked(pool, layout.num_layers(), &pool)) {
    return absl::InvalidArgumentError(
        "KV layout describes a pool larger than 2^64 bytes");
  }
  return KvGeometry(layout);
}

KvGeometry::KvGeometry(const v1::KvLayout& layout)
    : layout_(layout),
      dtype_bytes_(KvDtypeBytes(layout.dtype())),
      token_bytes_(uint64_t{layout.num_kv_heads()} * layout.head_dim() *
                   dtype_bytes_),
      half_block_bytes_(token_bytes_ * layout.block_size_tokens()),
      layer_stride_(2 * half_block_bytes_ * layout.num_blocks()) {}

absl::Status CheckKvLayoutsCompatible(const v1::KvLayout& writer,
                                      const v1::KvLayout& reader) {
  auto differ = [](const char* field, const auto& w, const auto& r) {
    return absl::FailedPreconditionError(absl::StrCat("KV layouts differ in ",
                                                      field, ": writer has ", w,
                                                      ", reader has ", r));
  };
  if (writer.layout_version() != reader.layout_version()) {
    return differ("layout_version", writer.layout_version(),
                  reader.layout_version());
  }
  if (writer.model_fingerprint() != reader.model_fingerprint()) {
    return differ("model_fingerprint", writer.model_fingerprint(),
                  reader.model_fingerprint());
  }
  if (writer.num_layers() != reader.num_layers()) {
    return differ("num_layers", writer.num_layers(), reader.num_layers());
  }
  if (writer.num_kv_heads() != reader.num_kv_heads()) {
    return differ("num_kv_heads", writer.num_kv_heads(), reader.num_kv_heads());
  }
  if (writer.head_dim() != reader.head_dim()) {
    return differ("head_dim", writer.head_dim(), reader.head_dim());
  }
  if (writer.dtype() != reader.dtype()) {
    return differ("dtype", v1::KvDtype_Name(writer.dtype()),
                  v1::KvDtype_Name(reader.dtype()));
  }
  if (writer.block_size_tokens() != reader.block_size_tokens()) {
    return differ("block_size_tokens", writer.block_size_tokens(),
                  reader.block_size_tokens());
  }
  return absl::OkStatus();
}

}  // namespace pdserve::kv_layout
