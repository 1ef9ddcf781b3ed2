// Helpers for the multi-process tests in tests/: where the server binaries
// are, a scratch folder per test, a tiny model written once per test
// process, and worker flags that keep several workers within two cores.
#ifndef PDSERVE_TESTS_CLUSTER_TESTING_H_
#define PDSERVE_TESTS_CLUSTER_TESTING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "metrics/text_parse.h"

namespace pdserve::testing {

// Bazel's runfiles root of this workspace (the server binaries live under
// it in bazel-bin layout).
std::string BinDir();

// A fresh folder under the test's temporary directory.
std::string MakeWorkDir(const std::string& name);

// A tiny random-weight llama model (model/tiny_model.h), written on first
// use: fast to load and run, for tests about serving rather than numerics.
std::string TinyModelPath();

// A random model (6 layers, 512 wide) whose requests take long enough to
// be caught mid-way or to queue measurably (a few ms per decode step),
// written once per process.
std::string SlowTinyModelPath();

// A random model of about 90 M parameters (8 layers, 1024 wide, context
// 4096) whose generation to the end of its context takes seconds even on a
// CPU twice as fast as today's: for tests whose deadline or cancel must fall
// well inside one request. Written once per process (a second or two).
std::string HeavyTinyModelPath();

// The default model's path (model::FindDefaultModel: $PDSERVE_DEFAULT_MODEL
// or where scripts/setup.sh puts it), or "" when there is none; a test then
// skips with model::kNoDefaultModel.
std::string DefaultModelPathOrEmpty();

// Flags for every worker of a test cluster: one forward-pass thread and a
// small KV cache.
std::vector<std::string> SmallWorkerArgs();

// Scrapes GET /metrics at `address` and sums the samples of `family` (a
// counter or gauge) whose labels include every pair in `labels`.
// UNAVAILABLE when the process cannot be scraped, NOT_FOUND when no sample
// matches.
absl::StatusOr<double> ScrapeSum(const std::string& address,
                                 const std::string& family,
                                 const metrics::Labels& labels = {});

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_CLUSTER_TESTING_H_
