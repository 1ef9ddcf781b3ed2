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

#include "model/gguf_types.h"

namespace pdserve::kernels::internal {

// MatMulRows (same contract, kernels/matmul.h) for Q4_0, Q4_1 and Q8_0
// weights with rows of at most kMaxAvx512Blocks blocks. Returns false, and
// writes nothing, for anything else.
inline constexpr int64_t kMaxAvx512Blocks = 512;
bool MatMulRowsAvx512(model::GgmlType weight_type, const uint8_t* weights,
                      int64_t n, int64_t row_begin, int64_t row_end,
                      const uint8_t* activations, int n_tokens, float* out,
                      int64_t out_stride);

}  // namespace pdserve::kernels::internal

#endif  // PDSERVE_KERNELS_MATMUL_AVX512_H_
