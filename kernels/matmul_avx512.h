// AVX-512 VNNI matrix products for the weight formats the default model and
// the common llama.cpp quantizations use (Q4_0, Q4_1, Q8_0), internal to
// kernels/. MatMulRows (kernels/matmul.h) calls them when the CPU has the
// instructions; their results equal the portable kernels' bit for bit.
//
// This file is compiled on its own with -mavx512* (see kernels/BUILD): only
// ever call into it after CpuHasAvx512Vnni() said yes. It uses no standard
// library templates, so that no inline function built with AVX-512 can be
// picked by the linker for code that runs on other CPUs.
#ifndef PDSERVE_KERNELS_MATMUL_AVX512_H_
#define PDSERVE_KERNELS_MATMUL_AVX512_H_

#include <cstdint>

#include "kernels/ggml_type.h"

namespace pdserve::kernels::internal {

// MatMulRows (same contract, kernels/matmul.h) for Q4_0, Q4_1 and Q8_0
// weights with rows of at most kMaxAvx512Blocks blocks. Returns false, and
// writes nothing, for anything else.
inline constexpr int64_t kMaxAvx512Blocks = 512;
bool MatMulRowsAvx512(GgmlType weight_type, const uint8_t* weights, int64_t n,
                      int64_t row_begin, int64_t row_end,
                      const uint8_t* activations, int n_tokens, float* out,
                      int64_t out_stride);

// Matrix-vector products (one token) on Q4_0 / Q4_1 / Q8_0 weights
// repacked for them: rows in groups of kPackRows, and per group and
// 32-element block a run of 16-lane vectors (64 bytes each):
//   vector 0        the rows' block headers as 32-bit words: f16 d, then
//                   f16 m (Q4_1) or zero;
//   Q4_0 / Q4_1:    four vectors, vector i holding bytes 4i..4i+3 of each
//                   row's 16 quant bytes (elements 4i..4i+3 in the low
//                   nibbles, 16+4i..16+4i+3 in the high ones): 320 bytes,
//                   the size of 16 Q4_1 blocks;
//   Q8_0:           eight vectors, vector i holding quants 4i..4i+3 of each
//                   row: 576 bytes (16 blocks take 544).
// Groups follow each other (nb blocks per group); rows past the matrix's
// last are zero. The decode kernel needs no shuffles: one load per vector,
// and ggml's lane i of each row is lane i's (or i % 4's) word.
inline constexpr int kPackRows = 16;

// Bytes of the packed form; 0 for a type without one.
int64_t PackedBytes(GgmlType type, int64_t rows, int64_t cols);

// Writes the packed form of `rows` rows of `cols` elements to `out`
// (PackedBytes(...) bytes). False, writing nothing, for other types.
bool PackRows(GgmlType type, const uint8_t* weights, int64_t rows, int64_t cols,
              uint8_t* out);

// out[t * out_stride + r] for r in [row_begin, row_end) (row_begin a
// multiple of kPackRows; rows of at most kMaxAvx512Blocks blocks) and
// t < n_tokens: the packed matrix times n_tokens contiguous activation rows
// (Q8_1 for Q4_1, Q8_0 otherwise). With block_sums false, bit for bit
// MatMulRows' result (ggml's order). One token streams the groups
// (decode); more take two at a time (prefill and batched decode: the
// weights of a block are unpacked once for two tokens, which then take one
// broadcast vpdpbusd, convert and multiply-add per ggml lane and 16 rows).
// Up to 16 tokens (batched decode, verification passes) go group by group:
// the first pair streams each group from memory as decode does, the other
// pairs find it in L1; more (prefill) go in chunks of rows that stay in L2.
// With block_sums true, PackedArithmetic::kBlockSums (kernels/matmul.h):
// the same loops, four tokens at a time, each block's integer sum taking
// one convert and one multiply-add per 16 rows.
void MatMulPacked(GgmlType type, bool block_sums, const uint8_t* packed,
                  int64_t cols, int64_t row_begin, int64_t row_end,
                  const uint8_t* activations, int n_tokens, float* out,
                  int64_t out_stride);

// QuantizeActivations to Q8_0 (with_sum false) or Q8_1 (true), n a
// multiple of 32: the same bytes as the portable quantizer (amax by vector
// max, the same scalar scale arithmetic, round-half-even conversion).
void QuantizeQ8Avx512(bool with_sum, const float* x, int64_t n, uint8_t* out);

}  // namespace pdserve::kernels::internal

#endif  // PDSERVE_KERNELS_MATMUL_AVX512_H_
