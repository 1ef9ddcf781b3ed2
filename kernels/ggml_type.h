// The ggml tensor element types (the ids GGUF files write in their tensor
// infos) and their storage sizes. The kernels are written per type, and the
// GGUF reader and writer size tensors with the same table, so it lives here,
// below both: model/ depends on kernels/, never the other way round.
//
// Quantized ggml types store elements in fixed-size blocks: `block_size`
// elements occupy `type_size` bytes. Plain types are blocks of one element.
// The numeric values of `GgmlType` are the ggml type ids written in GGUF
// tensor infos, so they must never change.
//
// Thread-safety: stateless (a constant table and pure functions), safe to
// call from any thread.
#ifndef PDSERVE_KERNELS_GGML_TYPE_H_
#define PDSERVE_KERNELS_GGML_TYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pdserve::kernels {

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

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_GGML_TYPE_H_
