// The GGUF reader on malformed files, built byte by byte: every truncation,
// random corruption, and each header, metadata and tensor-info error it
// must name.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ggml_type.h"
#include "model/gguf.h"
#include "model/gguf_types.h"
#include "model/gguf_writer.h"
#include "model/testing/gguf_test_util.h"

namespace pdserve::model {
namespace {

using gguf_testing::ExpectError;
using gguf_testing::RandomBytes;
using gguf_testing::TempPath;
using kernels::GgmlType;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Files written byte by byte.

std::string WriteBytes(absl::string_view name, absl::string_view bytes) {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  EXPECT_TRUE(out.good()) << path;
  return path;
}

absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(absl::string_view name,
                                                    absl::string_view bytes) {
  return GgufFile::Open(WriteBytes(name, bytes));
}

// Builds arbitrary (possibly invalid) GGUF bytes by hand.
class RawGguf {
 public:
  RawGguf& Magic(absl::string_view magic = "GGUF") {
    bytes_.append(magic.data(), magic.size());
    return *this;
  }
  RawGguf& Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    Magic();
    return U32(version).U64(n_tensors).U64(n_kv);
  }
  RawGguf& U8(uint8_t v) { return Pod(v); }
  RawGguf& U32(uint32_t v) { return Pod(v); }
  RawGguf& U64(uint64_t v) { return Pod(v); }
  RawGguf& Str(absl::string_view s) {
    U64(s.size());
    bytes_.append(s.data(), s.size());
    return *this;
  }
  // key, type id, then the caller appends the payload.
  RawGguf& Key(absl::string_view key, uint32_t type) {
    return Str(key).U32(type);
  }
  RawGguf& Tensor(absl::string_view name, std::vector<uint64_t> dims,
                  uint32_t type, uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  RawGguf& PadTo(size_t alignment) {
    bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment,
                  '\0');
    return *this;
  }
  RawGguf& Zeros(size_t n) {
    bytes_.append(n, '\0');
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  template <typename T>
  RawGguf& Pod(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes_.append(b, sizeof(T));
    return *this;
  }
  std::string bytes_;
};

constexpr uint32_t kTypeU32 = 4;
constexpr uint32_t kTypeString = 8;
constexpr uint32_t kTypeArray = 9;
constexpr uint32_t kGgmlF32 = 0;

// ---------------------------------------------------------------------------
// Malformed files.

// A small valid file with metadata of several kinds (including a string
// array and a nested array) and two tensors. The last tensor's size is a
// multiple of the alignment, so the file ends exactly where its data ends
// and every strict prefix is invalid.
std::string SmallValidFile() {
  auto writer = GgufWriter::Create();
  EXPECT_TRUE(writer.ok());
  GgufWriter& w = **writer;
  EXPECT_TRUE(w.AddMetadata("general.architecture", "llama").ok());
  EXPECT_TRUE(w.AddMetadata("llama.block_count", 2u).ok());
  EXPECT_TRUE(w.AddMetadata("f", 1.0f).ok());
  EXPECT_TRUE(
      w.AddMetadata("tokens",
                    GgufValue::ArrayOf(std::vector<std::string>{"a", "bc", ""}))
          .ok());
  EXPECT_TRUE(
      w.AddMetadata("nested", GgufValue::ArrayOf(std::vector<GgufArray>{
                                  GgufArray(std::vector<int16_t>{1}),
                                  GgufArray(std::vector<std::string>{"x"})}))
          .ok());
  EXPECT_TRUE(
      w.AddTensor("q", {32, 2}, GgmlType::kQ4_1, RandomBytes(40, 1)).ok());
  EXPECT_TRUE(
      w.AddTensor("w", {8, 2}, GgmlType::kF32, RandomBytes(64, 2)).ok());
  return w.Serialize();
}

TEST(GgufErrorTest, EveryTruncationFails) {
  const std::string full = SmallValidFile();
  ASSERT_TRUE(OpenBytes("full.gguf", full).ok());
  const std::string path = TempPath("prefix.gguf");
  for (size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE(absl::StrCat("prefix length ", n, " of ", full.size()));
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(full.data(), static_cast<std::streamsize>(n));
    }
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(file.status().message());
    EXPECT_THAT(message, HasSubstr(path));
    EXPECT_TRUE(message.find("truncated") != std::string::npos ||
                message.find("past end of file") != std::string::npos ||
                message.find("impossible") != std::string::npos)
        << message;
  }
}

// Random byte corruption must give either an error or a consistent file,
// never a crash or an out-of-bounds read (run under ASan to see the latter).
TEST(GgufErrorTest, RandomCorruptionNeverCrashes) {
  const std::string full = SmallValidFile();
  const std::string path = TempPath("corrupt.gguf");
  std::mt19937 rng(12345);
  int opened = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      // Mostly hit the header/metadata/tensor-info part, where parsing is.
      const size_t limit = (rng() % 4 == 0) ? bytes.size() : 200;
      bytes[rng() % std::min(limit, bytes.size())] =
          static_cast<char>(rng() % 4 == 0 ? 0xff : rng());
    }
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    if (!file.ok()) {
      EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
      continue;
    }
    ++opened;
    for (const GgufTensorInfo& t : (*file)->tensors()) {
      ASSERT_LE(t.file_offset + t.n_bytes, (*file)->file_size());
      if (t.n_bytes > 0) {
        volatile uint8_t last = t.data[t.n_bytes - 1];
        (void)last;
      }
    }
  }
  EXPECT_GT(opened, 0);  // some flips only change values, not structure
}

TEST(GgufErrorTest, BadMagic) {
  RawGguf g;
  g.Magic("GGML").U32(3).U64(0).U64(0);
  ExpectError(OpenBytes("magic.gguf", g.bytes()), {"bad magic", "GGML"});
}

TEST(GgufErrorTest, Version1Refused) {
  RawGguf g;
  g.Header(1, 0, 0);
  ExpectError(OpenBytes("v1.gguf", g.bytes()),
              {"unsupported GGUF version 1", "versions 2 and 3"});
}

TEST(GgufErrorTest, OtherVersionsRefused) {
  RawGguf v4;
  v4.Header(4, 0, 0);
  ExpectError(OpenBytes("v4.gguf", v4.bytes()), {"unsupported GGUF version 4"});
  RawGguf big_endian;
  big_endian.Header(0x03000000, 0, 0);
  ExpectError(OpenBytes("be.gguf", big_endian.bytes()), {"big-endian"});
}

TEST(GgufErrorTest, Version2Accepted) {
  RawGguf g;
  g.Header(2, 0, 1).Key("general.architecture", kTypeString).Str("llama");
  auto file = OpenBytes("v2.gguf", g.bytes());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 2u);
  EXPECT_EQ(*(*file)->architecture(), "llama");
}

TEST(GgufErrorTest, UnknownMetadataType) {
  RawGguf g;
  g.Header(3, 0, 1).Key("weird.key", 13).U32(0);
  ExpectError(OpenBytes("mtype.gguf", g.bytes()),
              {"weird.key", "unknown metadata value type id 13"});
}

TEST(GgufErrorTest, UnknownArrayElementType) {
  RawGguf g;
  g.Header(3, 0, 1).Key("arr", kTypeArray).U32(77).U64(1).U32(0);
  ExpectError(OpenBytes("atype.gguf", g.bytes()),
              {"arr", "unknown metadata value type id 77"});
}

TEST(GgufErrorTest, UnknownTensorType) {
  RawGguf g;
  g.Header(3, 1, 0).Tensor("blk.0.w", {4}, 99, 0).PadTo(32).Zeros(32);
  ExpectError(OpenBytes("ttype.gguf", g.bytes()),
              {"blk.0.w", "unknown ggml type id 99"});
  RawGguf iq;
  iq.Header(3, 1, 0).Tensor("blk.0.w", {256}, 16, 0).PadTo(32).Zeros(256);
  ExpectError(OpenBytes("ttype_iq.gguf", iq.bytes()),
              {"blk.0.w", "unsupported ggml type iq2_xxs"});
}

TEST(GgufErrorTest, TensorPastEndOfFile) {
  RawGguf g;
  // 16 f32 = 64 bytes declared, only 32 present.
  g.Header(3, 1, 0).Tensor("big", {16}, kGgmlF32, 0).PadTo(32).Zeros(32);
  ExpectError(OpenBytes("pastend.gguf", g.bytes()),
              {"tensor 'big'", "past end of file"});
  RawGguf far;
  far.Header(3, 1, 0)
      .Tensor("far", {1}, kGgmlF32, uint64_t{1} << 62)
      .PadTo(32)
      .Zeros(32);
  ExpectError(OpenBytes("far.gguf", far.bytes()),
              {"tensor 'far'", "past end of file"});
}

TEST(GgufErrorTest, MisalignedTensorOffset) {
  RawGguf g;
  g.Header(3, 1, 0).Tensor("t", {1}, kGgmlF32, 4).PadTo(32).Zeros(64);
  ExpectError(OpenBytes("misaligned.gguf", g.bytes()),
              {"tensor 't'", "offset 4", "not a multiple of the alignment 32"});
}

TEST(GgufErrorTest, DuplicateTensorName) {
  RawGguf g;
  g.Header(3, 2, 0)
      .Tensor("t", {8}, kGgmlF32, 0)
      .Tensor("t", {8}, kGgmlF32, 32)
      .PadTo(32)
      .Zeros(64);
  ExpectError(OpenBytes("duptensor.gguf", g.bytes()),
              {"duplicate tensor name 't'"});
}

TEST(GgufErrorTest, OverlappingTensors) {
  RawGguf g;
  g.Header(3, 2, 0)
      .Tensor("a", {16}, kGgmlF32, 0)
      .Tensor("b", {8}, kGgmlF32, 32)
      .PadTo(32)
      .Zeros(64);
  ExpectError(OpenBytes("overlap.gguf", g.bytes()), {"'a'", "'b'", "overlap"});
}

TEST(GgufErrorTest, DuplicateMetadataKey) {
  RawGguf g;
  g.Header(3, 0, 2).Key("k", kTypeU32).U32(1).Key("k", kTypeU32).U32(2);
  ExpectError(OpenBytes("dupkey.gguf", g.bytes()),
              {"duplicate metadata key 'k'"});
}

TEST(GgufErrorTest, ElementCountOverflow) {
  RawGguf g;
  g.Header(3, 1, 0)
      .Tensor("huge", {uint64_t{1} << 32, uint64_t{1} << 32}, kGgmlF32, 0)
      .PadTo(32);
  ExpectError(OpenBytes("overflow.gguf", g.bytes()),
              {"tensor 'huge'", "element count overflows"});
  RawGguf dim;
  dim.Header(3, 1, 0).Tensor("neg", {~uint64_t{0}}, kGgmlF32, 0).PadTo(32);
  ExpectError(OpenBytes("negdim.gguf", dim.bytes()),
              {"tensor 'neg'", "INT64_MAX"});
}

TEST(GgufErrorTest, BadDims) {
  RawGguf g;
  g.Header(3, 1, 0).Tensor("five", {1, 1, 1, 1, 1}, kGgmlF32, 0).PadTo(32);
  ExpectError(OpenBytes("fivedims.gguf", g.bytes()),
              {"tensor 'five'", "n_dims 5"});
  RawGguf zero;
  zero.Header(3, 1, 0).Tensor("zero", {}, kGgmlF32, 0).PadTo(32);
  ExpectError(OpenBytes("zerodims.gguf", zero.bytes()),
              {"tensor 'zero'", "n_dims 0"});
  RawGguf rows;
  rows.Header(3, 1, 0).Tensor("q", {16, 2}, 2, 0).PadTo(32).Zeros(64);
  ExpectError(OpenBytes("rows.gguf", rows.bytes()),
              {"tensor 'q'", "not a multiple of the block size 32"});
}

TEST(GgufErrorTest, AbsurdCounts) {
  RawGguf kv;
  kv.Header(3, 0, uint64_t{1} << 60);
  ExpectError(OpenBytes("kvcount.gguf", kv.bytes()),
              {"metadata key/value count", "impossible"});
  RawGguf tensors;
  tensors.Header(3, uint64_t{1} << 60, 0);
  ExpectError(OpenBytes("tcount.gguf", tensors.bytes()),
              {"tensor count", "impossible"});
  RawGguf array;
  array.Header(3, 0, 1)
      .Key("arr", kTypeArray)
      .U32(kTypeString)
      .U64(uint64_t{1} << 58);
  array.Zeros(64);
  ExpectError(OpenBytes("acount.gguf", array.bytes()), {"arr", "impossible"});
  RawGguf str;
  str.Header(3, 0, 1).Key("s", kTypeString).U64(uint64_t{1} << 62).Zeros(8);
  ExpectError(OpenBytes("slen.gguf", str.bytes()), {"'s'", "truncated"});
}

TEST(GgufErrorTest, ArrayNestingTooDeep) {
  RawGguf g;
  g.Header(3, 0, 1).Key("deep", kTypeArray);
  for (int i = 0; i < 100; ++i) g.U32(kTypeArray).U64(1);
  g.U32(kTypeU32).U64(0);
  ExpectError(OpenBytes("deep.gguf", g.bytes()), {"deep", "nested"});
}

TEST(GgufErrorTest, BadAlignment) {
  RawGguf g;
  g.Header(3, 0, 1).Key("general.alignment", kTypeU32).U32(48);
  ExpectError(OpenBytes("align48.gguf", g.bytes()),
              {"general.alignment 48", "power of two"});
  RawGguf zero;
  zero.Header(3, 0, 1).Key("general.alignment", kTypeU32).U32(0);
  ExpectError(OpenBytes("align0.gguf", zero.bytes()), {"general.alignment 0"});
  RawGguf str;
  str.Header(3, 0, 1).Key("general.alignment", kTypeString).Str("64");
  ExpectError(OpenBytes("alignstr.gguf", str.bytes()),
              {"general.alignment has type string"});
}

TEST(GgufErrorTest, FileProblems) {
  const std::string missing = TempPath("does_not_exist.gguf");
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(missing);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  ExpectError(file, {missing});
  ExpectError(GgufFile::Open(::testing::TempDir()), {"not a regular file"});
  ExpectError(OpenBytes("empty.gguf", ""), {"truncated"});
}

}  // namespace
}  // namespace pdserve::model
