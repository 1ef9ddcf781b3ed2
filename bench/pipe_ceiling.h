// pipe_ceiling: the most multiply-adds per second a core gives the packed
// matrix kernels' instruction mix, with the operands in registers or L1:
// no memory stream, no unpacking, no loop over rows. A compute-bound
// product cannot beat it, so the benchmarks set their figures against it:
// matmul_kernel_bench the kernels, engine_bench a model's products per
// token (ProductsCeiling), which bound batched decode (every token of a
// step takes every product; prefill takes the output head once per prompt,
// so a long prompt can pass it).
//
// The mixes are the kernels' multiply-pipe work per 32-element block of 16
// rows and one token (kernels/matmul_avx512.cc):
//   block sums: eight vpdpbusd, then the scale multiply, one conversion and
//     one multiply-add (PackedGroupBlockSums, eight tokens a pass), and for
//     Q4_1 the mins' multiply-add besides;
//   ggml's order: per ggml lane one vpdpbusd, one conversion and one
//     multiply-add, and the scale multiply (PackedGroupTokens, two tokens a
//     pass), and for Q4_1 the mins' multiply and add besides.
// On Zen 4 a 512-bit vpdpbusd takes both 256-bit multiply pipes, and so does
// every float multiply or multiply-add: in ggml's order a block's float work
// is as large as its integer work, which halves what batching can give.
//
// Needs AVX-512 VNNI (PipeCeilingSupported); on other CPUs the measures
// return 0.
#ifndef PDSERVE_BENCH_PIPE_CEILING_H_
#define PDSERVE_BENCH_PIPE_CEILING_H_

#include <cstdint>
#include <map>

#include "common/thread_pool.h"
#include "kernels/matmul.h"
#include "model/model_weights.h"

namespace pdserve::bench {

enum class PipeMix {
  kVnniOnly,           // the eight vpdpbusd of block sums alone
  kBlockSums,          // Q8_0 and Q4_0 in block sums
  kBlockSumsWithMins,  // Q4_1 in block sums
  kGgmlLanes,          // Q8_0 and Q4_0 in ggml's order
  kGgmlLanesWithMins,  // Q4_1 in ggml's order
};

// Whether this CPU runs the mixes (AVX-512 VNNI and BW).
bool PipeCeilingSupported();

// Runs `blocks` blocks of `mix` (every token of one pass over 16 rows) and
// returns the multiply-adds done. sink: 16 floats the results go to, so
// that the work is kept.
int64_t RunPipeMix(PipeMix mix, int64_t blocks, float* sink);

// GMAC/s of `mix` on the calling thread: the fastest of nine runs of about
// 20 ms (a ceiling: the host's interference only ever lowers a run, by up
// to a tenth on the VMs of bench/results, and a low ceiling would call a
// goal out of reach that is not). 0 without AVX-512 VNNI.
double PipeMixGmacs(PipeMix mix);

// The mix the packed kernels run for a matrix of `type` in `arithmetic`
// (packed or not: the unpacked kernels' ggml order has the same mix per
// pair); false for the formats without a VNNI kernel (K-quants, floats).
bool PackedKernelMix(kernels::GgmlType type,
                     kernels::PackedArithmetic arithmetic, PipeMix* mix);

// A model's matrix products per token (every layer's seven products and the
// output head) at the pipe ceiling of every thread of `pool` at once.
struct ProductsCeiling {
  double macs_per_token = 0;  // multiply-adds of one token's products
  // The same, by the mix the kernels run them in (formats without a mix
  // left out).
  std::map<PipeMix, double> macs_by_mix;
  double gmacs = 0;  // all threads together, weighted by the mixes' shares
  // 0 where a matrix's format has no mix or the CPU no AVX-512 VNNI.
  double tokens_per_s = 0;
};
ProductsCeiling MeasureProductsCeiling(const model::ModelWeights& weights,
                                       kernels::PackedArithmetic arithmetic,
                                       common::ThreadPool& pool);

}  // namespace pdserve::bench

#endif  // PDSERVE_BENCH_PIPE_CEILING_H_
