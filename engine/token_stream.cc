#include "engine/token_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pdserve::engine {

TokenStream::TokenStream(const TokenStreamOptions& options, Sampler sampler,
                         int32_t prompt_length)
    : sampler_(std::move(sampler)),
      stop_tokens_(options.sampling, options.eos_ids, options.context_length),
      stop_(options.sampling.stop),
      // Generated text continues the prompt and renders control tokens as
      // nothing, as llama.cpp's streaming does.
      detok_(*options.tokenizer, /*remove_special=*/false,
             /*unparse_special=*/false, /*continues_text=*/true),
      prompt_length_(prompt_length) {}

absl::StatusOr<std::unique_ptr<TokenStream>> TokenStream::Create(
    const TokenStreamOptions& options, absl::Span<const int32_t> prompt,
    absl::Span<const int32_t> generated) {
  if (options.tokenizer == nullptr) {
    return absl::InvalidArgumentError("TokenStream needs a tokenizer");
  }
  std::vector<uint32_t> prompt_u(prompt.begin(), prompt.end());
  std::vector<uint32_t> generated_u;
  for (int32_t t : generated) {
    if (t < 0 || t >= options.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("generated token id ", t,
                       " is outside the vocabulary of ", options.vocab_size));
    }
    generated_u.push_back(static_cast<uint32_t>(t));
  }
  PD_ASSIGN_OR_RETURN(Sampler sampler,
                      Sampler::Create(options.sampling, options.vocab_size,
                                      prompt_u, generated_u));
  std::unique_ptr<TokenStream> stream(new TokenStream(
      options, std::move(sampler), static_cast<int32_t>(prompt.size())));
  // Replay: bring the text state to where it was after these tokens; their
  // text was released by whoever produced them. Tokens that had already
  // ended the request leave nothing to continue.
  for (int32_t t : generated) {
    stream->generated_.push_back(t);
    const uint64_t length = prompt.size() + stream->generated_.size();
    if (stream->stop_tokens_.Check(t, stream->generated_.size(), length) !=
            FinishReason::kNone ||
        (!stream->stop_tokens_.IsStopToken(t) && stream->FeedText(t).stopped)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the request already ended at generated token ",
          stream->generated_.size(), " of ", generated.size(),
          " (stop condition or max_tokens); nothing is left to generate"));
    }
  }
  return stream;
}

StopChecker::FeedResult TokenStream::FeedText(int32_t token) {
  return stop_.Feed(detok_.Add(token));
}

absl::StatusOr<StreamStep> TokenStream::Next(absl::Span<const float> logits) {
  PD_ASSIGN_OR_RETURN(
      SampleResult sampled,
      sampler_->Sample(logits, static_cast<int64_t>(generated_.size())));
  return Emit(std::move(sampled));
}

absl::StatusOr<StreamStep> TokenStream::NextVerifying(
    absl::Span<const float> logits, int32_t draft,
    absl::Span<const TokenProb> draft_probs, bool* accepted) {
  PD_ASSIGN_OR_RETURN(SampleResult sampled,
                      sampler_->SampleVerifying(
                          logits, static_cast<int64_t>(generated_.size()),
                          static_cast<uint32_t>(draft), draft_probs, accepted));
  return Emit(std::move(sampled));
}

absl::StatusOr<StreamStep> TokenStream::Emit(SampleResult sampled) {
  PD_RETURN_IF_ERROR(sampler_->Accept(sampled.token_id));
  StreamStep step;
  step.token = static_cast<int32_t>(sampled.token_id);
  generated_.push_back(step.token);

  const uint64_t length = prompt_length_ + generated_.size();
  FinishReason reason =
      stop_tokens_.Check(sampled.token_id, generated_.size(), length);
  if (reason == FinishReason::kStop) {
    for (uint32_t id : sampler_->params().stop_token_ids) {
      if (id == sampled.token_id) step.stop_token_id = id;
    }
  }
  if (!stop_tokens_.IsStopToken(sampled.token_id)) {
    StopChecker::FeedResult fed = FeedText(step.token);
    step.text = std::move(fed.text);
    if (fed.stopped) {
      reason = FinishReason::kStop;
      step.stop_string = stop_.matched_stop();
    }
  }
  if (reason != FinishReason::kNone && !stop_.stopped()) {
    // Release what was held back for possible stop strings or incomplete
    // characters.
    StopChecker::FeedResult fed = stop_.Feed(detok_.Finish());
    step.text += fed.text;
    if (fed.stopped) {
      step.stop_string = stop_.matched_stop();
      reason = FinishReason::kStop;
    } else {
      step.text += stop_.Flush();
    }
  }
  step.finish = reason;
  if (sampler_->params().logprobs) step.logprob = std::move(sampled);
  return step;
}

}  // namespace pdserve::engine
