// attention_kernel_bench: the attention kernels (kernels/ggml_ops.h) on one
// core, for one query token of a prompt against its context: the default
// model's shape (head_dim 64, three query heads per KV head).
//
//   bazel run --config=opt //bench:attention_kernel_bench
//
// "Cache" cases read fp16 rows from the cache one query head at a time
// (DotF16Many, WeightedRowSumF16: decode's path); "Widened" cases read the
// context widened to fp32 once per layer, the three heads together
// (DotF16ManyTransposed, WeightedRowSumWidened: the prompt path). Both give
// the same bits. Argument: context length. Counter: (query head, key)
// pairs per second.
#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/ggml_ops.h"
#include "kernels/quant.h"

namespace pdserve::bench {
namespace {

using kernels::F16DotOrder;

constexpr int kHeadDim = 64;
constexpr int kGroup = 3;

struct Context {
  std::vector<uint16_t> keys, values;  // [n][d] fp16
  std::vector<const uint16_t*> key_rows, value_rows;
  std::vector<float> key_blocks, values_f;  // widened
  int64_t rows_per_slot = 0;
  std::vector<float> queries, probs;  // [kGroup][d], [kGroup][n]
  std::vector<uint16_t> query16;
};

Context Make(int64_t n) {
  Context c;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  c.keys.resize(n * kHeadDim);
  c.values.resize(n * kHeadDim);
  for (auto& h : c.keys) h = kernels::Fp32ToFp16(normal(rng));
  for (auto& h : c.values) h = kernels::Fp32ToFp16(normal(rng));
  c.rows_per_slot = (n + 15) / 16;
  c.key_blocks.resize(c.rows_per_slot * 16 * kHeadDim);
  c.values_f.resize(c.rows_per_slot * 16 * kHeadDim);
  for (int64_t j = 0; j < n; ++j) {
    c.key_rows.push_back(c.keys.data() + j * kHeadDim);
    c.value_rows.push_back(c.values.data() + j * kHeadDim);
    for (int e = 0; e < kHeadDim; ++e) {
      c.key_blocks[j / 16 * 16 * kHeadDim + e * 16 + j % 16] =
          kernels::Fp16ToFp32(c.keys[j * kHeadDim + e]);
      c.values_f[((j % 16) * c.rows_per_slot + j / 16) * kHeadDim + e] =
          kernels::Fp16ToFp32(c.values[j * kHeadDim + e]);
    }
  }
  c.queries.resize(kGroup * kHeadDim);
  c.query16.resize(kHeadDim);
  for (float& q : c.queries) {
    q = kernels::Fp16ToFp32(kernels::Fp32ToFp16(normal(rng)));
  }
  c.probs.assign(kGroup * n, 1.0f / static_cast<float>(n));
  return c;
}

void SetPairs(benchmark::State& state, int64_t n) {
  state.counters["pairs/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kGroup * n,
                         benchmark::Counter::kIsRate);
}

// Second argument: 1 for vec_dot's order (decode), 0 for tinyBLAS's.
F16DotOrder OrderArg(const benchmark::State& state) {
  return state.range(1) != 0 ? F16DotOrder::kVecDot : F16DotOrder::kTinyBlas;
}

void BM_ScoresCache(benchmark::State& state) {
  const int64_t n = state.range(0);
  Context c = Make(n);
  std::vector<float> out(n);
  for (auto _ : state) {
    for (int h = 0; h < kGroup; ++h) {
      kernels::Fp32ToFp16Row(c.queries.data() + h * kHeadDim, kHeadDim,
                             c.query16.data());
      kernels::DotF16Many(OrderArg(state), kHeadDim, c.key_rows.data(), n,
                          c.query16.data(), 0.125f, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  SetPairs(state, n);
}

// Decode's path: the three query heads of a KV head at once.
void BM_ScoresCacheHeads(benchmark::State& state) {
  const int64_t n = state.range(0);
  Context c = Make(n);
  std::vector<float> out(kGroup * n);
  std::vector<uint16_t> q16(kGroup * kHeadDim);
  for (auto _ : state) {
    kernels::Fp32ToFp16Row(c.queries.data(), kGroup * kHeadDim, q16.data());
    kernels::DotF16ManyHeads(OrderArg(state), kHeadDim, c.key_rows.data(), n,
                             kGroup, q16.data(), kHeadDim, 0.125f, out.data(),
                             n);
    benchmark::DoNotOptimize(out.data());
  }
  SetPairs(state, n);
}

void BM_ScoresWidened(benchmark::State& state) {
  const int64_t n = state.range(0);
  Context c = Make(n);
  std::vector<float> out(kGroup * n);
  for (auto _ : state) {
    kernels::DotF16ManyTransposed(
        F16DotOrder::kTinyBlas, kHeadDim, c.key_blocks.data(), n, kGroup,
        c.queries.data(), kHeadDim, 0.125f, out.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  SetPairs(state, n);
}

void BM_ValuesCache(benchmark::State& state) {
  const int64_t n = state.range(0);
  Context c = Make(n);
  std::vector<float> out(kHeadDim);
  for (auto _ : state) {
    for (int h = 0; h < kGroup; ++h) {
      kernels::WeightedRowSumF16(OrderArg(state), n, c.probs.data() + h * n,
                                 c.value_rows.data(), kHeadDim, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  SetPairs(state, n);
}

void BM_ValuesCacheHeads(benchmark::State& state) {
  const int64_t n = state.range(0);
  Context c = Make(n);
  std::vector<float> out(kGroup * kHeadDim);
  for (auto _ : state) {
    kernels::WeightedRowSumF16Heads(OrderArg(state), n, kGroup, c.probs.data(),
                                    n, c.value_rows.data(), kHeadDim,
                                    out.data(), kHeadDim);
    benchmark::DoNotOptimize(out.data());
  }
  SetPairs(state, n);
}

void BM_ValuesWidened(benchmark::State& state) {
  const int64_t n = state.range(0);
  Context c = Make(n);
  std::vector<float> out(kGroup * kHeadDim);
  for (auto _ : state) {
    kernels::WeightedRowSumWidened(
        F16DotOrder::kTinyBlas, n, kGroup, c.probs.data(), n, c.values_f.data(),
        c.rows_per_slot, kHeadDim, out.data(), kHeadDim);
    benchmark::DoNotOptimize(out.data());
  }
  SetPairs(state, n);
}

BENCHMARK(BM_ScoresCache)->ArgsProduct({{16, 32, 48, 128, 512, 2048}, {0, 1}});
BENCHMARK(BM_ScoresCacheHeads)
    ->ArgsProduct({{16, 32, 48, 128, 512, 2048}, {0, 1}});
BENCHMARK(BM_ScoresWidened)->Arg(128)->Arg(512)->Arg(2048);
BENCHMARK(BM_ValuesCache)->ArgsProduct({{16, 32, 48, 128, 512, 2048}, {0, 1}});
BENCHMARK(BM_ValuesCacheHeads)
    ->ArgsProduct({{16, 32, 48, 128, 512, 2048}, {0, 1}});
BENCHMARK(BM_ValuesWidened)->Arg(128)->Arg(512)->Arg(2048);

}  // namespace
}  // namespace pdserve::bench

BENCHMARK_MAIN();
