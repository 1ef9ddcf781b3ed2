// Quantized-weight primitives: turning rows of ggml-typed weights (as stored
// in GGUF files) into floats, and dot products of such rows with float
// vectors, plus the scalar half-precision conversions they rest on.
//
// Supported types and their exact ggml block layouts (little-endian; every
// "f16" is an IEEE 754 binary16; blocks are packed, with no padding, and need
// no particular alignment in memory):
//   F32, F16, BF16   plain elements (block size 1).
//   Q8_0  32 elements, 34 bytes:  f16 d; int8 qs[32].          x = d*q
//   Q4_0  32 elements, 18 bytes:  f16 d; u8 qs[16].            x = d*(q-8)
//   Q4_1  32 elements, 20 bytes:  f16 d, m; u8 qs[16].         x = d*q + m
//     (Q4_*: the low nibble of qs[j] is element j, the high nibble element
//     j+16.)
//   Q5_0  32 elements, 22 bytes:  f16 d; u8 qh[4]; u8 qs[16].  x = d*(q-16)
//   Q5_1  32 elements, 24 bytes:  f16 d, m; u8 qh[4]; qs[16].  x = d*q + m
//     (Q5_*: nibbles as Q4_*; bit j of the little-endian uint32 qh is the
//     fifth bit (value 16) of element j.)
//   Q4_K  256 elements, 144 bytes: f16 d, dmin; u8 scales[12]; u8 qs[128].
//     Eight sub-blocks of 32 with 6-bit scale sc and min m packed in
//     `scales` (ggml's get_scale_min_k4); x = d*sc*q - dmin*m, where each
//     64-element chunk takes its 32 low nibbles then its 32 high nibbles from
//     32 bytes of qs.
//   Q5_K  256 elements, 176 bytes: f16 d, dmin; u8 scales[12]; u8 qh[32];
//     u8 qs[128]. As Q4_K, with the fifth bit of element 32*i+l (sub-block i)
//     in bit i of qh[l].
//   Q6_K  256 elements, 210 bytes: u8 ql[128]; u8 qh[64]; int8 scales[16];
//     f16 d. Sixteen sub-blocks of 16; x = d*scales[k]*(q-32), q 6 bits.
// Other ggml types give UNIMPLEMENTED naming the type.
//
// Ownership: functions borrow their buffers for the duration of the call and
// keep nothing. Thread-safety: stateless; concurrent calls are safe as long
// as no call writes a buffer another call reads or writes.
#ifndef PDSERVE_KERNELS_QUANT_H_
#define PDSERVE_KERNELS_QUANT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ggml_type.h"

namespace pdserve::kernels {

// IEEE binary16 -> binary32. Exact for every input: subnormals are
// normalized, +-inf stay infinite, NaNs stay NaN (payload kept, made quiet).
float Fp16ToFp32(uint16_t h);

// binary32 -> binary16, rounding to nearest, ties to even. Values beyond the
// half range become +-inf, tiny values become subnormals or +-0, NaN stays
// NaN (quiet).
uint16_t Fp32ToFp16(float f);

// The two conversions above over n values (F16C / AVX-512 where the CPU
// has them: the same results bit for bit).
void Fp32ToFp16Row(const float* x, int64_t n, uint16_t* out);
void Fp16ToFp32Row(const uint16_t* h, int64_t n, float* out);

// FP8 E4M3 (OCP; 4 exponent bits with bias 7, 3 mantissa bits, no
// infinities, NaN = S.1111.111; largest finite 448), the KV cache's 8-bit
// option. binary32 -> E4M3 rounds to nearest, ties to even, and saturates:
// magnitudes past 448 (infinities too) become +-448, as vLLM's fp8 KV cache
// does; NaN stays NaN. E4M3 -> binary16 is exact (every E4M3 value is a
// half).
uint8_t Fp32ToFp8E4M3(float f);
float Fp8E4M3ToFp32(uint8_t v);
void Fp32ToFp8E4M3Row(const float* x, int64_t n, uint8_t* out);
void Fp8E4M3ToFp16Row(const uint8_t* v, int64_t n, uint16_t* out);

// bfloat16 (the top 16 bits of a binary32) -> binary32; exact.
float Bf16ToFp32(uint16_t b);

// True when DequantizeRow / DotRow support `type`.
bool IsQuantTypeSupported(GgmlType type);

// Writes the `n` elements stored in `blocks` (n / block_size consecutive
// blocks of `type`) as floats to `out` (n floats).
// Errors: INVALID_ARGUMENT when n < 0 or n is not a multiple of the type's
// block size; UNIMPLEMENTED (naming the type) for unsupported types. Nothing
// is written on error. `blocks` and `out` may be null when n == 0 and must
// not overlap.
absl::Status DequantizeRow(GgmlType type, const void* blocks, int64_t n,
                           float* out);

// Dot product of the `n` elements stored in `blocks` (as for DequantizeRow)
// with the `n` floats of `x`. Works chunk by chunk: a chunk of at most 256
// elements (one K-quant super-block, eight 32-element blocks, or 256 plain
// elements) is decoded into a stack buffer and multiplied with the matching
// slice of x; the row is never dequantized as a whole.
// Precision: within a chunk, products are summed in float (eight partial
// sums, so the loop vectorizes, added in a fixed order); chunk sums are
// accumulated in double and the result is rounded to float once, at the end.
// The result is deterministic for given inputs.
// Errors as DequantizeRow; `x` may be null when n == 0.
absl::StatusOr<float> DotRow(GgmlType type, const void* blocks, const float* x,
                             int64_t n);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_QUANT_H_
