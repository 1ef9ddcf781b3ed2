// Read-only access to a GGUF model file (versions 2 and 3).
//
// GgufFile::Open memory-maps the file read-only, parses and validates the
// header, every metadata key/value and every tensor info, and keeps the
// mapping for the object's lifetime. Tensor data is not copied: each
// GgufTensorInfo::data points into the mapping.
//
// Ownership: a GgufFile owns its mapping (unmapped in the destructor) and all
// parsed metadata. Pointers it hands out (GgufTensorInfo::data, the results
// of FindTensor / FindMetadata, references from tensors() / metadata()) are
// valid only while the GgufFile lives. The file descriptor is closed as soon
// as the mapping exists. As with any mmap, truncating the file on disk while
// it is mapped makes later reads of the truncated range fault (SIGBUS);
// do not rewrite model files in place while they are served.
//
// Thread-safety: immutable after Open; all const methods are safe to call
// concurrently from any number of threads.
#ifndef PDSERVE_MODEL_GGUF_H_
#define PDSERVE_MODEL_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ggml_type.h"
#include "model/gguf_types.h"

namespace pdserve::model {

// One tensor described in the file.
struct GgufTensorInfo {
  std::string name;
  kernels::GgmlType type = kernels::GgmlType::kF32;
  // Dimensions in ggml "ne" order, exactly as stored: dims[0] is the
  // innermost (contiguous) dimension, i.e. a [rows x cols] matrix is
  // {cols, rows}. 1 to 4 entries, each <= INT64_MAX.
  std::vector<uint64_t> dims;
  // Product of dims.
  uint64_t n_elements = 0;
  // Bytes of tensor data (GgmlTypeBytes(type, n_elements)).
  uint64_t n_bytes = 0;
  // Offset of the data from the start of the file; a multiple of the file's
  // alignment.
  uint64_t file_offset = 0;
  // n_bytes bytes of tensor data inside the mapping (null when n_bytes is 0).
  const uint8_t* data = nullptr;
};

class GgufFile {
 public:
  // Maps and parses `path`. Errors (all messages name the file):
  //  NotFound / PermissionDenied / ... : the file cannot be opened or mapped;
  //  InvalidArgument: not a valid GGUF v2/v3 file (bad magic, unsupported
  //    version, truncation, unknown value or tensor type, misaligned or
  //    out-of-bounds tensor data, duplicate keys or tensor names, overflow).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(
      const std::string& path);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return file_size_; }
  // general.alignment, or kGgufDefaultAlignment when absent.
  uint32_t alignment() const { return alignment_; }
  // Start of the tensor data section (aligned end of the tensor infos).
  uint64_t data_offset() const { return data_offset_; }

  // ---- Metadata --------------------------------------------------------

  // All key/value pairs in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const {
    return metadata_;
  }
  bool HasMetadata(absl::string_view key) const;
  // The value for `key`, or null when absent.
  const GgufValue* FindMetadata(absl::string_view key) const;
  // The value for `key`; NotFound ("key X missing in FILE") when absent.
  absl::StatusOr<const GgufValue*> GetMetadata(absl::string_view key) const;

  // Typed getters. Missing key -> NotFound "key X missing in FILE"; wrong
  // type -> InvalidArgument "key X has type T, expected U in FILE".
  // Integer getters accept any stored integer width/signedness whose value
  // fits the requested type (otherwise InvalidArgument "... does not fit");
  // bool is not an integer. GetF32 accepts float32 and float64.
  absl::StatusOr<uint32_t> GetU32(absl::string_view key) const;
  absl::StatusOr<uint64_t> GetU64(absl::string_view key) const;
  absl::StatusOr<int32_t> GetI32(absl::string_view key) const;
  absl::StatusOr<int64_t> GetI64(absl::string_view key) const;
  absl::StatusOr<float> GetF32(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  // Any array, without copying (e.g. GetArray("tokenizer.ggml.tokens") then
  // ->get_if<std::string>()); InvalidArgument when the value is not one.
  absl::StatusOr<const GgufArray*> GetArray(absl::string_view key) const;
  // Copying array getters: GetStringArray needs array[string]; GetF32Array
  // accepts array[float32] or array[float64]; GetI32Array accepts an array of
  // any integer type whose every element fits int32.
  absl::StatusOr<std::vector<std::string>> GetStringArray(
      absl::string_view key) const;
  absl::StatusOr<std::vector<float>> GetF32Array(absl::string_view key) const;
  absl::StatusOr<std::vector<int32_t>> GetI32Array(absl::string_view key) const;

  // general.architecture (e.g. "llama").
  absl::StatusOr<std::string> architecture() const;

  // ---- Tensors ---------------------------------------------------------

  // All tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // NotFound "tensor X not found in FILE" when absent.
  absl::StatusOr<const GgufTensorInfo*> FindTensor(
      absl::string_view name) const;

 private:
  friend class GgufParser;

  GgufFile() = default;

  // Shared implementation of the integer getters.
  template <typename T>
  absl::StatusOr<T> GetInteger(absl::string_view key,
                               absl::string_view expected) const;
  absl::Status TypeError(absl::string_view key, const GgufValue& value,
                         absl::string_view expected) const;

  std::string path_;
  const uint8_t* base_ = nullptr;  // start of the mapping
  uint64_t file_size_ = 0;         // also the mapping length
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  absl::flat_hash_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_GGUF_H_
