// The GGUF reader and writer on valid files: round trips of every metadata
// and tensor type, the typed getters, the writer's checks of its input, and
// the real default model when PDSERVE_DEFAULT_MODEL names it. Malformed
// files are gguf_error_test's.
#include "model/gguf.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
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
#include "model/default_model.h"
#include "model/gguf.h"
#include "model/gguf_types.h"
#include "model/gguf_writer.h"
#include "model/testing/gguf_test_util.h"

namespace pdserve::model {
namespace {

using gguf_testing::ExpectError;
using gguf_testing::RandomBytes;
using gguf_testing::TempPath;
using kernels::AllGgmlTypes;
using kernels::GgmlType;
using kernels::GgmlTypeInfo;

// ---------------------------------------------------------------------------
// Round trips.

// One value of each kind, including edge values, strings with NUL bytes and
// nested arrays.
std::vector<std::pair<std::string, GgufValue>> AllKindsOfMetadata() {
  std::vector<std::pair<std::string, GgufValue>> kv;
  kv.emplace_back("u8", GgufValue(uint8_t{255}));
  kv.emplace_back("i8", GgufValue(int8_t{-128}));
  kv.emplace_back("u16", GgufValue(uint16_t{65535}));
  kv.emplace_back("i16", GgufValue(int16_t{-32768}));
  kv.emplace_back("u32", GgufValue(uint32_t{4000000000u}));
  kv.emplace_back("i32", GgufValue(int32_t{-2000000000}));
  kv.emplace_back("f32", GgufValue(3.25f));
  kv.emplace_back("bool_true", GgufValue(true));
  kv.emplace_back("bool_false", GgufValue(false));
  kv.emplace_back("str", GgufValue("hello \xe2\x96\x81world"));
  kv.emplace_back("str_empty", GgufValue(""));
  kv.emplace_back("str_nul", GgufValue(std::string("a\0b", 3)));
  kv.emplace_back("u64", GgufValue(std::numeric_limits<uint64_t>::max()));
  kv.emplace_back("i64", GgufValue(std::numeric_limits<int64_t>::min()));
  kv.emplace_back("f64", GgufValue(-1.0e300));
  kv.emplace_back("arr_u8", GgufValue::ArrayOf(std::vector<uint8_t>{0, 255}));
  kv.emplace_back("arr_i8", GgufValue::ArrayOf(std::vector<int8_t>{-1, 1}));
  kv.emplace_back("arr_u16", GgufValue::ArrayOf(std::vector<uint16_t>{7}));
  kv.emplace_back("arr_i16", GgufValue::ArrayOf(std::vector<int16_t>{-7, 8}));
  kv.emplace_back("arr_u32", GgufValue::ArrayOf(std::vector<uint32_t>{1, 2}));
  kv.emplace_back("arr_i32",
                  GgufValue::ArrayOf(std::vector<int32_t>{-1, 0, 1 << 30}));
  kv.emplace_back("arr_f32",
                  GgufValue::ArrayOf(std::vector<float>{0.5f, -2.0f}));
  kv.emplace_back("arr_bool",
                  GgufValue::ArrayOf(std::vector<bool>{true, false, true}));
  kv.emplace_back("arr_str", GgufValue::ArrayOf(std::vector<std::string>{
                                 "<s>", "", std::string("x\0y", 3)}));
  kv.emplace_back("arr_u64", GgufValue::ArrayOf(std::vector<uint64_t>{
                                 std::numeric_limits<uint64_t>::max()}));
  kv.emplace_back("arr_i64", GgufValue::ArrayOf(std::vector<int64_t>{-5}));
  kv.emplace_back("arr_f64", GgufValue::ArrayOf(std::vector<double>{1e-300}));
  kv.emplace_back("arr_empty", GgufValue::ArrayOf(std::vector<float>{}));
  kv.emplace_back("arr_nested",
                  GgufValue::ArrayOf(std::vector<GgufArray>{
                      GgufArray(std::vector<int32_t>{1, 2}),
                      GgufArray(std::vector<std::string>{"a", "b"}),
                      GgufArray(std::vector<GgufArray>{
                          GgufArray(std::vector<double>{2.5}),
                          GgufArray(std::vector<GgufArray>{})}),
                      GgufArray(std::vector<bool>{})}));
  return kv;
}

TEST(GgufRoundTripTest, EveryMetadataType) {
  auto writer = GgufWriter::Create();
  ASSERT_TRUE(writer.ok());
  const auto kv = AllKindsOfMetadata();
  for (const auto& [key, value] : kv) {
    ASSERT_TRUE((*writer)->AddMetadata(key, value).ok()) << key;
  }
  const std::string path = TempPath("all_metadata.gguf");
  ASSERT_TRUE((*writer)->WriteFile(path).ok());

  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.file_size(), (*writer)->Serialize().size());
  ASSERT_EQ(f.metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    SCOPED_TRACE(kv[i].first);
    EXPECT_EQ(f.metadata()[i].first, kv[i].first);
    EXPECT_EQ(f.metadata()[i].second.type(), kv[i].second.type());
    EXPECT_TRUE(f.metadata()[i].second == kv[i].second)
        << f.metadata()[i].second.DebugString() << " vs "
        << kv[i].second.DebugString();
    const GgufValue* found = f.FindMetadata(kv[i].first);
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(found, &f.metadata()[i].second);
  }
  EXPECT_FALSE(f.HasMetadata("nope"));
  EXPECT_EQ(f.FindMetadata("nope"), nullptr);
}

TEST(GgufRoundTripTest, EveryTensorTypeAndAlignment) {
  for (uint32_t alignment : {1u, 8u, 32u, 64u, 256u, 4096u}) {
    SCOPED_TRACE(absl::StrCat("alignment ", alignment));
    auto writer = GgufWriter::Create({.alignment = alignment});
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->AddMetadata("general.architecture", "test").ok());
    std::vector<std::vector<uint8_t>> payloads;
    uint32_t seed = 1;
    for (const GgmlTypeInfo& t : AllGgmlTypes()) {
      const std::vector<uint64_t> dims = {2 * uint64_t{t.block_size}, 3};
      payloads.push_back(RandomBytes(6 * t.type_size, seed++));
      ASSERT_TRUE((*writer)
                      ->AddTensor(absl::StrCat("t.", t.name), dims, t.type,
                                  payloads.back())
                      .ok())
          << t.name;
    }
    // A 1-D tensor and a 4-D tensor too.
    const std::vector<float> values = {1, 2, 3, 4, 5};
    ASSERT_TRUE((*writer)->AddF32Tensor("vec", {5}, values).ok());
    payloads.push_back(RandomBytes(2 * 3 * 4 * 5 * 2, seed++));
    ASSERT_TRUE(
        (*writer)
            ->AddTensor("four_d", {2, 3, 4, 5}, GgmlType::kF16, payloads.back())
            .ok());

    const std::string path = TempPath("tensors.gguf");
    ASSERT_TRUE((*writer)->WriteFile(path).ok());
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const GgufFile& f = **file;
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    if (alignment != 32) {
      EXPECT_EQ(*f.GetU32("general.alignment"), alignment);
    } else {
      EXPECT_FALSE(f.HasMetadata("general.alignment"));
    }
    EXPECT_EQ(*f.architecture(), "test");
    ASSERT_EQ(f.tensors().size(), AllGgmlTypes().size() + 2);

    for (size_t i = 0; i < AllGgmlTypes().size(); ++i) {
      const GgmlTypeInfo& t = AllGgmlTypes()[i];
      SCOPED_TRACE(t.name);
      const GgufTensorInfo& info = f.tensors()[i];
      EXPECT_EQ(info.name, absl::StrCat("t.", t.name));
      EXPECT_EQ(info.type, t.type);
      EXPECT_EQ(info.dims,
                (std::vector<uint64_t>{2 * uint64_t{t.block_size}, 3}));
      EXPECT_EQ(info.n_elements, 6u * t.block_size);
      EXPECT_EQ(info.n_bytes, 6u * t.type_size);
      EXPECT_EQ(info.file_offset % alignment, 0u);
      EXPECT_GE(info.file_offset, f.data_offset());
      // The mapping is page-aligned, so file-relative alignment is also
      // memory alignment.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(info.data) % alignment, 0u);
      ASSERT_EQ(payloads[i].size(), info.n_bytes);
      EXPECT_EQ(std::memcmp(info.data, payloads[i].data(), info.n_bytes), 0);
      absl::StatusOr<const GgufTensorInfo*> found = f.FindTensor(info.name);
      ASSERT_TRUE(found.ok());
      EXPECT_EQ(*found, &info);
    }
    absl::StatusOr<const GgufTensorInfo*> vec = f.FindTensor("vec");
    ASSERT_TRUE(vec.ok());
    EXPECT_EQ((*vec)->dims, std::vector<uint64_t>{5});
    ASSERT_EQ((*vec)->n_bytes, 20u);
    EXPECT_EQ(std::memcmp((*vec)->data, values.data(), 20), 0);
    absl::StatusOr<const GgufTensorInfo*> four_d = f.FindTensor("four_d");
    ASSERT_TRUE(four_d.ok());
    EXPECT_EQ((*four_d)->dims, (std::vector<uint64_t>{2, 3, 4, 5}));
    EXPECT_EQ((*four_d)->n_elements, 120u);
    EXPECT_EQ(std::memcmp((*four_d)->data, payloads.back().data(), 240), 0);
  }
}

TEST(GgufRoundTripTest, SerializeMatchesWriteFile) {
  auto writer = GgufWriter::Create();
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->AddMetadata("k", 1u).ok());
  ASSERT_TRUE(
      (*writer)->AddF32Tensor("t", {3}, std::vector<float>{1, 2, 3}).ok());
  const std::string bytes = (*writer)->Serialize();
  const std::string path = TempPath("serialize.gguf");
  ASSERT_TRUE((*writer)->WriteFile(path).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string on_disk((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
  EXPECT_EQ(on_disk, bytes);
  EXPECT_EQ(bytes.substr(0, 4), "GGUF");
  EXPECT_EQ(bytes.size() % 32, 0u);  // the last tensor is padded too
}

// ---------------------------------------------------------------------------
// Typed getters.

class GgufGetterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto writer = GgufWriter::Create();
    ASSERT_TRUE(writer.ok());
    GgufWriter& w = **writer;
    ASSERT_TRUE(w.AddMetadata("general.architecture", "llama").ok());
    ASSERT_TRUE(w.AddMetadata("u8", uint8_t{7}).ok());
    ASSERT_TRUE(w.AddMetadata("i32_pos", int32_t{30}).ok());
    ASSERT_TRUE(w.AddMetadata("i32_neg", int32_t{-1}).ok());
    ASSERT_TRUE(w.AddMetadata("u64_big", uint64_t{1} << 40).ok());
    ASSERT_TRUE(w.AddMetadata("u32", uint32_t{4000000000u}).ok());
    ASSERT_TRUE(w.AddMetadata("f32", 0.5f).ok());
    ASSERT_TRUE(w.AddMetadata("f64", 0.25).ok());
    ASSERT_TRUE(w.AddMetadata("flag", true).ok());
    ASSERT_TRUE(w.AddMetadata("name", "SmolLM2").ok());
    ASSERT_TRUE(
        w.AddMetadata("tokens", GgufValue::ArrayOf(std::vector<std::string>{
                                    "<|im_start|>", "a", "b"}))
            .ok());
    ASSERT_TRUE(w.AddMetadata("scores", GgufValue::ArrayOf(std::vector<float>{
                                            -1.0f, 0.0f, 2.5f}))
                    .ok());
    ASSERT_TRUE(w.AddMetadata("ids_u8",
                              GgufValue::ArrayOf(std::vector<uint8_t>{1, 2, 3}))
                    .ok());
    ASSERT_TRUE(w.AddMetadata("ids_i32",
                              GgufValue::ArrayOf(std::vector<int32_t>{-1, 4}))
                    .ok());
    ASSERT_TRUE(
        w.AddMetadata("ids_u64_big", GgufValue::ArrayOf(std::vector<uint64_t>{
                                         1, uint64_t{1} << 40}))
            .ok());
    path_ = TempPath("getters.gguf");
    ASSERT_TRUE(w.WriteFile(path_).ok());
    auto file = GgufFile::Open(path_);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
  }

  std::string path_;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufGetterTest, Values) {
  const GgufFile& f = *file_;
  EXPECT_EQ(*f.architecture(), "llama");
  EXPECT_EQ(*f.GetU32("u8"), 7u);
  EXPECT_EQ(*f.GetU32("i32_pos"), 30u);
  EXPECT_EQ(*f.GetU64("i32_pos"), 30u);
  EXPECT_EQ(*f.GetI32("u8"), 7);
  EXPECT_EQ(*f.GetI32("i32_neg"), -1);
  EXPECT_EQ(*f.GetI64("i32_neg"), -1);
  EXPECT_EQ(*f.GetU64("u64_big"), uint64_t{1} << 40);
  EXPECT_EQ(*f.GetU32("u32"), 4000000000u);
  EXPECT_EQ(*f.GetF32("f32"), 0.5f);
  EXPECT_EQ(*f.GetF32("f64"), 0.25f);
  EXPECT_TRUE(*f.GetBool("flag"));
  EXPECT_EQ(*f.GetString("name"), "SmolLM2");
  EXPECT_EQ(*f.GetStringArray("tokens"),
            (std::vector<std::string>{"<|im_start|>", "a", "b"}));
  EXPECT_EQ(*f.GetF32Array("scores"), (std::vector<float>{-1.0f, 0.0f, 2.5f}));
  EXPECT_EQ(*f.GetI32Array("ids_u8"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*f.GetI32Array("ids_i32"), (std::vector<int32_t>{-1, 4}));
  absl::StatusOr<const GgufArray*> tokens = f.GetArray("tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_NE((*tokens)->get_if<std::string>(), nullptr);
  EXPECT_EQ((*tokens)->get_if<std::string>()->at(0), "<|im_start|>");
  absl::StatusOr<const GgufValue*> v = f.GetMetadata("name");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*(*v)->string(), "SmolLM2");
}

TEST_F(GgufGetterTest, Errors) {
  const GgufFile& f = *file_;
  absl::StatusOr<uint32_t> missing = f.GetU32("llama.block_count");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  ExpectError(missing, {"key llama.block_count missing", path_});
  ExpectError(f.GetMetadata("nope"), {"key nope missing"});
  ExpectError(f.GetU32("name"),
              {"key name has type string, expected uint32", path_});
  ExpectError(f.GetU32("i32_neg"), {"i32_neg", "does not fit", "uint32"});
  ExpectError(f.GetU32("u64_big"), {"does not fit", "uint32"});
  ExpectError(f.GetI32("u32"), {"does not fit", "int32"});
  ExpectError(f.GetU32("flag"), {"key flag has type bool, expected uint32"});
  ExpectError(f.GetU32("f32"), {"has type float32"});
  ExpectError(f.GetF32("u8"), {"key u8 has type uint8, expected float32"});
  ExpectError(f.GetBool("u8"), {"expected bool"});
  ExpectError(f.GetArray("u8"), {"key u8 has type uint8, expected array"});
  ExpectError(f.GetString("u8"), {"key u8 has type uint8, expected string"});
  ExpectError(f.GetStringArray("scores"),
              {"key scores has type array[float32], expected array[string]"});
  ExpectError(f.GetStringArray("name"),
              {"has type string, expected array[string]"});
  ExpectError(f.GetF32Array("tokens"),
              {"has type array[string], expected array[float32]"});
  ExpectError(f.GetI32Array("scores"), {"expected array[int32]"});
  ExpectError(f.GetI32Array("ids_u64_big"),
              {"ids_u64_big", "element 1", "does not fit in int32"});
}

TEST_F(GgufGetterTest, FindTensorMissing) {
  absl::StatusOr<const GgufTensorInfo*> t =
      file_->FindTensor("token_embd.weight");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  ExpectError(t, {"tensor token_embd.weight not found in", path_});
}

// ---------------------------------------------------------------------------
// Writer validation.

TEST(GgufWriterTest, RejectsBadInput) {
  ExpectError(GgufWriter::Create({.alignment = 0}), {"power of two"});
  ExpectError(GgufWriter::Create({.alignment = 48}), {"power of two"});
  auto writer = GgufWriter::Create();
  ASSERT_TRUE(writer.ok());
  GgufWriter& w = **writer;
  ASSERT_TRUE(w.AddMetadata("k", 1u).ok());
  absl::Status dup = w.AddMetadata("k", 2u);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  ExpectError(dup, {"duplicate", "k"});
  ExpectError(w.AddMetadata("", 1u), {"empty"});
  ExpectError(w.AddMetadata("general.alignment", 64u), {"alignment"});
  GgufArray deep(std::vector<uint8_t>{1});
  for (int i = 0; i < GgufValue::kMaxArrayDepth; ++i) {
    deep = GgufArray(std::vector<GgufArray>{deep});
  }
  ExpectError(w.AddMetadata("deep", deep), {"deep", "nested"});

  const std::vector<uint8_t> q4 = RandomBytes(18, 3);
  ExpectError(w.AddTensor("short", {32}, GgmlType::kQ4_0,
                          absl::MakeConstSpan(q4.data(), 17)),
              {"short", "need 18 bytes, got 17"});
  ExpectError(w.AddTensor("rows", {16, 2}, GgmlType::kQ4_0, q4),
              {"rows", "block size 32"});
  ExpectError(w.AddTensor("", {32}, GgmlType::kQ4_0, q4), {"empty"});
  ExpectError(w.AddTensor(std::string(64, 'n'), {32}, GgmlType::kQ4_0, q4),
              {"at most 63"});
  ExpectError(w.AddTensor("nodims", {}, GgmlType::kQ4_0, q4), {"0 dims"});
  ExpectError(w.AddTensor("five", {32, 1, 1, 1, 1}, GgmlType::kQ4_0, q4),
              {"5 dims"});
  ExpectError(w.AddTensor("type", {32}, static_cast<GgmlType>(99), q4),
              {"unknown ggml type id 99"});
  ExpectError(w.AddTensor("ovf", {uint64_t{1} << 40, uint64_t{1} << 40},
                          GgmlType::kF32, q4),
              {"overflows"});
  ASSERT_TRUE(w.AddTensor("ok", {32}, GgmlType::kQ4_0, q4).ok());
  absl::Status dup_tensor = w.AddTensor("ok", {32}, GgmlType::kQ4_0, q4);
  EXPECT_EQ(dup_tensor.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w.tensor_count(), 1u);
  EXPECT_EQ(w.metadata_count(), 1u);
  ExpectError(w.WriteFile("/nonexistent_dir_pdserve/x.gguf"),
              {"/nonexistent_dir_pdserve/x.gguf"});
}

// ---------------------------------------------------------------------------
// The real default model, when available.

TEST(GgufRealModelTest, SmolLM2) {
  const std::string path = FindDefaultModel();
  if (path.empty()) GTEST_SKIP() << kNoDefaultModel;
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(*f.architecture(), "llama");
  EXPECT_EQ(*f.GetU32("llama.block_count"), 30u);
  EXPECT_EQ(*f.GetU32("llama.embedding_length"), 576u);
  EXPECT_EQ(*f.GetU32("llama.attention.head_count"), 9u);
  EXPECT_EQ(*f.GetU32("llama.attention.head_count_kv"), 3u);
  absl::StatusOr<std::vector<std::string>> tokens =
      f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 49152u);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  // 30 blocks x 9 tensors + token_embd + output_norm.
  EXPECT_EQ(f.tensors().size(), 272u);
  absl::StatusOr<const GgufTensorInfo*> embd =
      f.FindTensor("token_embd.weight");
  ASSERT_TRUE(embd.ok()) << embd.status();
  EXPECT_EQ((*embd)->dims, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ((*embd)->type, GgmlType::kQ8_0);
  EXPECT_EQ(*f.GetU32("llama.context_length"), 8192u);
  EXPECT_EQ(*f.GetF32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(*f.GetU32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*f.GetU32("tokenizer.ggml.eos_token_id"), 2u);
  // Tied embeddings: no separate output.weight.
  EXPECT_FALSE(f.FindTensor("output.weight").ok());
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_LE(t.file_offset + t.n_bytes, f.file_size()) << t.name;
  }
}

}  // namespace
}  // namespace pdserve::model
