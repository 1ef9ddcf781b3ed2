// Conversions between the engine's types and the wire types a worker
// answers and registers with (proto/common.proto, proto/membership.proto),
// shared by the prefill and decode workers. The request side (sampling
// parameters), which the router needs too, is engine/sampling_proto.h.
//
// Thread-safety: stateless functions.
#ifndef PDSERVE_WORKER_PROTO_CONVERSION_H_
#define PDSERVE_WORKER_PROTO_CONVERSION_H_

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

namespace pdserve::worker {

v1::FinishReason ToProto(engine::FinishReason reason);

// A sampled token's logprob with its text, for the wire.
v1::TokenLogprob ToProto(const engine::SampleResult& sample,
                         const model::Tokenizer& tokenizer);

// What a worker serving `model` under `id` registers: id, architecture,
// context, vocabulary, quantization and its KV layout.
v1::ModelInfo ModelInfoFor(const model::Model& model, const std::string& id,
                           const v1::KvLayout& layout);

// Prefix-cache events for the router's KV index, one block hash each.
std::vector<v1::PrefixCacheEvent> ToProto(
    const std::vector<engine::PrefixCacheEvent>& events);

// Token ids from the wire, checked against the vocabulary elsewhere.
std::vector<int32_t> ToTokens(absl::Span<const uint32_t> ids);

}  // namespace pdserve::worker

#endif  // PDSERVE_WORKER_PROTO_CONVERSION_H_
