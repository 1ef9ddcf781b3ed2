#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "kernels/ggml_type.h"
#include "model/gguf_types.h"

namespace pdserve::model {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian.
constexpr uint32_t kMaxDims = 4;

// Smallest possible encodings, used to reject counts that cannot fit in the
// bytes that remain before allocating anything for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;  // key length, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len,
                                                             // n_dims, 1 dim,
                                                             // type, offset

// Smallest encoding of one array element of `type`.
uint64_t MinElementBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kString:
      return 8;  // length
    case GgufValueType::kArray:
      return 4 + 8;  // element type, count
    default:
      return GgufScalarSize(type);
  }
}

// Prepends context to an error message, keeping the code; OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

uint32_t ByteSwap32(uint32_t v) {
  return ((v & 0xffu) << 24) | ((v & 0xff00u) << 8) | ((v >> 8) & 0xff00u) |
         (v >> 24);
}

}  // namespace

// Parses the mapped bytes of a GgufFile into its fields. Every read is
// bounds-checked against the mapping.
class GgufParser {
 public:
  explicit GgufParser(GgufFile* file)
      : file_(file), base_(file->base_), size_(file->file_size_) {}

  absl::Status Parse() {
    PD_RETURN_IF_ERROR(ParseHeader());
    PD_RETURN_IF_ERROR(ParseMetadata());
    PD_RETURN_IF_ERROR(ParseTensorInfos());
    PD_RETURN_IF_ERROR(ParseAlignment());
    return PlaceTensors();
  }

 private:
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t n) const {
    if (n > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file truncated: need ", n, " bytes at offset ", pos_, " but only ",
          remaining(), " remain (file size ", size_, ")"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Read(T* out) {
    PD_RETURN_IF_ERROR(Need(sizeof(T)));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out) {
    uint64_t length = 0;
    PD_RETURN_IF_ERROR(Read(&length));
    if (length > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file truncated: string of length ", length, " at offset ", pos_ - 8,
          " but only ", remaining(), " bytes remain (file size ", size_, ")"));
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), length);
    pos_ += length;
    return absl::OkStatus();
  }

  absl::Status ParseHeader() {
    uint32_t magic = 0;
    PD_RETURN_IF_ERROR(Annotate(Read(&magic), "reading magic"));
    if (magic != kGgufMagic) {
      char text[4];
      std::memcpy(text, &magic, 4);
      return absl::InvalidArgumentError(absl::StrCat(
          "bad magic '", absl::CHexEscape(absl::string_view(text, 4)),
          "' (expected 'GGUF'); not a GGUF file"));
    }
    PD_RETURN_IF_ERROR(Annotate(Read(&file_->version_), "reading version"));
    const uint32_t version = file_->version_;
    if (version == 1) {
      return absl::InvalidArgumentError(
          "unsupported GGUF version 1 (an obsolete format with 32-bit "
          "counts); only versions 2 and 3 are supported, re-convert the "
          "model with a current llama.cpp");
    }
    if (version != 2 && version != 3) {
      const uint32_t swapped = ByteSwap32(version);
      if (swapped >= 1 && swapped <= 3) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unsupported GGUF version ", version,
            " (looks like a big-endian GGUF file, which is not supported)"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported GGUF version ", version,
                       "; only versions 2 and 3 are supported"));
    }
    PD_RETURN_IF_ERROR(Annotate(Read(&tensor_count_), "reading tensor count"));
    PD_RETURN_IF_ERROR(
        Annotate(Read(&kv_count_), "reading metadata key/value count"));
    if (kv_count_ > remaining() / kMinKvBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata key/value count ", kv_count_, " is impossible: only ",
          remaining(), " bytes follow the header (file truncated or corrupt)"));
    }
    if (tensor_count_ > remaining() / kMinTensorInfoBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor count ", tensor_count_, " is impossible: only ", remaining(),
          " bytes follow the header (file truncated or corrupt)"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseMetadata() {
    file_->metadata_.reserve(kv_count_);
    file_->metadata_index_.reserve(kv_count_);
    for (uint64_t i = 0; i < kv_count_; ++i) {
      std::string key;
      PD_RETURN_IF_ERROR(Annotate(
          ReadString(&key), absl::StrCat("reading key of metadata entry ", i)));
      uint32_t type_id = 0;
      PD_RETURN_IF_ERROR(Annotate(
          Read(&type_id),
          absl::StrCat("reading value type of metadata key '", key, "'")));
      absl::StatusOr<GgufValueType> type = GgufValueTypeFromId(type_id);
      if (!type.ok()) {
        return Annotate(type.status(),
                        absl::StrCat("metadata key '", key, "'"));
      }
      GgufValue value;
      PD_RETURN_IF_ERROR(
          Annotate(ReadValue(*type, /*depth=*/0, &value),
                   absl::StrCat("reading value of metadata key '", key, "' (",
                                GgufValueTypeName(*type), ")")));
      if (!file_->metadata_index_.emplace(key, file_->metadata_.size())
               .second) {
        return absl::InvalidArgumentError(
            absl::StrCat("duplicate metadata key '", key, "'"));
      }
      file_->metadata_.emplace_back(std::move(key), std::move(value));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status ReadScalar(GgufValue* out) {
    T v;
    PD_RETURN_IF_ERROR(Read(&v));
    *out = GgufValue(v);
    return absl::OkStatus();
  }

  // Reads one value of `type`; `depth` is the number of enclosing arrays.
  absl::Status ReadValue(GgufValueType type, int depth, GgufValue* out) {
    switch (type) {
      case GgufValueType::kUint8:
        return ReadScalar<uint8_t>(out);
      case GgufValueType::kInt8:
        return ReadScalar<int8_t>(out);
      case GgufValueType::kUint16:
        return ReadScalar<uint16_t>(out);
      case GgufValueType::kInt16:
        return ReadScalar<int16_t>(out);
      case GgufValueType::kUint32:
        return ReadScalar<uint32_t>(out);
      case GgufValueType::kInt32:
        return ReadScalar<int32_t>(out);
      case GgufValueType::kFloat32:
        return ReadScalar<float>(out);
      case GgufValueType::kUint64:
        return ReadScalar<uint64_t>(out);
      case GgufValueType::kInt64:
        return ReadScalar<int64_t>(out);
      case GgufValueType::kFloat64:
        return ReadScalar<double>(out);
      case GgufValueType::kBool: {
        uint8_t byte = 0;
        PD_RETURN_IF_ERROR(Read(&byte));
        *out = GgufValue(byte != 0);
        return absl::OkStatus();
      }
      case GgufValueType::kString: {
        std::string s;
        PD_RETURN_IF_ERROR(ReadString(&s));
        *out = GgufValue(std::move(s));
        return absl::OkStatus();
      }
      case GgufValueType::kArray: {
        GgufArray array;
        PD_RETURN_IF_ERROR(ReadArray(depth, &array));
        *out = GgufValue(std::move(array));
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown metadata value type id ", static_cast<uint32_t>(type)));
  }

  // Reads an array body (element type, count, elements); `depth` is the
  // number of arrays enclosing this one.
  absl::Status ReadArray(int depth, GgufArray* out) {
    if (depth >= GgufValue::kMaxArrayDepth) {
      return absl::InvalidArgumentError(absl::StrCat("arrays nested more than ",
                                                     GgufValue::kMaxArrayDepth,
                                                     " deep at offset ", pos_));
    }
    uint32_t type_id = 0;
    PD_RETURN_IF_ERROR(Read(&type_id));
    absl::StatusOr<GgufValueType> element_type = GgufValueTypeFromId(type_id);
    if (!element_type.ok()) {
      return Annotate(element_type.status(), "array element type");
    }
    uint64_t count = 0;
    PD_RETURN_IF_ERROR(Read(&count));
    if (count > remaining() / MinElementBytes(*element_type)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "array of ", count, " ", GgufValueTypeName(*element_type),
          " elements is impossible: only ", remaining(),
          " bytes remain (file truncated or corrupt)"));
    }
    // Vectors of variable-size elements grow with what is actually parsed
    // rather than trusting `count` for the reservation.
    const size_t reserve = static_cast<size_t>(std::min<uint64_t>(count, 4096));
    switch (*element_type) {
      case GgufValueType::kUint8:
        return ReadScalars<uint8_t>(count, out);
      case GgufValueType::kInt8:
        return ReadScalars<int8_t>(count, out);
      case GgufValueType::kUint16:
        return ReadScalars<uint16_t>(count, out);
      case GgufValueType::kInt16:
        return ReadScalars<int16_t>(count, out);
      case GgufValueType::kUint32:
        return ReadScalars<uint32_t>(count, out);
      case GgufValueType::kInt32:
        return ReadScalars<int32_t>(count, out);
      case GgufValueType::kFloat32:
        return ReadScalars<float>(count, out);
      case GgufValueType::kUint64:
        return ReadScalars<uint64_t>(count, out);
      case GgufValueType::kInt64:
        return ReadScalars<int64_t>(count, out);
      case GgufValueType::kFloat64:
        return ReadScalars<double>(count, out);
      case GgufValueType::kBool: {
        // count <= remaining() was checked above.
        std::vector<bool> values(count);
        for (uint64_t i = 0; i < count; ++i) values[i] = base_[pos_ + i] != 0;
        pos_ += count;
        *out = GgufArray(std::move(values));
        return absl::OkStatus();
      }
      case GgufValueType::kString: {
        std::vector<std::string> values;
        values.reserve(reserve);
        for (uint64_t i = 0; i < count; ++i) {
          absl::Status status = ReadString(&values.emplace_back());
          if (!status.ok()) {
            return Annotate(status, absl::StrCat("array element ", i));
          }
        }
        *out = GgufArray(std::move(values));
        return absl::OkStatus();
      }
      case GgufValueType::kArray: {
        std::vector<GgufArray> values;
        values.reserve(reserve);
        for (uint64_t i = 0; i < count; ++i) {
          absl::Status status = ReadArray(depth + 1, &values.emplace_back());
          if (!status.ok()) {
            return Annotate(status, absl::StrCat("array element ", i));
          }
        }
        *out = GgufArray(std::move(values));
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown metadata value type id ", type_id));
  }

  // Reads `count` fixed-size elements; the caller checked that
  // count * sizeof(T) bytes remain.
  template <typename T>
  absl::Status ReadScalars(uint64_t count, GgufArray* out) {
    PD_RETURN_IF_ERROR(Need(count * sizeof(T)));
    std::vector<T> values(count);
    if (count > 0) {
      std::memcpy(values.data(), base_ + pos_, count * sizeof(T));
    }
    pos_ += count * sizeof(T);
    *out = GgufArray(std::move(values));
    return absl::OkStatus();
  }

  absl::Status ParseTensorInfos() {
    std::vector<GgufTensorInfo>& tensors = file_->tensors_;
    tensors.reserve(tensor_count_);
    file_->tensor_index_.reserve(tensor_count_);
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      GgufTensorInfo info;
      PD_RETURN_IF_ERROR(
          Annotate(ReadString(&info.name),
                   absl::StrCat("reading name of tensor info ", i)));
      PD_RETURN_IF_ERROR(Annotate(ParseTensorInfo(&info),
                                  absl::StrCat("tensor '", info.name, "'")));
      if (!file_->tensor_index_.emplace(info.name, tensors.size()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("duplicate tensor name '", info.name, "'"));
      }
      tensors.push_back(std::move(info));
    }
    return absl::OkStatus();
  }

  // Reads everything after the name and derives element and byte counts.
  absl::Status ParseTensorInfo(GgufTensorInfo* info) {
    uint32_t n_dims = 0;
    PD_RETURN_IF_ERROR(Annotate(Read(&n_dims), "reading n_dims"));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat("n_dims ", n_dims, " out of range [1, ", kMaxDims, "]"));
    }
    info->dims.resize(n_dims);
    uint64_t n_elements = 1;
    bool overflow = false;
    constexpr uint64_t kMaxElements =
        static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      PD_RETURN_IF_ERROR(
          Annotate(Read(&dim), absl::StrCat("reading dimension ", d)));
      if (dim > kMaxElements) {
        return absl::InvalidArgumentError(
            absl::StrCat("dimension ", d, " = ", dim, " exceeds INT64_MAX"));
      }
      info->dims[d] = dim;
      if (dim != 0 && n_elements > kMaxElements / dim) overflow = true;
      n_elements *= dim;  // wraps only when overflow is already set
    }
    if (overflow) {
      std::string dims;
      for (uint64_t dim : info->dims) {
        absl::StrAppend(&dims, dims.empty() ? "" : ", ", dim);
      }
      return absl::InvalidArgumentError(
          absl::StrCat("element count overflows int64 (dims [", dims, "])"));
    }
    info->n_elements = n_elements;
    uint32_t type_id = 0;
    PD_RETURN_IF_ERROR(Annotate(Read(&type_id), "reading type"));
    absl::StatusOr<kernels::GgmlType> type = kernels::GgmlTypeFromId(type_id);
    if (!type.ok()) return type.status();
    info->type = *type;
    PD_ASSIGN_OR_RETURN(kernels::GgmlTypeInfo type_info,
                        kernels::GetGgmlTypeInfo(*type));
    if (info->dims[0] % type_info.block_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("row length dims[0] = ", info->dims[0],
                       " is not a multiple of the block size ",
                       type_info.block_size, " of type ", type_info.name));
    }
    PD_ASSIGN_OR_RETURN(info->n_bytes,
                        kernels::GgmlTypeBytes(*type, n_elements));
    // Stored relative to the data section; made absolute in PlaceTensors.
    PD_RETURN_IF_ERROR(Annotate(Read(&info->file_offset), "reading offset"));
    return absl::OkStatus();
  }

  absl::Status ParseAlignment() {
    const GgufValue* value = file_->FindMetadata("general.alignment");
    if (value == nullptr) {
      file_->alignment_ = kGgufDefaultAlignment;
    } else {
      std::optional<uint64_t> alignment = value->AsUint64();
      if (!alignment.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "general.alignment has type ", value->TypeString(), " and value ",
            value->DebugString(), ", expected an unsigned integer"));
      }
      if (*alignment == 0 || !std::has_single_bit(*alignment) ||
          *alignment > std::numeric_limits<uint32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat("general.alignment ", *alignment,
                         " is not a power of two that fits in uint32"));
      }
      file_->alignment_ = static_cast<uint32_t>(*alignment);
    }
    const uint64_t alignment = file_->alignment_;
    // pos_ <= size_ < 2^63, so this cannot overflow.
    file_->data_offset_ = (pos_ + alignment - 1) / alignment * alignment;
    return absl::OkStatus();
  }

  absl::Status PlaceTensors() {
    const uint64_t alignment = file_->alignment_;
    const uint64_t data_offset = file_->data_offset_;
    for (GgufTensorInfo& info : file_->tensors_) {
      const uint64_t relative = info.file_offset;
      if (relative % alignment != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", info.name, "' data offset ", relative,
                         " is not a multiple of the alignment ", alignment));
      }
      if (data_offset > size_ || relative > size_ - data_offset ||
          info.n_bytes > size_ - data_offset - relative) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", info.name, "' data (", info.n_bytes,
            " bytes at data offset ", relative, ", data section at ",
            data_offset, ") extends past end of file (file size ", size_,
            "; truncated?)"));
      }
      info.file_offset = data_offset + relative;
      info.data = info.n_bytes == 0 ? nullptr : base_ + info.file_offset;
    }
    // Overlapping tensor data means a corrupt file.
    std::vector<const GgufTensorInfo*> sorted;
    sorted.reserve(file_->tensors_.size());
    for (const GgufTensorInfo& info : file_->tensors_) {
      if (info.n_bytes > 0) sorted.push_back(&info);
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
                return a->file_offset < b->file_offset;
              });
    for (size_t i = 1; i < sorted.size(); ++i) {
      const GgufTensorInfo& prev = *sorted[i - 1];
      const GgufTensorInfo& next = *sorted[i];
      if (prev.file_offset + prev.n_bytes > next.file_offset) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensors '", prev.name, "' and '", next.name,
                         "' have overlapping data"));
      }
    }
    return absl::OkStatus();
  }

  GgufFile* file_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
};

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(
    const std::string& path) {
  const std::string where = absl::StrCat("GGUF file '", path, "'");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", where));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat ", where));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a regular file"));
  }
  // new, not make_unique: the constructor is private.
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->file_size_ = static_cast<uint64_t>(st.st_size);
  if (file->file_size_ > 0) {
    if (file->file_size_ > std::numeric_limits<size_t>::max()) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": too large to map"));
    }
    void* addr = ::mmap(nullptr, static_cast<size_t>(file->file_size_),
                        PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (addr == MAP_FAILED) {
      return absl::ErrnoToStatus(err, absl::StrCat("cannot mmap ", where));
    }
    file->base_ = static_cast<const uint8_t*>(addr);
  } else {
    ::close(fd);  // Nothing to map; the parser reports truncation.
  }
  GgufParser parser(file.get());
  absl::Status status = parser.Parse();
  if (!status.ok()) return Annotate(status, where);
  return file;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(base_), static_cast<size_t>(file_size_));
  }
}

bool GgufFile::HasMetadata(absl::string_view key) const {
  return FindMetadata(key) != nullptr;
}

const GgufValue* GgufFile::FindMetadata(absl::string_view key) const {
  auto it = metadata_index_.find(key);
  if (it == metadata_index_.end()) return nullptr;
  return &metadata_[it->second].second;
}

absl::StatusOr<const GgufValue*> GgufFile::GetMetadata(
    absl::string_view key) const {
  const GgufValue* value = FindMetadata(key);
  if (value == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("key ", key, " missing in GGUF file '", path_, "'"));
  }
  return value;
}

absl::Status GgufFile::TypeError(absl::string_view key, const GgufValue& value,
                                 absl::string_view expected) const {
  return absl::InvalidArgumentError(
      absl::StrCat("key ", key, " has type ", value.TypeString(), ", expected ",
                   expected, " in GGUF file '", path_, "'"));
}

template <typename T>
absl::StatusOr<T> GgufFile::GetInteger(absl::string_view key,
                                       absl::string_view expected) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  std::optional<T> result;
  if constexpr (std::is_signed_v<T>) {
    std::optional<int64_t> v = value->AsInt64();
    if (v.has_value() && *v >= std::numeric_limits<T>::min() &&
        *v <= std::numeric_limits<T>::max()) {
      result = static_cast<T>(*v);
    }
  } else {
    std::optional<uint64_t> v = value->AsUint64();
    if (v.has_value() && *v <= std::numeric_limits<T>::max()) {
      result = static_cast<T>(*v);
    }
  }
  if (result.has_value()) return *result;
  if (value->AsInt64().has_value() || value->AsUint64().has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key ", key, " value ", value->DebugString(), " (", value->TypeString(),
        ") does not fit in ", expected, " in GGUF file '", path_, "'"));
  }
  return TypeError(key, *value, expected);
}

absl::StatusOr<uint32_t> GgufFile::GetU32(absl::string_view key) const {
  return GetInteger<uint32_t>(key, "uint32");
}

absl::StatusOr<uint64_t> GgufFile::GetU64(absl::string_view key) const {
  return GetInteger<uint64_t>(key, "uint64");
}

absl::StatusOr<int32_t> GgufFile::GetI32(absl::string_view key) const {
  return GetInteger<int32_t>(key, "int32");
}

absl::StatusOr<int64_t> GgufFile::GetI64(absl::string_view key) const {
  return GetInteger<int64_t>(key, "int64");
}

absl::StatusOr<float> GgufFile::GetF32(absl::string_view key) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  if (const float* f = value->get_if<float>()) return *f;
  if (const double* d = value->get_if<double>()) {
    return static_cast<float>(*d);
  }
  return TypeError(key, *value, "float32");
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  if (const bool* b = value->get_if<bool>()) return *b;
  return TypeError(key, *value, "bool");
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  if (const std::string* s = value->string()) return *s;
  return TypeError(key, *value, "string");
}

absl::StatusOr<const GgufArray*> GgufFile::GetArray(
    absl::string_view key) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  if (const GgufArray* array = value->array()) return array;
  return TypeError(key, *value, "array");
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(
    absl::string_view key) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  const GgufArray* array = value->array();
  const std::vector<std::string>* strings =
      array == nullptr ? nullptr : array->get_if<std::string>();
  if (strings == nullptr) return TypeError(key, *value, "array[string]");
  return *strings;
}

absl::StatusOr<std::vector<float>> GgufFile::GetF32Array(
    absl::string_view key) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  const GgufArray* array = value->array();
  if (array != nullptr) {
    if (const auto* floats = array->get_if<float>()) return *floats;
    if (const auto* doubles = array->get_if<double>()) {
      return std::vector<float>(doubles->begin(), doubles->end());
    }
  }
  return TypeError(key, *value, "array[float32]");
}

absl::StatusOr<std::vector<int32_t>> GgufFile::GetI32Array(
    absl::string_view key) const {
  PD_ASSIGN_OR_RETURN(const GgufValue* value, GetMetadata(key));
  const GgufArray* array = value->array();
  if (array == nullptr) return TypeError(key, *value, "array[int32]");
  if (const auto* ints = array->get_if<int32_t>()) return *ints;
  // Any other integer element type, converted when every element fits.
  std::optional<size_t> bad_index;
  std::string bad_value;
  bool integer_elements = true;
  std::vector<int32_t> out;
  std::visit(
      [&](const auto& elements) {
        using T = typename std::decay_t<decltype(elements)>::value_type;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          out.reserve(elements.size());
          for (size_t i = 0; i < elements.size(); ++i) {
            const T v = elements[i];
            if (!std::in_range<int32_t>(v)) {
              bad_index = i;
              bad_value = absl::StrCat(
                  static_cast<std::conditional_t<std::is_signed_v<T>, int64_t,
                                                 uint64_t>>(v));
              return;
            }
            out.push_back(static_cast<int32_t>(v));
          }
        } else {
          integer_elements = false;
        }
      },
      array->storage());
  if (!integer_elements) return TypeError(key, *value, "array[int32]");
  if (bad_index.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", key, " element ", *bad_index, " value ", bad_value,
                     " does not fit in int32 in GGUF file '", path_, "'"));
  }
  return out;
}

absl::StatusOr<std::string> GgufFile::architecture() const {
  return GetString("general.architecture");
}

absl::StatusOr<const GgufTensorInfo*> GgufFile::FindTensor(
    absl::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor ", name, " not found in GGUF file '", path_, "'"));
  }
  return &tensors_[it->second];
}

}  // namespace pdserve::model
