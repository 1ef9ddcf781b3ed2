#include "engine/draft_model_drafter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::Create(
    const model::Model& draft_model, int32_t target_vocab_size,
    const ModelRunnerOptions& runner_options) {
  if (draft_model.config().vocab_size != target_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the draft model's vocabulary has ", draft_model.config().vocab_size,
        " tokens, the target's ", target_vocab_size,
        ": a draft model must share the target's tokenizer"));
  }
  ModelRunnerOptions options = runner_options;
  // Twins are rolled back after every verification; their blocks are
  // private scratch, not worth caching.
  options.enable_prefix_cache = false;
  PD_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                      ModelRunner::Create(draft_model, options));
  return std::unique_ptr<DraftModelDrafter>(
      new DraftModelDrafter(std::move(runner)));
}

bool DraftModelDrafter::Sync(const DraftJob& job, int32_t* pending) {
  *pending = 0;
  const SeqId id = job.id;
  if (runner_->HasSequence(id)) {
    const absl::Span<const int32_t> have = runner_->tokens(id);
    const bool prefix =
        have.size() <= job.tokens.size() &&
        std::equal(have.begin(), have.end(), job.tokens.begin());
    if (!prefix || runner_->num_draft(id) > 0) Release(id);
  }
  if (!runner_->HasSequence(id)) {
    if (!runner_->AddSequence(id, job.tokens, job.prompt_length).ok()) {
      return false;
    }
    twins_[id];
  } else {
    for (size_t i = runner_->tokens(id).size(); i < job.tokens.size(); ++i) {
      if (!runner_->AppendToken(id, job.tokens[i]).ok()) {
        Release(id);
        return false;
      }
    }
  }
  *pending = static_cast<int32_t>(runner_->tokens(id).size()) -
             runner_->num_computed(id);
  // Room for the pending tokens and the draft behind them (the last draft
  // token's KV is never needed).
  const int32_t total =
      runner_->num_computed(id) + *pending + job.max_tokens - 1;
  if (!runner_->blocks().Reserve(id, total).ok()) {
    Release(id);
    return false;
  }
  return *pending > 0;
}

absl::Status DraftModelDrafter::Choose(DraftJob& job,
                                       absl::Span<const float> logits) {
  Twin& twin = twins_[job.id];
  if (!twin.sampler.has_value()) {
    // The request's temperature and truncation, a stream of draws of its
    // own (see the file comment).
    SamplingParams q;
    q.temperature = job.sampling->temperature;
    q.top_k = job.sampling->top_k;
    q.top_p = job.sampling->top_p;
    q.min_p = job.sampling->min_p;
    q.seed = DerivedSeed(job.seed, 2);
    PD_ASSIGN_OR_RETURN(Sampler s,
                        Sampler::Create(q, runner_->vocab_size(), {}));
    twin.sampler.emplace(std::move(s));
  }
  const int64_t step = job.step + static_cast<int64_t>(job.draft.size());
  PD_ASSIGN_OR_RETURN(SampleResult drawn, twin.sampler->Sample(logits, step));
  std::vector<TokenProb> probs;  // empty for greedy: a deterministic draft
  if (job.sampling->temperature > 0.0f) {
    PD_ASSIGN_OR_RETURN(probs, twin.sampler->Distribution(logits));
  }
  job.draft.push_back(static_cast<int32_t>(drawn.token_id));
  job.probs.push_back(std::move(probs));
  return absl::OkStatus();
}

absl::Status DraftModelDrafter::Propose(absl::Span<DraftJob> jobs) {
  const int32_t vocab = runner_->vocab_size();
  // Pass 0: every twin catches up; its last logits give draft token 0.
  items_.clear();
  std::vector<DraftJob*> drafting;
  for (DraftJob& job : jobs) {
    job.draft.clear();
    job.probs.clear();
    int32_t pending = 0;
    if (job.max_tokens <= 0 || !Sync(job, &pending)) continue;
    items_.push_back({job.id, pending, LogitsMode::kLast});
    drafting.push_back(&job);
  }
  while (!items_.empty()) {
    PD_RETURN_IF_ERROR(runner_->Run(items_, &logits_));
    std::vector<DraftJob*> next;
    items_.clear();
    for (size_t i = 0; i < drafting.size(); ++i) {
      DraftJob& job = *drafting[i];
      PD_RETURN_IF_ERROR(
          Choose(job, absl::MakeConstSpan(logits_).subspan(i * vocab, vocab)));
      PD_RETURN_IF_ERROR(runner_->AppendDraft(
          job.id, absl::MakeConstSpan(&job.draft.back(), 1)));
      if (static_cast<int32_t>(job.draft.size()) < job.max_tokens) {
        items_.push_back({job.id, 1, LogitsMode::kLast});
        next.push_back(&job);
      }
    }
    drafting.swap(next);
  }
  return absl::OkStatus();
}

void DraftModelDrafter::Resolve(SeqId id, int32_t accepted) {
  if (!runner_->HasSequence(id) || runner_->num_draft(id) == 0) return;
  if (!runner_->ResolveDraft(id, accepted).ok()) Release(id);
}

void DraftModelDrafter::Release(SeqId id) {
  runner_->Release(id);
  twins_.erase(id);
}

}  // namespace pdserve::engine
