#include "engine/proto_conversion.h"

#include <string>

#include "model/unicode.h"

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
  return s;
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

namespace {

// Bytes of a token; its text is the bytes when they are valid UTF-8 (a
// piece may hold part of a character, which only raw_bytes can carry).
void SetTokenText(uint32_t id, const model::Tokenizer& tokenizer,
                  std::string* text, std::string* raw) {
  *raw = tokenizer.TokenToPiece(id, /*render_special=*/true).value_or("");
  if (model::IsValidUtf8(*raw)) *text = *raw;
}

}  // namespace

v1::TokenLogprob ToProto(const SampleResult& sample,
                         const model::Tokenizer& tokenizer) {
  v1::TokenLogprob out;
  out.set_token_id(sample.token_id);
  out.set_logprob(sample.logprob);
  SetTokenText(sample.token_id, tokenizer, out.mutable_text(),
               out.mutable_raw_bytes());
  for (const TokenLogprob& top : sample.top_logprobs) {
    v1::TopLogprob* t = out.add_top_logprobs();
    t->set_token_id(top.token_id);
    t->set_logprob(top.logprob);
    SetTokenText(top.token_id, tokenizer, t->mutable_text(),
                 t->mutable_raw_bytes());
  }
  return out;
}

v1::ModelInfo ModelInfoFor(const model::Model& model, const std::string& id,
                           const v1::KvLayout& layout) {
  v1::ModelInfo info;
  info.set_id(id);
  info.set_architecture(model.config().architecture);
  info.set_context_length(model.config().context_length);
  info.set_vocab_size(model.config().vocab_size);
  info.set_quantization(model.quantization());
  *info.mutable_kv_layout() = layout;
  info.set_owned_by("pdserve");
  return info;
}

std::vector<v1::PrefixCacheEvent> ToProto(
    const std::vector<PrefixCacheEvent>& events) {
  std::vector<v1::PrefixCacheEvent> out;
  out.reserve(events.size());
  for (const PrefixCacheEvent& e : events) {
    v1::PrefixCacheEvent p;
    switch (e.kind) {
      case PrefixCacheEvent::Kind::kStored:
        p.set_kind(v1::PrefixCacheEvent::KIND_STORED);
        p.add_block_hashes(e.key);
        break;
      case PrefixCacheEvent::Kind::kRemoved:
        p.set_kind(v1::PrefixCacheEvent::KIND_REMOVED);
        p.add_block_hashes(e.key);
        break;
      case PrefixCacheEvent::Kind::kCleared:
        p.set_kind(v1::PrefixCacheEvent::KIND_CLEARED);
        break;
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<int32_t> ToTokens(absl::Span<const uint32_t> ids) {
  return std::vector<int32_t>(ids.begin(), ids.end());
}

}  // namespace pdserve::engine
