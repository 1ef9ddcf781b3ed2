// Matrix-vector and matrix-matrix products of ggml-typed weight matrices with
// float activations, computed the way llama.cpp's CPU backend computes them,
// so that greedy decoding agrees with it token for token.
//
// llama.cpp never multiplies quantized weights by floats. It first converts
// each activation row to the weight type's "vec_dot_type" and then takes
// integer dot products block by block, scaled by the block scales:
//
//   weight type              activation format (VecDotType)
//   Q4_0, Q5_0, Q8_0         Q8_0: 32 elements, 34 bytes: f16 d; int8 q[32].
//                              d = amax/127, q = roundf(x * (d ? 1/d : 0)).
//   Q4_1, Q5_1               Q8_1: 32 elements, 36 bytes: f16 d; f16 s;
//                              int8 q[32]. As Q8_0, plus s = d * sum(q)
//                              (d before its rounding to f16).
//   Q4_K, Q5_K, Q6_K         Q8_K: 256 elements, 292 bytes: f32 d;
//                              int8 q[256]; int16 bsums[16]. With max the
//                              element of largest magnitude (sign kept),
//                              q = min(127, round_half_even(-127/max * x)),
//                              d = 1 / (-127/max), bsums = sums of q per 16.
//                              An all-zero chunk has d = 0 and q = 0.
//   F32 / F16 / BF16         the same type: x itself, x rounded to f16, or
//                              x rounded to bf16 (round to nearest even).
//
// (Layouts are little-endian and packed, as ggml's block_q8_0 / block_q8_1 /
// block_q8_K.) The dot products follow ggml's generic (reference) vec_dot
// functions in ggml-cpu/quants.c operation by operation: exact int32 sums
// per block, then float arithmetic in ggml's order, e.g. for Q4_1
// sumf += (d_w * d_x) * sumi + m_w * s_x, and for the K-quants eight float
// lane sums of d * (per-lane integer sums) minus dmin * (bsums . mins). This
// library is compiled with -ffp-contract=off so that no multiply-add is fused
// and results do not depend on -march: activation bytes and dot products are
// bit for bit those of ggml's quantize_row_q8_*_ref and *_generic functions
// built the same way. The F32/F16/BF16 dot products sum products in float
// over 16 lanes.
//
// Note: llama.cpp's x86 AVX builds quantize Q8_0 / Q8_1 activations with a
// different expression (127/amax instead of 1/(amax/127), rounding half to
// even), which changes a quant by one in about 1 block in 10^4, and their
// SIMD dot products add in another order. This implementation follows
// ggml's reference definitions.
//
// Preconditions of the hot-path functions (QuantizeActivations, VecDot,
// MatMulRows) are checked once by callers with ValidateVecDot, at model
// load; these functions do no checks of their own beyond staying memory-safe
// for unsupported types (see each function). Activations must be finite.
//
// Ownership: every function borrows its buffers for the duration of the call
// and keeps nothing; none allocates memory. Thread-safety: stateless;
// concurrent calls are safe as long as no call writes a buffer another call
// reads or writes (e.g. MatMulRows on disjoint row ranges of one output).
#ifndef PDSERVE_KERNELS_MATMUL_H_
#define PDSERVE_KERNELS_MATMUL_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ggml_type.h"

namespace pdserve::kernels {

// The activation format that the dot product of `weight_type` consumes (see
// the table above). UNIMPLEMENTED, naming the type, for any other type.
absl::StatusOr<GgmlType> VecDotType(GgmlType weight_type);

// OK when rows of `n` elements of `weight_type` are supported: the type has
// a VecDotType and n is a positive multiple of its block size (32 or 256;
// 1 for F32/F16/BF16). UNIMPLEMENTED or INVALID_ARGUMENT otherwise.
absl::Status ValidateVecDot(GgmlType weight_type, int64_t n);

// Bytes of `n` activations in `vec_dot_type` (one of the activation formats
// above; n a multiple of its block size). -1 for any other type.
int64_t ActivationRowBytes(GgmlType vec_dot_type, int64_t n);

// Converts the `n` floats of `x` to `vec_dot_type`, writing
// ActivationRowBytes(vec_dot_type, n) bytes to `out` (no alignment needed).
// Writes nothing for a type that is not an activation format.
void QuantizeActivations(GgmlType vec_dot_type, const float* x, int64_t n,
                         void* out);

// Dot product of one weight row (`n` elements of `weight_type`) with one
// activation row (`n` activations quantized to VecDotType(weight_type)).
// NaN for an unsupported weight type.
// VecDot computed by the portable scalar kernel, whatever the CPU: the
// reference the SIMD kernels (picked at run time) must equal bit for bit.
float VecDotReference(GgmlType weight_type, const void* weight_row,
                      const void* activations, int64_t n);

float VecDot(GgmlType weight_type, const void* weight_row,
             const void* activations, int64_t n);

// For r in [row_begin, row_end) and t in [0, n_tokens):
//   out[t * out_stride + r] = VecDot(weight_type, row r of W, activation t, n)
// bit for bit. W is row-major, each row GgmlTypeBytes(weight_type, n) bytes;
// `activations` holds n_tokens rows of ActivationRowBytes(VecDotType, n)
// bytes, contiguous. Nothing else in `out` is written.
// Rows are processed in small tiles, each tile against every token, so each
// weight row is read from memory once per call however many tokens there
// are (what makes batched decode and prefill cheap).
// An unsupported weight type writes NaN to the outputs.
void MatMulRows(GgmlType weight_type, const void* weights, int64_t n,
                int64_t row_begin, int64_t row_end, const void* activations,
                int n_tokens, float* out, int64_t out_stride);

// How a PackedMatrix's products add up, per (row, token):
//   kGgml       ggml's x86 order (above): eight float lanes per row, bit for
//               bit MatMulRows and llama.cpp. The default, and what the
//               reference tests hold.
//   kBlockSums  for each 32-element block in order, the block's exact
//               integer sum of products s, then
//                 acc = fma(d_w * d_x, float(s), acc)
//               and for Q4_1 mins = fma(m_w, s_x, mins); out = acc + mins
//               (VecDotBlockSumsReference). The same integers with one float
//               rounding per block where ggml's order has eight lanes: a
//               product differs from llama.cpp's in its last bits, so greedy
//               tokens may part from llama.cpp's after enough of them. Still
//               one result per (row, token), whatever the batch, the tokens
//               beside it or the threads. It costs one conversion and one
//               multiply-add per block and 16 rows instead of eight, which
//               is most of a compute-bound product's instructions (prefill,
//               batched decode); decode, bound by memory, runs as fast
//               either way.
enum class PackedArithmetic { kGgml, kBlockSums };

// "ggml" or "block_sums" (the --matmul_arithmetic flags' values) and back;
// INVALID_ARGUMENT naming both for anything else.
absl::StatusOr<PackedArithmetic> ParsePackedArithmetic(absl::string_view name);
const char* PackedArithmeticName(PackedArithmetic arithmetic);

// VecDot in PackedArithmetic::kBlockSums, by the portable scalar kernel: the
// reference the packed kernels must equal bit for bit. Q4_0, Q4_1 and Q8_0
// (the packed types); NaN for any other.
float VecDotBlockSumsReference(GgmlType weight_type, const void* weight_row,
                               const void* activations, int64_t n);

// A weight matrix repacked at load, where this CPU has kernels for the
// packed form (AVX-512 VNNI; Q4_0, Q4_1 and Q8_0 today): rows in groups of
// 16, each group's block headers and quants laid out as 16-lane vectors
// (kernels/matmul_avx512.h), the size of the original (Q8_0: 6% more).
// In PackedArithmetic::kGgml, MatMul's results equal MatMulRows' bit for
// bit (in kBlockSums, VecDotBlockSumsReference's); it just needs no
// shuffles: decode streams the weights at close to memory speed, and
// prefill and batched decode spend their instructions on the products (each
// block is unpacked once per two tokens, then one broadcast vpdpbusd,
// convert and multiply-add per ggml lane covers 16 rows).
//
// Ownership: Pack's matrix owns its copy of the weights; PackInto's lives
// in storage the caller owns. Thread-safety: immutable after packing;
// concurrent MatMul calls on disjoint row ranges are safe.
class PackedMatrix {
 public:
  // Packed copies start on this boundary (a cache line): a Q4_1 group-block
  // is five lines, and off the boundary every 64-byte load of it would
  // straddle two.
  static constexpr int64_t kStorageAlignment = 64;

  // Empty when there is no packed kernel for this type on this CPU, for
  // rows of more than 16384 elements, or when the copy's memory cannot be
  // had (the caller then multiplies the weights as the file has them).
  static std::unique_ptr<PackedMatrix> Pack(
      GgmlType weight_type, const void* weights, int64_t rows, int64_t n,
      PackedArithmetic arithmetic = PackedArithmetic::kGgml);

  // The storage the packed copy takes, rounded up to a multiple of
  // kStorageAlignment (so that copies laid out back to back each start on
  // the boundary); 0 where Pack would return empty.
  static int64_t StorageBytes(GgmlType weight_type, int64_t rows, int64_t n);

  // Pack into `storage`: StorageBytes(weight_type, rows, n) bytes on a
  // kStorageAlignment boundary, which the caller keeps alive as long as the
  // matrix. Lets a model lay all its matrices out in one buffer, in the
  // order a forward pass streams them, on huge pages
  // (common/huge_page_buffer.h). Empty as Pack; storage untouched then.
  static std::unique_ptr<PackedMatrix> PackInto(GgmlType weight_type,
                                                const void* weights,
                                                int64_t rows, int64_t n,
                                                PackedArithmetic arithmetic,
                                                uint8_t* storage);

  // Row ranges given to MatMul start at a multiple of this.
  static constexpr int64_t kRowGrain = 16;

  // MatMulRows' contract (out[t * out_stride + r] = VecDot(weight_type,
  // row r, activation t, n) for r in [row_begin, row_end), t < n_tokens;
  // in kBlockSums VecDotBlockSumsReference) on the packed rows, row_begin a
  // multiple of kRowGrain. One token streams the rows (decode's
  // matrix-vector product); more take two at a time (eight in kBlockSums;
  // up to 64 tokens over each 16-row group in turn, more over chunks).
  void MatMul(int64_t row_begin, int64_t row_end, const void* activations,
              int n_tokens, float* out, int64_t out_stride) const;

  int64_t rows() const { return rows_; }
  PackedArithmetic arithmetic() const { return arithmetic_; }

 private:
  PackedMatrix(GgmlType type, int64_t rows, int64_t n,
               PackedArithmetic arithmetic)
      : type_(type), rows_(rows), n_(n), arithmetic_(arithmetic) {}

  struct FreeBytes {
    void operator()(uint8_t* p) const;
  };

  GgmlType type_;
  int64_t rows_;
  int64_t n_;
  PackedArithmetic arithmetic_;
  const uint8_t* bytes_ = nullptr;
  std::unique_ptr<uint8_t, FreeBytes> owned_;  // Pack's storage
};

// MatMulRows as CPUs without AVX-512 VNNI run it (VecDot pair by pair, in
// row tiles), whatever this CPU has: lets tests check that path here too.
void MatMulRowsByVecDot(GgmlType weight_type, const void* weights, int64_t n,
                        int64_t row_begin, int64_t row_end,
                        const void* activations, int n_tokens, float* out,
                        int64_t out_stride);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_MATMUL_H_
