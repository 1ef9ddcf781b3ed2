// Conversions between the engine's request types and the wire types of
// proto/common.proto, shared by every service that runs the engine (prefill
// and decode workers) and by the router's validation, so the same request
// means the same thing everywhere.
//
// Thread-safety: stateless functions.
#ifndef PDSERVE_ENGINE_PROTO_CONVERSION_H_
#define PDSERVE_ENGINE_PROTO_CONVERSION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/kv_block_manager.h"
#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "proto/common.pb.h"
#include "proto/membership.pb.h"

namespace pdserve::engine {

// Unset optional fields take the engine defaults (temperature 1, top_p 1,
// repetition_penalty 1, no seed, no max_tokens). Does not validate; see
// ValidateSamplingParams.
SamplingParams FromProto(const v1::SamplingParams& params);

v1::FinishReason ToProto(FinishReason reason);

// A sampled token's logprob with its text, for the wire.
v1::TokenLogprob ToProto(const SampleResult& sample,
                         const model::Tokenizer& tokenizer);

// What a worker serving `model` under `id` registers: id, architecture,
// context, vocabulary, quantization and its KV layout.
v1::ModelInfo ModelInfoFor(const model::Model& model, const std::string& id,
                           const v1::KvLayout& layout);

// Prefix-cache events for the router's KV index, one block hash each.
std::vector<v1::PrefixCacheEvent> ToProto(
    const std::vector<PrefixCacheEvent>& events);

// Token ids from the wire, checked against the vocabulary elsewhere.
std::vector<int32_t> ToTokens(absl::Span<const uint32_t> ids);

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_PROTO_CONVERSION_H_
