#include "engine/llm_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/draft_model_drafter.h"

namespace pdserve::engine {

// runner_mu_ for a caller other than the stepping thread: counted in
// runner_waiters_ while it waits, so that Step yields to it.
class LlmEngine::RunnerCallerLock {
 public:
  explicit RunnerCallerLock(LlmEngine* engine)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(engine->runner_mu_)
      : engine_(engine) {
    engine_->runner_waiters_.fetch_add(1);
    engine_->runner_mu_.Lock();
    // Decremented under the lock: its release then re-evaluates Step's
    // condition.
    engine_->runner_waiters_.fetch_sub(1);
  }
  ~RunnerCallerLock() ABSL_UNLOCK_FUNCTION() { engine_->runner_mu_.Unlock(); }
  RunnerCallerLock(const RunnerCallerLock&) = delete;
  RunnerCallerLock& operator=(const RunnerCallerLock&) = delete;

 private:
  LlmEngine* engine_;
};

absl::StatusOr<std::unique_ptr<LlmEngine>> LlmEngine::Create(
    const model::Model& model, const EngineOptions& options) {
  if (options.max_running <= 0) {
    return absl::InvalidArgumentError("max_running must be positive");
  }
  std::unique_ptr<LlmEngine> e(new LlmEngine(model, options));
  PD_ASSIGN_OR_RETURN(e->runner_, ModelRunner::Create(model, options.runner));
  const SpeculativeOptions& spec = options.speculative;
  if (spec.method != SpeculativeOptions::Method::kNone &&
      spec.num_tokens <= 0) {
    return absl::InvalidArgumentError(
        "speculative decoding needs num_tokens > 0");
  }
  switch (spec.method) {
    case SpeculativeOptions::Method::kNone:
      break;
    case SpeculativeOptions::Method::kNgram:
      if (spec.ngram.min_ngram <= 0 ||
          spec.ngram.max_ngram < spec.ngram.min_ngram) {
        return absl::InvalidArgumentError(
            "n-gram drafting needs 0 < min_ngram <= max_ngram");
      }
      e->drafter_ = std::make_unique<NgramDrafter>(spec.ngram);
      break;
    case SpeculativeOptions::Method::kDraftModel: {
      if (spec.draft_model == nullptr) {
        return absl::InvalidArgumentError(
            "draft-model speculation needs a draft model");
      }
      ModelRunnerOptions draft_runner = options.runner;
      draft_runner.num_blocks = 0;
      draft_runner.kv_cache_bytes = spec.draft_kv_cache_bytes;
      // The draft model's KV stays private: peers write only the target's.
      draft_runner.kv_pool_allocator = nullptr;
      draft_runner.testing_pass_delay = absl::ZeroDuration();
      draft_runner.testing_token_delay = absl::ZeroDuration();
      PD_ASSIGN_OR_RETURN(
          e->drafter_,
          DraftModelDrafter::Create(*spec.draft_model, e->runner_->vocab_size(),
                                    draft_runner));
      break;
    }
  }
  if (e->drafter_) e->stats_.spec_method = std::string(e->drafter_->method());
  const model::Tokenizer& tok = model.tokenizer();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsEndOfGeneration(id)) e->eos_ids_.push_back(id);
  }
  return e;
}

absl::StatusOr<RequestId> LlmEngine::AddRequest(EngineRequest request) {
  const int32_t vocab = runner_->vocab_size();
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty");
  }
  const size_t length = request.prompt.size() + request.generated.size();
  if (static_cast<int64_t>(length) >= runner_->context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", length, " tokens; the model's context holds ",
        runner_->context_length(), " including at least one generated token"));
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token id ", t, " is outside the vocabulary of ", vocab));
    }
  }
  if (request.transferred.has_value() && request.generated.empty()) {
    return absl::InvalidArgumentError(
        "a transferred request needs the token its prefill sampled");
  }
  PD_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling, vocab));

  auto r = std::make_unique<Request>();
  TokenStreamOptions stream_options;
  stream_options.tokenizer = &model_.tokenizer();
  stream_options.sampling = request.sampling;
  stream_options.eos_ids = eos_ids_;
  stream_options.context_length = runner_->sequence_limit();
  stream_options.vocab_size = vocab;
  PD_ASSIGN_OR_RETURN(
      r->stream,
      TokenStream::Create(stream_options, request.prompt, request.generated));
  r->logprobs = request.sampling.logprobs;
  if (drafter_ && !request.sampling.disable_speculation) {
    DraftLengthOptions length;
    length.max_tokens = options_.speculative.num_tokens;
    length.adaptive = options_.speculative.adaptive;
    r->draft_length.emplace(length);
  }
  r->prompt = std::move(request.prompt);
  r->on_output = std::move(request.on_output);
  r->arrival = absl::Now();

  if (request.transferred.has_value()) {
    const RequestId id = *request.transferred;
    {
      RunnerCallerLock lock(this);
      if (!reserved_.erase(id)) {
        return absl::NotFoundError(
            absl::StrCat("no transfer reservation ", id));
      }
    }
    r->id = id;
    r->transferred = true;
    absl::MutexLock lock(&inbox_mu_);
    inbox_.push_back(std::move(r));
    ++pending_;
    work_cv_.SignalAll();
    return id;
  }
  absl::MutexLock lock(&inbox_mu_);
  r->id = next_id_++;
  const RequestId id = r->id;
  inbox_.push_back(std::move(r));
  ++pending_;
  work_cv_.SignalAll();
  return id;
}

absl::StatusOr<TransferReservation> LlmEngine::ReserveTransfer(
    absl::Span<const int32_t> tokens) {
  RequestId id;
  {
    absl::MutexLock lock(&inbox_mu_);
    id = next_id_++;
  }
  RunnerCallerLock lock(this);
  PD_ASSIGN_OR_RETURN(ModelRunner::TransferTarget target,
                      runner_->ReserveForTransfer(id, tokens));
  reserved_.insert(id);
  TransferReservation reservation;
  reservation.id = id;
  reservation.cached_tokens = target.cached_tokens;
  reservation.blocks = std::move(target.blocks);
  return reservation;
}

void LlmEngine::ReleaseTransfer(RequestId id) {
  RunnerCallerLock lock(this);
  if (reserved_.erase(id)) runner_->Release(id);
}

bool LlmEngine::WaitForWork(absl::Duration timeout) {
  absl::MutexLock lock(&inbox_mu_);
  const absl::Time until = absl::Now() + timeout;
  while (pending_ == 0 && cancels_.empty()) {
    if (work_cv_.WaitWithDeadline(&inbox_mu_, until)) break;
  }
  return pending_ > 0;
}

void LlmEngine::Cancel(RequestId id) {
  absl::MutexLock lock(&inbox_mu_);
  cancels_.push_back(id);
  work_cv_.SignalAll();
}

bool LlmEngine::HasWork() const {
  absl::MutexLock lock(&inbox_mu_);
  return pending_ > 0;
}

EngineStats LlmEngine::stats() const {
  EngineStats s = stats_;
  s.waiting = waiting_.size();
  s.running = running_.size();
  return s;
}

void LlmEngine::DrainInbox() {
  std::vector<std::unique_ptr<Request>> arrived;
  std::vector<RequestId> cancels;
  {
    absl::MutexLock lock(&inbox_mu_);
    arrived.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& r : arrived) {
    const RequestId id = r->id;
    if (r->transferred) {
      // Its KV is in place: it joins the running batch at once, its next
      // step feeding the token the prefill worker sampled.
      absl::Status ready = runner_->CompleteTransfer(id);
      if (ready.ok()) {
        ready = runner_->AppendToken(id, r->stream->generated().back());
      }
      r->in_runner = true;
      r->first_output_sent = true;  // the prefill worker sent it
      requests_[id] = std::move(r);
      if (!ready.ok()) {
        RequestOutput out;
        Finish(id, RequestFinish::kError, ready, &out);
        continue;
      }
      running_.push_back(id);
      continue;
    }
    waiting_.push_back(id);
    requests_[id] = std::move(r);
  }
  for (RequestId id : cancels) {
    if (!requests_.contains(id)) continue;
    RequestOutput out;
    Finish(id, RequestFinish::kCancelled, absl::OkStatus(), &out);
  }
}

void LlmEngine::Finish(RequestId id, RequestFinish why, absl::Status error,
                       RequestOutput* out) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::unique_ptr<Request> r = std::move(it->second);
  requests_.erase(it);
  if (r->in_runner) ReleaseFromRunner(*r);
  running_.erase(std::remove(running_.begin(), running_.end(), id),
                 running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id),
                 waiting_.end());
  out->id = id;
  out->finish = why;
  out->error = std::move(error);
  out->prompt_tokens = r->prompt.size();
  out->cached_tokens = r->cached_tokens;
  out->completion_tokens = r->stream->generated().size();
  out->generated_offset =
      out->completion_tokens - static_cast<int32_t>(out->token_ids.size());
  if (r->on_output) r->on_output(*out);
  absl::MutexLock lock(&inbox_mu_);
  --pending_;
}

void LlmEngine::ReleaseFromRunner(Request& r) {
  runner_->Release(r.id);
  if (drafter_) drafter_->Release(r.id);
  r.in_runner = false;
  r.draft.clear();
  r.draft_probs.clear();
}

void LlmEngine::Preempt(RequestId id) {
  Request& r = *requests_[id];
  ReleaseFromRunner(r);
  running_.erase(std::remove(running_.begin(), running_.end(), id),
                 running_.end());
  waiting_.push_front(id);
  ++stats_.preemptions;
}

bool LlmEngine::Admit(Request& r, const ChunkBudget& budget) {
  // A preempted request resumes from its prompt plus what it generated.
  std::vector<int32_t> tokens = r.prompt;
  const std::vector<int32_t>& generated = r.stream->generated();
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  absl::StatusOr<int32_t> cached =
      runner_->AddSequence(r.id, tokens, static_cast<int32_t>(r.prompt.size()));
  if (!cached.ok()) {
    RequestOutput out;
    Finish(r.id, RequestFinish::kError, cached.status(), &out);
    return true;  // gone; look at the next request
  }
  const int32_t remaining = static_cast<int32_t>(tokens.size()) - *cached;
  const int32_t n = budget.Fit(remaining);
  if (!runner_->blocks().CanReserve(r.id, *cached + n)) {
    runner_->Release(r.id);
    return false;
  }
  if (!r.first_output_sent) r.cached_tokens = *cached;
  r.in_runner = true;
  running_.push_back(r.id);
  return true;
}

absl::Status LlmEngine::Step() {
  // Callers waiting for the runner go first (see runner_waiters_).
  auto no_waiters = [this] { return runner_waiters_.load() == 0; };
  absl::MutexLock runner_lock(&runner_mu_, absl::Condition(&no_waiters));
  DrainInbox();
  stats_.last_step_sequences = 0;
  if (running_.empty() && waiting_.empty()) return absl::OkStatus();
  ++stats_.steps;

  ChunkBudget budget(runner_->max_batch_tokens());
  std::vector<ModelRunner::StepItem>& items = step_items_;
  items.clear();
  if (drafter_) ProposeDrafts(budget.left());
  auto schedule = [&](RequestId id) -> bool {
    const int32_t computed = runner_->num_computed(id);
    int32_t remaining =
        static_cast<int32_t>(runner_->tokens(id).size()) - computed;
    Request& r = *requests_[id];
    if (!r.draft.empty() &&
        (budget.Fit(remaining) < remaining ||
         !runner_->blocks().CanReserve(id, computed + remaining))) {
      // A draft only where it fits without preempting anyone.
      DropDraft(r);
      remaining = 1;
    }
    const int32_t n = budget.Fit(remaining);
    if (n <= 0) return true;
    // Make room, preempting the newest sequences, down to this one.
    while (!runner_->blocks().CanReserve(id, computed + n)) {
      const RequestId victim = running_.back();
      Preempt(victim);
      if (victim == id) return false;
    }
    if (!runner_->blocks().Reserve(id, computed + n).ok()) return false;
    items.push_back(budget.Take(id, n, remaining));
    if (!r.draft.empty()) items.back().logits = LogitsMode::kAll;
    return true;
  };

  // 1 and 2: running sequences, decode steps and prefill chunks alike.
  running_snapshot_.assign(running_.begin(), running_.end());
  for (RequestId id : running_snapshot_) {
    if (budget.left() <= 0) break;
    if (std::find(running_.begin(), running_.end(), id) == running_.end()) {
      continue;  // preempted while making room for an earlier one
    }
    schedule(id);
  }
  // 3: admissions.
  while (budget.left() > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < options_.max_running) {
    Request& r = *requests_[waiting_.front()];
    const RequestId id = r.id;
    if (!Admit(r, budget)) break;
    if (!requests_.contains(id)) continue;  // refused with an error
    waiting_.pop_front();
    if (!schedule(id)) break;
  }
  if (drafter_) {
    // Drafts of sequences the budget left out of this pass.
    for (RequestId id : running_) {
      Request& r = *requests_[id];
      if (r.draft.empty()) continue;
      const bool scheduled = std::any_of(
          items.begin(), items.end(),
          [id](const ModelRunner::StepItem& i) { return i.id == id; });
      if (!scheduled) DropDraft(r);
    }
  }
  if (items.empty()) {
    if (running_.empty() && !waiting_.empty()) {
      // Nothing runs and the head of the queue cannot get blocks. If it
      // needs more than the whole cache it never will; otherwise blocks are
      // held elsewhere (transfer reservations) and come back.
      const Request& head = *requests_[waiting_.front()];
      const int64_t needed =
          head.prompt.size() + head.stream->generated().size() + 1;
      const int64_t capacity = int64_t{runner_->blocks().num_total_blocks()} *
                               runner_->blocks().block_size();
      if (needed > capacity) {
        RequestOutput out;
        Finish(waiting_.front(), RequestFinish::kError,
               absl::ResourceExhaustedError(
                   "the request needs more KV blocks than the cache has"),
               &out);
      }
    }
    return absl::OkStatus();
  }

  stats_.last_step_sequences = static_cast<int32_t>(items.size());
  std::vector<float>& logits = step_logits_;
  absl::Status s = runner_->Run(items, &logits);
  if (!s.ok()) {
    for (const auto& item : items) {
      RequestOutput out;
      Finish(item.id, RequestFinish::kError, s, &out);
    }
    return absl::OkStatus();
  }
  size_t row = 0;
  const int32_t vocab = runner_->vocab_size();
  for (const auto& item : items) {
    auto it = requests_.find(item.id);
    if (it != requests_.end() && it->second->first_output_sent) {
      ++stats_.decode_tokens;
    } else {
      stats_.prompt_tokens_computed += item.num_tokens;
    }
    if (item.logits == LogitsMode::kAll) {
      const absl::Span<const float> rows = absl::MakeConstSpan(logits).subspan(
          row * vocab, static_cast<size_t>(item.num_tokens) * vocab);
      PD_RETURN_IF_ERROR(VerifyAndEmit(item.id, rows));
      row += item.num_tokens;
      continue;
    }
    if (item.logits != LogitsMode::kLast) continue;
    PD_RETURN_IF_ERROR(SampleAndEmit(
        item.id, absl::MakeConstSpan(logits).subspan(row * vocab, vocab)));
    ++row;
  }
  return absl::OkStatus();
}

void LlmEngine::ProposeDrafts(int32_t budget) {
  const int32_t limit = options_.speculative.disable_by_batch_size;
  if (limit > 0 && static_cast<int32_t>(running_.size()) >= limit) return;
  // Every running sequence needs at least one token of the pass; drafts get
  // what is left.
  int32_t spare = budget - static_cast<int32_t>(running_.size());
  std::vector<DraftJob>& jobs = draft_jobs_;
  jobs.clear();
  for (RequestId id : running_) {
    Request& r = *requests_[id];
    if (spare <= 0) break;
    if (!r.draft_length.has_value() || !r.first_output_sent) continue;
    const absl::Span<const int32_t> tokens = runner_->tokens(id);
    const int32_t size = static_cast<int32_t>(tokens.size());
    if (runner_->num_computed(id) + 1 != size) continue;  // not decoding
    int32_t k = r.draft_length->Next();
    // Room for the draft and the token after it, in the context and in
    // max_tokens (a pass emits up to k + 1 tokens).
    k = std::min<int64_t>(k, int64_t{runner_->sequence_limit()} - size - 1);
    const int32_t generated =
        static_cast<int32_t>(r.stream->generated().size());
    if (r.stream->sampling().max_tokens.has_value()) {
      k = std::min<int64_t>(
          k, int64_t{*r.stream->sampling().max_tokens} - generated - 1);
    }
    k = std::min(k, spare);
    if (k <= 0) continue;
    DraftJob job;
    job.id = id;
    job.tokens = tokens;
    job.prompt_length = static_cast<int32_t>(r.prompt.size());
    job.max_tokens = k;
    job.sampling = &r.stream->sampling();
    job.seed = r.stream->seed();
    job.step = generated;
    jobs.push_back(std::move(job));
    spare -= k;
  }
  if (jobs.empty()) return;
  if (!drafter_->Propose(absl::MakeSpan(jobs)).ok()) {
    // Speculation is an optimisation: this step decodes plainly.
    for (const DraftJob& job : jobs) drafter_->Resolve(job.id, 0);
    return;
  }
  for (DraftJob& job : jobs) {
    if (job.draft.empty()) continue;
    job.draft.resize(std::min<size_t>(job.draft.size(), job.max_tokens));
    Request& r = *requests_[job.id];
    if (!runner_->AppendDraft(job.id, job.draft).ok()) {
      drafter_->Resolve(job.id, 0);
      continue;
    }
    r.draft = std::move(job.draft);
    r.draft_probs = std::move(job.probs);
  }
}

void LlmEngine::DropDraft(Request& r) {
  if (runner_->num_draft(r.id) > 0) {
    runner_->ResolveDraft(r.id, 0).IgnoreError();  // pending: cannot fail
  }
  drafter_->Resolve(r.id, 0);
  r.draft.clear();
  r.draft_probs.clear();
}

absl::Status LlmEngine::VerifyAndEmit(RequestId id,
                                      absl::Span<const float> rows) {
  Request& r = *requests_[id];
  const std::vector<int32_t> draft = std::move(r.draft);
  const std::vector<std::vector<TokenProb>> probs = std::move(r.draft_probs);
  r.draft.clear();
  r.draft_probs.clear();
  const int32_t k = static_cast<int32_t>(draft.size());
  const size_t vocab = runner_->vocab_size();
  int32_t accepted = 0;
  int32_t verified = 0;  // draft tokens checked (none after the request ends)
  bool goes_on = true;
  for (int32_t j = 0; j <= k && goes_on; ++j) {
    const absl::Span<const float> row = rows.subspan(j * vocab, vocab);
    bool hit = false;
    absl::StatusOr<StreamStep> step =
        j < k ? r.stream->NextVerifying(
                    row, draft[j],
                    probs.empty() ? absl::Span<const TokenProb>() : probs[j],
                    &hit)
              : r.stream->Next(row);
    if (j < k) ++verified;
    if (hit) ++accepted;
    if (j > 0) ++stats_.decode_tokens;
    const bool last = !hit;  // a correction, or the token after a full draft
    goes_on = Emit(id, std::move(step), [&](int32_t token) -> absl::Status {
      if (!last) return absl::OkStatus();  // already in the runner
      PD_RETURN_IF_ERROR(runner_->ResolveDraft(id, accepted));
      drafter_->Resolve(id, accepted);
      return runner_->AppendToken(id, token);
    });
    if (last) break;
  }
  stats_.spec_drafted_tokens += verified;
  stats_.spec_accepted_tokens += accepted;
  auto it = requests_.find(id);
  if (goes_on && it != requests_.end() &&
      it->second->draft_length.has_value()) {
    it->second->draft_length->Record(verified, accepted);
  }
  return absl::OkStatus();
}

absl::Status LlmEngine::SampleAndEmit(RequestId id,
                                      absl::Span<const float> logits) {
  Emit(id, requests_[id]->stream->Next(logits),
       [&](int32_t token) { return runner_->AppendToken(id, token); });
  return absl::OkStatus();
}

bool LlmEngine::Emit(RequestId id, absl::StatusOr<StreamStep> step,
                     absl::FunctionRef<absl::Status(int32_t)> keep) {
  Request& r = *requests_[id];
  RequestOutput out;
  if (!r.first_output_sent) {
    out.arrival_time = r.arrival;
    out.first_token_time = absl::Now();
    r.first_output_sent = true;
  }
  if (!step.ok()) {
    Finish(id, RequestFinish::kError, step.status(), &out);
    return false;
  }
  out.token_ids.push_back(step->token);
  if (step->logprob.has_value()) out.logprobs.push_back(*step->logprob);
  out.text = std::move(step->text);
  if (step->finish == FinishReason::kNone) {
    absl::Status kept = keep(step->token);
    if (!kept.ok()) {
      Finish(id, RequestFinish::kError, kept, &out);
      return false;
    }
    out.id = id;
    out.prompt_tokens = r.prompt.size();
    out.cached_tokens = r.cached_tokens;
    out.completion_tokens = r.stream->generated().size();
    out.generated_offset = out.completion_tokens - 1;
    if (r.on_output) r.on_output(out);
    return true;
  }
  out.stop_token_id = step->stop_token_id;
  out.stop_string = step->stop_string;
  Finish(id,
         step->finish == FinishReason::kLength ? RequestFinish::kLength
                                               : RequestFinish::kStop,
         absl::OkStatus(), &out);
  return false;
}

absl::Status LlmEngine::RunUntilIdle() {
  while (HasWork()) PD_RETURN_IF_ERROR(Step());
  return absl::OkStatus();
}

}  // namespace pdserve::engine
