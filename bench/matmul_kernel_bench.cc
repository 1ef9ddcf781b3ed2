// matmul_kernel_bench: the quantized matrix kernels (kernels/matmul.h) on
// one core, on the default model's matrix shapes, against the portable
// scalar kernel in the same run.
//
//   bazel run --config=opt //bench:matmul_kernel_bench --
//       [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]
//
// Each case is a weight type, a shape (rows x columns) and a token count:
//   tokens 1      decode's matrix-vector product (bandwidth-bound when the
//                 matrix is not in cache: 49152 x 576 is the output head);
//   tokens 2..128 prefill and batched decode (compute-bound while the
//                 matrix stays in cache and every pass of tokens goes over
//                 it; the 42 MB cases stream it from memory in the first
//                 pass, as a decode step of a model past the caches does).
// "PackedMatMul" cases run the kernels on weights repacked at load (one
// token: decode's; more: passes of two tokens per unpacked block in ggml's
// order, up to eight in block sums).
// Counters: weight bytes read per second (GB/s) and integer multiply-adds
// per second (GMAC/s). "Scalar" cases run VecDotReference row by row, the
// reference every SIMD kernel equals bit for bit. "BlockSumsCeiling" and
// "GgmlCeiling" cases run the packed kernels' instruction mix in each
// arithmetic on registers alone (bench/pipe_ceiling.h): the most GMAC/s
// this core gives that arithmetic, to set the kernels against.
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "bench/pipe_ceiling.h"
#include "benchmark/benchmark.h"
#include "common/huge_page_buffer.h"
#include "kernels/ggml_type.h"
#include "kernels/matmul.h"

namespace pdserve::bench {
namespace {

using kernels::GgmlType;

struct Operands {
  std::vector<uint8_t> weights;
  std::vector<uint8_t> activations;
  std::vector<float> out;
  int64_t row_bytes = 0;
  int64_t act_bytes = 0;
};

// Random bytes are valid blocks for these formats as long as the f16 scales
// are finite: each block's scale bytes are set to small normal halves.
Operands Make(GgmlType type, int64_t rows, int64_t cols, int tokens) {
  Operands o;
  std::mt19937 rng(7);
  o.row_bytes = static_cast<int64_t>(*kernels::GgmlTypeBytes(type, cols));
  o.weights.resize(rows * o.row_bytes);
  for (uint8_t& b : o.weights) b = static_cast<uint8_t>(rng());
  const int64_t block_bytes = o.row_bytes / (cols / 32);
  const int scale_halves = type == GgmlType::kQ4_1 ? 2 : 1;
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    for (int h = 0; h < scale_halves; ++h) {
      o.weights[b * block_bytes + 2 * h] = static_cast<uint8_t>(rng());
      o.weights[b * block_bytes + 2 * h + 1] = 0x20;  // ~2^-7
    }
  }
  const GgmlType act = *kernels::VecDotType(type);
  o.act_bytes = kernels::ActivationRowBytes(act, cols);
  o.activations.resize(o.act_bytes * tokens);
  std::normal_distribution<float> normal;
  std::vector<float> x(cols);
  for (int t = 0; t < tokens; ++t) {
    for (float& v : x) v = normal(rng);
    kernels::QuantizeActivations(act, x.data(), cols,
                                 o.activations.data() + t * o.act_bytes);
  }
  o.out.resize(rows * tokens);
  return o;
}

void SetCounters(benchmark::State& state, int64_t rows, int64_t cols,
                 int tokens, int64_t row_bytes) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(iters * rows * row_bytes / 1e9,
                                              benchmark::Counter::kIsRate);
  state.counters["GMAC/s"] = benchmark::Counter(
      iters * rows * cols * tokens / 1e9, benchmark::Counter::kIsRate);
}

void BM_MatMulRows(benchmark::State& state, GgmlType type) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const int tokens = static_cast<int>(state.range(2));
  Operands o = Make(type, rows, cols, tokens);
  for (auto _ : state) {
    kernels::MatMulRows(type, o.weights.data(), cols, 0, rows,
                        o.activations.data(), tokens, o.out.data(), rows);
    benchmark::DoNotOptimize(o.out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, rows, cols, tokens, o.row_bytes);
}

void BM_Scalar(benchmark::State& state, GgmlType type) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const int tokens = static_cast<int>(state.range(2));
  Operands o = Make(type, rows, cols, tokens);
  for (auto _ : state) {
    for (int t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        o.out[t * rows + r] = kernels::VecDotReference(
            type, o.weights.data() + r * o.row_bytes,
            o.activations.data() + t * o.act_bytes, cols);
      }
    }
    benchmark::DoNotOptimize(o.out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, rows, cols, tokens, o.row_bytes);
}

// Tokens against the weights repacked at load (kernels::PackedMatrix): one
// token is decode's matrix-vector product, more are prefill and batched
// decode. The packed copy lies on huge pages from a cache-line boundary, as
// the engine's do (engine::CpuBackend). Packed into a std::vector (16-byte
// aligned, 4 KiB pages), the 42 MB cases ran 14-27 % slower here, mostly
// from the alignment: the engine, streaming 94 MB a step, gains from both.
void BM_PackedMatMul(
    benchmark::State& state, GgmlType type,
    kernels::PackedArithmetic arithmetic = kernels::PackedArithmetic::kGgml) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const int tokens = static_cast<int>(state.range(2));
  Operands o = Make(type, rows, cols, tokens);
  absl::StatusOr<common::HugePageBuffer> storage =
      common::HugePageBuffer::Allocate(
          kernels::PackedMatrix::StorageBytes(type, rows, cols));
  if (!storage.ok()) {
    state.SkipWithError(std::string(storage.status().message()).c_str());
    return;
  }
  const std::unique_ptr<kernels::PackedMatrix> packed =
      kernels::PackedMatrix::PackInto(type, o.weights.data(), rows, cols,
                                      arithmetic, storage->data());
  if (packed == nullptr) {
    state.SkipWithError("no packed kernel on this CPU");
    return;
  }
  for (auto _ : state) {
    packed->MatMul(0, rows, o.activations.data(), tokens, o.out.data(), rows);
    benchmark::DoNotOptimize(o.out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, rows, cols, tokens, o.row_bytes);
}

// The machine's ceiling for the packed kernels, without memory
// (bench/pipe_ceiling.h): their instruction mix on registers alone, block
// sums' eight vpdpbusd per (token, block) with no float work ("vnni_only"),
// with the scale multiply, conversion and multiply-add (Q8_0) and the mins'
// multiply-add besides (Q4_1); and ggml's order's per-lane conversion and
// multiply-add. Counter: GMAC/s (integer multiply-adds, as the product cases
// count them).
template <PipeMix kMix>
void BM_PipeCeiling(benchmark::State& state) {
  if (!PipeCeilingSupported()) {
    state.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  constexpr int64_t kBlocks = 4096;
  float out[16];
  int64_t macs = 0;
  for (auto _ : state) {
    macs += RunPipeMix(kMix, kBlocks, out);
    benchmark::DoNotOptimize(out);
  }
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(macs) / 1e9,
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PipeCeiling<PipeMix::kVnniOnly>)
    ->Name("BM_BlockSumsCeiling/vnni_only");
BENCHMARK(BM_PipeCeiling<PipeMix::kBlockSums>)
    ->Name("BM_BlockSumsCeiling/q8_0");
BENCHMARK(BM_PipeCeiling<PipeMix::kBlockSumsWithMins>)
    ->Name("BM_BlockSumsCeiling/q4_1");
BENCHMARK(BM_PipeCeiling<PipeMix::kGgmlLanes>)->Name("BM_GgmlCeiling/q8_0");
BENCHMARK(BM_PipeCeiling<PipeMix::kGgmlLanesWithMins>)
    ->Name("BM_GgmlCeiling/q4_1");

// {rows, cols, tokens}: attention output / FFN up / FFN down of the default
// model, and its Q8_0 output head.
void Shapes(benchmark::internal::Benchmark* b) {
  for (int tokens : {1, 4, 8, 16, 32, 128}) {
    b->Args({576, 576, tokens});
    b->Args({1536, 576, tokens});
    b->Args({576, 1536, tokens});
  }
}

BENCHMARK_CAPTURE(BM_MatMulRows, q4_1, GgmlType::kQ4_1)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_PackedMatMul, q4_1, GgmlType::kQ4_1)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Scalar, q4_1, GgmlType::kQ4_1)
    ->Args({1536, 576, 1})
    ->Args({1536, 576, 4});
BENCHMARK_CAPTURE(BM_MatMulRows, q4_0, GgmlType::kQ4_0)
    ->Args({1536, 576, 1})
    ->Args({1536, 576, 32});
BENCHMARK_CAPTURE(BM_MatMulRows, q8_0, GgmlType::kQ8_0)
    ->Args({1536, 576, 1})
    ->Args({1536, 576, 32})
    ->Args({49152, 576, 1});
BENCHMARK_CAPTURE(BM_PackedMatMul, q8_0, GgmlType::kQ8_0)
    ->Args({1536, 576, 32});
BENCHMARK_CAPTURE(BM_Scalar, q8_0, GgmlType::kQ8_0)->Args({1536, 576, 1});
// 1536 x 576 stays in L2 (compute); 49152 x 576 (the output head) and
// 16 x 1536 x 576 stream from memory.
BENCHMARK_CAPTURE(BM_PackedMatMul, q4_1_decode, GgmlType::kQ4_1)
    ->Args({1536, 576, 1})
    ->Args({24576, 576, 1});
BENCHMARK_CAPTURE(BM_PackedMatMul, q8_0_decode, GgmlType::kQ8_0)
    ->Args({1536, 576, 1})
    ->Args({49152, 576, 1});
// Small batches on packed weights (batched decode and speculative
// verification passes of 2..9 tokens): how the cost of a product grows with
// its tokens, in cache (1536 x 576) and streaming from memory (the output
// head, 49152 x 576 Q8_0; 24576 x 576 Q4_1, 16 FFN matrices' worth).
void SmallBatches(benchmark::internal::Benchmark* b) {
  for (int64_t rows : {1536, 24576}) {
    for (int tokens : {1, 2, 3, 4, 5, 8, 9, 16}) b->Args({rows, 576, tokens});
  }
}
BENCHMARK_CAPTURE(BM_PackedMatMul, q4_1_small_batch, GgmlType::kQ4_1)
    ->Apply(SmallBatches);
// The same products in block sums (kernels::PackedArithmetic::kBlockSums):
// how much of a compute-bound product ggml's order costs.
void ArithmeticShapes(benchmark::internal::Benchmark* b) {
  for (int tokens : {1, 8, 16, 32, 128}) b->Args({1536, 576, tokens});
  b->Args({24576, 576, 1});
  b->Args({24576, 576, 8});
  // Llama-3.2-1B's FFN up and down at batched decode's 32 tokens: rows of
  // 2048 and 8192 elements (a 16-row group of 8192 is larger than L1).
  b->Args({8192, 2048, 32});
  b->Args({2048, 8192, 32});
  // Decode of those shapes, streaming 42 MB (past the last-level cache),
  // and batched decode's first pass over it (groups streamed from memory,
  // each passed over by every token while it sits in L1).
  for (int tokens : {1, 2, 4, 8, 16}) b->Args({32768, 2048, tokens});
  b->Args({8192, 8192, 1});
}
BENCHMARK_CAPTURE(BM_PackedMatMul, q4_1_block_sums, GgmlType::kQ4_1,
                  kernels::PackedArithmetic::kBlockSums)
    ->Apply(ArithmeticShapes);
BENCHMARK_CAPTURE(BM_PackedMatMul, q8_0_block_sums, GgmlType::kQ8_0,
                  kernels::PackedArithmetic::kBlockSums)
    ->Apply(ArithmeticShapes);
BENCHMARK_CAPTURE(BM_PackedMatMul, q4_1_ggml, GgmlType::kQ4_1)
    ->Apply(ArithmeticShapes);
BENCHMARK_CAPTURE(BM_PackedMatMul, q8_0_ggml, GgmlType::kQ8_0)
    ->Apply(ArithmeticShapes);
BENCHMARK_CAPTURE(BM_PackedMatMul, q8_0_small_batch, GgmlType::kQ8_0)
    ->Args({49152, 576, 1})
    ->Args({49152, 576, 2})
    ->Args({49152, 576, 4})
    ->Args({49152, 576, 8});

}  // namespace
}  // namespace pdserve::bench

BENCHMARK_MAIN();
