#include "model/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "kernels/ggml_type.h"
#include "model/gguf_types.h"

namespace pdserve::model {

static_assert(std::endian::native == std::endian::little,
              "the GGUF writer assumes a little-endian host");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian.
constexpr uint32_t kGgufVersion = 3;
constexpr size_t kMaxDims = 4;

template <typename T>
void AppendPod(std::string* out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out->append(bytes, sizeof(T));
}

void AppendString(std::string* out, absl::string_view s) {
  AppendPod<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

// Appends an array body: element type, count, elements.
void AppendArray(std::string* out, const GgufArray& array) {
  AppendPod<uint32_t>(out, static_cast<uint32_t>(array.element_type()));
  AppendPod<uint64_t>(out, array.size());
  std::visit(
      [out](const auto& elements) {
        using T = typename std::decay_t<decltype(elements)>::value_type;
        if constexpr (std::is_same_v<T, std::string>) {
          for (const std::string& s : elements) AppendString(out, s);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          for (const GgufArray& a : elements) AppendArray(out, a);
        } else if constexpr (std::is_same_v<T, bool>) {
          for (bool b : elements) AppendPod<uint8_t>(out, b ? 1 : 0);
        } else {
          out->append(reinterpret_cast<const char*>(elements.data()),
                      elements.size() * sizeof(T));
        }
      },
      array.storage());
}

// Appends the payload of `value` (without its type id).
void AppendValue(std::string* out, const GgufValue& value) {
  std::visit(
      [out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          AppendString(out, v);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          AppendArray(out, v);
        } else if constexpr (std::is_same_v<T, bool>) {
          AppendPod<uint8_t>(out, v ? 1 : 0);
        } else {
          AppendPod<T>(out, v);
        }
      },
      value.storage());
}

void AppendKeyValue(std::string* out, absl::string_view key,
                    const GgufValue& value) {
  AppendString(out, key);
  AppendPod<uint32_t>(out, static_cast<uint32_t>(value.type()));
  AppendValue(out, value);
}

uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

void PadTo(std::string* out, uint64_t alignment) {
  out->resize(AlignUp(out->size(), alignment), '\0');
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufWriter>> GgufWriter::Create(
    const GgufWriterOptions& options) {
  if (options.alignment == 0 || !std::has_single_bit(options.alignment)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF alignment ", options.alignment, " is not a power of two"));
  }
  return std::unique_ptr<GgufWriter>(new GgufWriter(options.alignment));
}

absl::Status GgufWriter::AddMetadata(absl::string_view key, GgufValue value) {
  if (key.empty()) {
    return absl::InvalidArgumentError("GGUF metadata key is empty");
  }
  if (key == "general.alignment") {
    return absl::InvalidArgumentError(
        "GGUF metadata key general.alignment is written by the writer; set "
        "GgufWriterOptions::alignment instead");
  }
  if (metadata_keys_.contains(key)) {
    return absl::AlreadyExistsError(
        absl::StrCat("duplicate GGUF metadata key ", key));
  }
  absl::Status valid = value.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF metadata key ", key, ": ", valid.message()));
  }
  metadata_keys_.insert(std::string(key));
  metadata_.emplace_back(std::string(key), std::move(value));
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(absl::string_view name,
                                   std::vector<uint64_t> dims,
                                   kernels::GgmlType type,
                                   absl::Span<const uint8_t> data) {
  if (name.empty()) {
    return absl::InvalidArgumentError("GGUF tensor name is empty");
  }
  if (name.size() > kMaxTensorNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor name ", name, " is ", name.size(),
                     " bytes; ggml allows at most ", kMaxTensorNameLength));
  }
  if (tensor_names_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("duplicate GGUF tensor name ", name));
  }
  if (dims.empty() || dims.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor ", name, " has ", dims.size(), " dims; 1 to ",
                     kMaxDims, " are allowed"));
  }
  absl::StatusOr<kernels::GgmlTypeInfo> info = kernels::GetGgmlTypeInfo(type);
  if (!info.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor ", name, ": ", info.status().message()));
  }
  constexpr uint64_t kMaxElements =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t n_elements = 1;
  for (uint64_t dim : dims) {
    if (dim > kMaxElements || (dim != 0 && n_elements > kMaxElements / dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF tensor ", name, ": element count overflows int64"));
    }
    n_elements *= dim;
  }
  if (dims[0] % info->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor ", name, ": row length dims[0] = ", dims[0],
                     " is not a multiple of the block size ", info->block_size,
                     " of type ", info->name));
  }
  absl::StatusOr<uint64_t> n_bytes = kernels::GgmlTypeBytes(type, n_elements);
  if (!n_bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor ", name, ": ", n_bytes.status().message()));
  }
  if (data.size() != *n_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF tensor ", name, ": ", n_elements, " elements of type ",
        info->name, " need ", *n_bytes, " bytes, got ", data.size()));
  }
  tensor_names_.insert(std::string(name));
  tensors_.push_back(Tensor{
      std::string(name), std::move(dims), type,
      std::string(reinterpret_cast<const char*>(data.data()), data.size())});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddF32Tensor(absl::string_view name,
                                      std::vector<uint64_t> dims,
                                      absl::Span<const float> values) {
  return AddTensor(
      name, std::move(dims), kernels::GgmlType::kF32,
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                                values.size() * sizeof(float)));
}

std::string GgufWriter::Serialize() const {
  const bool write_alignment = alignment_ != kGgufDefaultAlignment;
  std::string out;
  uint64_t data_bytes = 0;
  for (const Tensor& t : tensors_)
    data_bytes += AlignUp(t.data.size(), alignment_);
  out.reserve(4096 + data_bytes);

  AppendPod<uint32_t>(&out, kGgufMagic);
  AppendPod<uint32_t>(&out, kGgufVersion);
  AppendPod<uint64_t>(&out, tensors_.size());
  AppendPod<uint64_t>(&out, metadata_.size() + (write_alignment ? 1 : 0));
  if (write_alignment) {
    AppendKeyValue(&out, "general.alignment", GgufValue(alignment_));
  }
  for (const auto& [key, value] : metadata_) AppendKeyValue(&out, key, value);

  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    AppendString(&out, t.name);
    AppendPod<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t dim : t.dims) AppendPod<uint64_t>(&out, dim);
    AppendPod<uint32_t>(&out, static_cast<uint32_t>(t.type));
    AppendPod<uint64_t>(&out, offset);
    offset += AlignUp(t.data.size(), alignment_);
  }
  if (!tensors_.empty()) PadTo(&out, alignment_);
  for (const Tensor& t : tensors_) {
    out.append(t.data);
    PadTo(&out, alignment_);
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  const std::string contents = Serialize();
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot create GGUF file '", tmp, "'"));
  }
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n =
        ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::ErrnoToStatus(
          err, absl::StrCat("cannot write GGUF file '", tmp, "'"));
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot close GGUF file '", tmp, "'"));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::model
