// Builds GGUF version 3 files: metadata of every GGUF value type (including
// arrays and arrays of arrays) and tensors of every supported ggml type.
//
// Used by tests and by tools that generate small models. Everything is held
// in memory until Serialize / WriteFile, so it is meant for small files.
//
// Layout written (what llama.cpp and gguf-py write): header, metadata in
// insertion order, tensor infos in insertion order, padding to the
// alignment, then each tensor's data in insertion order, each padded with
// zeros to a multiple of the alignment (the last one included).
// general.alignment is written (as the first key, uint32) only when the
// alignment differs from the default 32.
//
// Ownership: the writer owns copies of all metadata and tensor bytes handed
// to it.
// Thread-safety: not thread-safe; use from one thread at a time. Const
// methods (Serialize, WriteFile) may run concurrently with each other.
#ifndef PDSERVE_MODEL_GGUF_WRITER_H_
#define PDSERVE_MODEL_GGUF_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/ggml_type.h"
#include "model/gguf_types.h"

namespace pdserve::model {

struct GgufWriterOptions {
  // Alignment of the tensor data section and of every tensor's data; a
  // power of two.
  uint32_t alignment = kGgufDefaultAlignment;
};

class GgufWriter {
 public:
  // Longest tensor name ggml accepts (GGML_MAX_NAME - 1).
  static constexpr size_t kMaxTensorNameLength = 63;

  // InvalidArgument when options.alignment is not a power of two.
  static absl::StatusOr<std::unique_ptr<GgufWriter>> Create(
      const GgufWriterOptions& options = {});

  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Adds one key/value. Errors: empty key; duplicate key (AlreadyExists);
  // "general.alignment" (set GgufWriterOptions::alignment instead); arrays
  // nested deeper than GgufValue::kMaxArrayDepth.
  absl::Status AddMetadata(absl::string_view key, GgufValue value);

  // Adds one tensor. `dims` are in ggml ne order (dims[0] innermost), 1 to 4
  // of them. `data` must hold exactly GgmlTypeBytes(type, product of dims)
  // bytes and dims[0] must be a multiple of the type's block size. Errors:
  // empty, too long (> kMaxTensorNameLength) or duplicate name, bad dims,
  // element count overflow, unknown type, wrong data size.
  absl::Status AddTensor(absl::string_view name, std::vector<uint64_t> dims,
                         kernels::GgmlType type,
                         absl::Span<const uint8_t> data);
  // Convenience for F32 tensors.
  absl::Status AddF32Tensor(absl::string_view name, std::vector<uint64_t> dims,
                            absl::Span<const float> values);

  uint32_t alignment() const { return alignment_; }
  size_t metadata_count() const { return metadata_.size(); }
  size_t tensor_count() const { return tensors_.size(); }

  // The complete file.
  std::string Serialize() const;
  // Writes Serialize() to `path` via a temporary file in the same directory
  // and a rename, so readers never see a half-written file. Errors name the
  // path.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    kernels::GgmlType type;
    std::string data;
  };

  explicit GgufWriter(uint32_t alignment) : alignment_(alignment) {}

  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  absl::flat_hash_set<std::string> metadata_keys_;
  std::vector<Tensor> tensors_;
  absl::flat_hash_set<std::string> tensor_names_;
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_GGUF_WRITER_H_
