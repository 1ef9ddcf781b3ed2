// Bit-exact scalar reproductions of the float kernels llama.cpp's CPU backend
// (ggml-cpu, as built for x86-64 with AVX-512 by llama-cpp-python 0.3.36)
// runs around attention and the feed-forward activation, so that pdserve's
// CPU forward pass can produce the very same floats, not merely close ones.
//
// Each function emulates one ggml routine lane by lane: 16-lane vectors
// become arrays, _mm512_fmadd_ps becomes std::fma, and horizontal sums follow
// GCC's _mm512_reduce_add_ps tree (upper half plus lower half, down to one
// lane). They were checked bit for bit against the exported functions of
// libggml-cpu.so (tools/check_ggml_ops.py):
//  - DotF16Ggml:       ggml_vec_dot_f16 (four 16-lane FMA accumulators over
//                      chunks of 64, leftovers summed in double). llama.cpp
//                      uses it for f16 matrix products with one activation
//                      column, i.e. attention while decoding one token.
//  - DotF16TinyBlas:   llamafile's tinyBLAS f16 kernel (one 16-lane FMA
//                      accumulator, then the reduce), which llama.cpp uses
//                      for f16 products with two or more columns (prompts).
//  - ExpGgml:          one lane of ggml_v_expf.
//  - SoftMaxGgml:      ggml_vec_soft_max_f32.
//  - SwiGluGgml:       ggml_vec_swiglu_f32 (SiluGgml is one vector lane).
//  - RopeRotateGgml:   the rotation in ggml's rope, as GCC contracts it.
//
// Ownership: functions borrow their buffers for the call. Thread-safety:
// stateless apart from per-thread scratch; concurrent calls are safe.
#ifndef PDSERVE_KERNELS_GGML_OPS_H_
#define PDSERVE_KERNELS_GGML_OPS_H_

#include <cmath>
#include <cstdint>

namespace pdserve::kernels {

// The summation order of an f16 dot product.
enum class F16DotOrder {
  kVecDot,    // ggml_vec_dot_f16
  kTinyBlas,  // llamafile_sgemm's tinyBLAS<16, __m512, ...>
};

// Sum of x[i] * y[i] over n fp16 elements, as ggml_vec_dot_f16 returns it.
float DotF16Ggml(int64_t n, const uint16_t* x, const uint16_t* y);

// The same sum as tinyBLAS computes it; tinyBLAS only takes n % 16 == 0, and
// so does this (other n are summed as if zero-padded to a multiple of 16).
float DotF16TinyBlas(int64_t n, const uint16_t* x, const uint16_t* y);

float DotF16(F16DotOrder order, int64_t n, const uint16_t* x,
             const uint16_t* y);

// out[j] = DotF16(order, n, rows[j], y) * scale for j < count: the
// attention scores of one query against `count` cached keys, with the CPU
// check and dispatch done once.
void DotF16Many(F16DotOrder order, int64_t n, const uint16_t* const* rows,
                int64_t count, const uint16_t* y, float scale, float* out);

// out[i] = sum over j < n of p[j] * rows[j][i], for i < d: the product of
// fp16 probabilities with a transposed fp16 V, as llama.cpp computes it for
// one output row. p holds fp16 values widened to float. The sum runs as if
// the length were padded with zeros up to a multiple of 64 (kVecDot) or 16
// (kTinyBlas), as llama.cpp pads its KV window (to 256 cells), so no element
// takes ggml_vec_dot_f16's leftover path.
void WeightedRowSumF16(F16DotOrder order, int64_t n, const float* p,
                       const uint16_t* const* rows, int d, float* out);

// The two above for the nq query heads of one KV head at once (decode
// attention): queries q + h * q_stride (fp16, d elements) into scores
// out + h * out_stride, and probability rows p + h * p_stride into
// out + h * out_stride; each cached row is read once for all the heads.
// Every float is the one the single-head call gives, bit for bit.
void DotF16ManyHeads(F16DotOrder order, int d, const uint16_t* const* rows,
                     int64_t count, int nq, const uint16_t* q, int64_t q_stride,
                     float scale, float* out, int64_t out_stride);
void WeightedRowSumF16Heads(F16DotOrder order, int64_t n, int nq,
                            const float* p, int64_t p_stride,
                            const uint16_t* const* rows, int d, float* out,
                            int64_t out_stride);

// Attention over a context shared by many queries (a prompt's tokens and
// the query heads of a KV head), on K and V widened to fp32 once per layer
// instead of once per query: the same floats as DotF16Many and
// WeightedRowSumF16 on the fp16 rows they were widened from, bit for bit.
//
// Layouts, with 16 = the AVX-512 float lanes (KeyBlockIndex, SlotMajorRow):
//  - key blocks: keys in blocks of 16, each block [d][16], so that 16 keys'
//    sums fill one register and a block is read front to back; the last
//    block is padded (its extra keys are read and their scores dropped:
//    keep them finite, ideally zero);
//  - slot-major values: rows_per_slot >= ceil(n / 16) rows per slot, so
//    that the rows one tinyBLAS lane slot sums (every 16th) are contiguous.
// All values must be fp16 values widened.
inline int64_t KeyBlockIndex(int64_t j, int e, int d) {
  return j / 16 * 16 * d + e * 16 + j % 16;  // key j, element e
}
inline int64_t SlotMajorRow(int64_t j, int64_t rows_per_slot) {
  return j % 16 * rows_per_slot + j / 16;  // value row j (times d: offset)
}
//
// DotF16ManyTransposed: for each of nq queries h (q + h * q_stride, the
// fp16 query widened) and j < count, out[h * out_stride + j] =
// DotF16(order, d, key j, query h) * scale. Queries that share keys (the
// query heads of a KV head) are best passed together: each key vector is
// then loaded once for all of them.
void DotF16ManyTransposed(F16DotOrder order, int d, const float* key_blocks,
                          int64_t count, int nq, const float* q,
                          int64_t q_stride, float scale, float* out,
                          int64_t out_stride);

// WeightedRowSumF16 for nq probability rows (p + h * p_stride) over the same
// n slot-major value rows, into out + h * out_stride.
void WeightedRowSumWidened(F16DotOrder order, int64_t n, int nq, const float* p,
                           int64_t p_stride, const float* values,
                           int64_t rows_per_slot, int d, float* out,
                           int64_t out_stride);

// The largest of x[0..n) (-inf for n = 0), x free of NaNs: softmax's max.
float MaxScore(int64_t n, const float* x);

// x[i] = x[i] * scale rounded to fp16 (to nearest even) and widened back:
// softmax's normalization, with the rounding ggml applies when it converts
// the probabilities for the f16 product with V.
void ScaleToF16Precision(int64_t n, float scale, float* x);

// One lane of ggml_v_expf (AVX-512): a degree-5 polynomial on the reduced
// argument scaled by 2^n; 0 or +inf once |n| > 192.
float ExpGgml(float x);

// One lane of ggml_v_silu: x / (1 + ExpGgml(0 - x)).
float SiluGgml(float x);

// ggml_vec_soft_max_f32: y[i] = exp(x[i] - max) (ExpGgml over whole chunks
// of 16, expf for the rest); returns the sum, each chunk's lanes reduced in
// float then added in double.
double SoftMaxGgml(int64_t n, const float* x, float max, float* y);

// ggml_vec_swiglu_f32: out[i] = silu(g[i]) * u[i], the vector form over
// whole chunks of 16 and x / (1 + expf(-x)) for the rest.
void SwiGluGgml(int64_t n, const float* g, const float* u, float* out);

// The portable forms of the functions above, whatever the CPU: the
// reference that their AVX-512 forms (ggml's own vector code, picked at run
// time) must equal bit for bit.
float DotF16GgmlPortable(int64_t n, const uint16_t* x, const uint16_t* y);
float DotF16TinyBlasPortable(int64_t n, const uint16_t* x, const uint16_t* y);
double SoftMaxGgmlPortable(int64_t n, const float* x, float max, float* y);
void WeightedRowSumF16Portable(F16DotOrder order, int64_t n, const float* p,
                               const uint16_t* const* rows, int d, float* out);
void SwiGluGgmlPortable(int64_t n, const float* g, const float* u, float* out);
float MaxScorePortable(int64_t n, const float* x);
void ScaleToF16PrecisionPortable(int64_t n, float scale, float* x);
void DotF16ManyTransposedPortable(F16DotOrder order, int d,
                                  const float* key_blocks, int64_t count,
                                  int nq, const float* q, int64_t q_stride,
                                  float scale, float* out, int64_t out_stride);
void WeightedRowSumWidenedPortable(F16DotOrder order, int64_t n, int nq,
                                   const float* p, int64_t p_stride,
                                   const float* values, int64_t rows_per_slot,
                                   int d, float* out, int64_t out_stride);

// The rotation of one pair in ggml's rope: GCC fuses the first product of
// each expression into a fused multiply-add.
inline void RopeRotateGgml(float x0, float x1, float cos_theta, float sin_theta,
                           float* y0, float* y1) {
  *y0 = std::fma(x0, cos_theta, -(x1 * sin_theta));
  *y1 = std::fma(x0, sin_theta, x1 * cos_theta);
}

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_GGML_OPS_H_
