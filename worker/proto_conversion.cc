#include "worker/proto_conversion.h"

#include <string>

#include "model/unicode.h"

namespace pdserve::worker {

v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kNone:
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

v1::TokenLogprob ToProto(const engine::SampleResult& sample,
                         const model::Tokenizer& tokenizer) {
  v1::TokenLogprob out;
  out.set_token_id(sample.token_id);
  out.set_logprob(sample.logprob);
  SetTokenText(sample.token_id, tokenizer, out.mutable_text(),
               out.mutable_raw_bytes());
  for (const engine::TokenLogprob& top : sample.top_logprobs) {
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
    const std::vector<engine::PrefixCacheEvent>& events) {
  std::vector<v1::PrefixCacheEvent> out;
  out.reserve(events.size());
  for (const engine::PrefixCacheEvent& e : events) {
    v1::PrefixCacheEvent p;
    switch (e.kind) {
      case engine::PrefixCacheEvent::Kind::kStored:
        p.set_kind(v1::PrefixCacheEvent::KIND_STORED);
        p.add_block_hashes(e.key);
        break;
      case engine::PrefixCacheEvent::Kind::kRemoved:
        p.set_kind(v1::PrefixCacheEvent::KIND_REMOVED);
        p.add_block_hashes(e.key);
        break;
      case engine::PrefixCacheEvent::Kind::kCleared:
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

}  // namespace pdserve::worker
