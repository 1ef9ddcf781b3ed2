// Helpers shared by the sampler's tests (sampler_test.cc,
// sampler_logits_test.cc): building a sampler that must be valid, drawing a
// token, the tests' own softmax, and reproducible random logits. Failures
// are reported through GoogleTest, so only tests may use this.
#ifndef PDSERVE_ENGINE_SAMPLER_TEST_UTIL_H_
#define PDSERVE_ENGINE_SAMPLER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"

namespace pdserve::engine::sampler_testing {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline Sampler MakeSampler(const SamplingParams& params, int32_t vocab_size,
                           std::vector<uint32_t> prompt = {},
                           std::vector<uint32_t> generated = {}) {
  absl::StatusOr<Sampler> s =
      Sampler::Create(params, vocab_size, prompt, generated);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

inline uint32_t SampleToken(Sampler& s, const std::vector<float>& logits,
                            int64_t step) {
  absl::StatusOr<SampleResult> r = s.Sample(logits, step);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->token_id : ~0u;
}

// The test's own softmax of `l / t` in double.
inline std::vector<double> Softmax(const std::vector<double>& l,
                                   double t = 1.0) {
  double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / t);
  for (double& x : p) x /= z;
  return p;
}

// `steps` rows of `vocab` standard-normal logits, the same for one `seed`.
inline std::vector<std::vector<float>> RandomLogits(int steps, int vocab,
                                                    uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<std::vector<float>> rows(steps, std::vector<float>(vocab));
  for (auto& row : rows) {
    for (float& x : row) x = normal(gen);
  }
  return rows;
}

}  // namespace pdserve::engine::sampler_testing

#endif  // PDSERVE_ENGINE_SAMPLER_TEST_UTIL_H_
