// Helpers for tests that send requests through a cluster and compare the
// answers with the offline engine (tests/serving_test.cc,
// tests/fault_test.cc).
#ifndef PDSERVE_TESTS_SERVING_TESTING_H_
#define PDSERVE_TESTS_SERVING_TESTING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/llm_engine.h"
#include "model/model.h"
#include "proto/client.pb.h"

namespace pdserve::testing {

// What a client saw of one request.
struct Outcome {
  absl::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
  v1::Timing timing;
  double client_ttft_ms = 0;
  // (token id, logprob, number of alternatives) per token, when asked.
  std::vector<std::tuple<uint32_t, float, int>> logprobs;
  // generated_offset always equalled the tokens received before.
  bool contiguous = true;
  int chunks = 0;
};

// Streams `request` from the router's client gRPC address. `on_chunk`, when
// given, sees each chunk as it arrives (from this thread).
Outcome Generate(const std::string& address, const v1::GenerateRequest& request,
                 absl::Duration timeout = absl::Seconds(180),
                 const std::function<void(const Outcome&)>& on_chunk = nullptr);

// The offline engine on the same model file: the reference for answers.
class OfflineEngine {
 public:
  // `kv_dtype`: the KV cache's, as the cluster's workers keep it.
  explicit OfflineEngine(const std::string& path,
                         v1::KvDtype kv_dtype = v1::KV_DTYPE_F16);
  Outcome Run(const v1::GenerateRequest& request);
  const model::Model& model() const { return *model_; }

 private:
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<engine::LlmEngine> engine_;
};

// Greedy requests with usage and timing asked for.
v1::GenerateRequest TextRequest(const std::string& text, uint32_t max_tokens);
// A pre-tokenized prompt of `length` ids derived from `salt`; ignores EOS.
v1::GenerateRequest TokenRequest(int length, int salt, uint32_t max_tokens,
                                 int32_t vocab);
// Turns a request into seeded sampling (temperature 0.9, top_p 0.95).
void Seed(v1::GenerateRequest* r, uint64_t seed);

// Same tokens, text, finish reason, logprobs and usage; contiguous offsets.
bool IsSameAnswer(const Outcome& cluster, const Outcome& offline);
// The same, as test expectations naming `what`.
void ExpectSameAnswer(const Outcome& cluster, const Outcome& offline,
                      const std::string& what);

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_SERVING_TESTING_H_
