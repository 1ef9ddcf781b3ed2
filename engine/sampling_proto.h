// The wire's sampling parameters (proto/common.proto) as the engine's
// SamplingParams. One conversion for the router, which validates a
// request with it (ValidateSamplingParams) before any worker sees it, and
// for the workers that run the request, so the same request means the same
// thing on both sides. A library of its own: the router needs it without
// the engine's runner.
//
// Thread-safety: stateless functions.
#ifndef PDSERVE_ENGINE_SAMPLING_PROTO_H_
#define PDSERVE_ENGINE_SAMPLING_PROTO_H_

#include "engine/sampler.h"
#include "proto/common.pb.h"

namespace pdserve::engine {

// Unset optional fields take the engine defaults (temperature 1, top_p 1,
// repetition_penalty 1, no seed, no max_tokens). Does not validate; see
// ValidateSamplingParams.
SamplingParams FromProto(const v1::SamplingParams& params);

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_SAMPLING_PROTO_H_
