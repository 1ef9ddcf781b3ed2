#include "engine/sampling_proto.h"

namespace pdserve::engine {

SamplingParams FromProto(const v1::SamplingParams& p) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  s.min_p = p.min_p();
  if (p.has_repetition_penalty()) {
    s.repetition_penalty = p.repetition_penalty();
  }
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  if (p.has_seed()) s.seed = p.seed();
  if (p.has_max_tokens()) s.max_tokens = p.max_tokens();
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.logprobs = p.logprobs();
  s.top_logprobs = p.top_logprobs();
  s.logit_bias.insert(p.logit_bias().begin(), p.logit_bias().end());
  s.disable_speculation = p.disable_speculation();
  return s;
}

}  // namespace pdserve::engine
