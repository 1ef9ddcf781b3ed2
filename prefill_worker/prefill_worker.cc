#include "prefill_worker/prefill_worker.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "engine/chunk_budget.h"
#include "engine/sampling_proto.h"
#include "engine/token_stream.h"
#include "kv_transfer/kv_block_transfer.h"
#include "worker/proto_conversion.h"

namespace pdserve::prefill_worker {
namespace {

// How long a failed transfer's posted writes get to finish before the
// decode worker is left to quarantine its blocks.
constexpr absl::Duration kQuiesceTimeout = absl::Seconds(2);
// Cancelled attempts remembered, to refuse their Prefill should it come
// after the cancel.
constexpr size_t kRememberedCancels = 4096;

std::string AttemptKey(const std::string& request_id, uint32_t attempt) {
  return absl::StrCat(request_id, "#", attempt);
}

}  // namespace

struct PrefillWorker::Job {
  v1::PrefillRequest request;
  PrefillDone done;
  absl::Time deadline;
  // When the decode worker stops holding the target's blocks (its
  // expires_in_ms counted from arrival here): no write may land after it.
  absl::Time transfer_deadline = absl::InfiniteFuture();
  engine::SeqId seq = 0;
  std::vector<int32_t> tokens;  // prompt + replayed tokens
  bool in_runner = false;
  std::unique_ptr<engine::TokenStream> stream;
  std::unique_ptr<kv_transfer::KvTransferWriter> writer;
  // A failed layer write; the job fails after its pass.
  absl::Status write_error;
  // Set when the job failed; the finisher stops its writes, gives the
  // decode worker's blocks back and answers with it.
  absl::Status failure;
  int32_t cached = 0;
  absl::Time received;
  absl::Time started;
  absl::Time first_post;
  absl::Time sampled;
  v1::PrefillResponse response;
};

PrefillWorker::PrefillWorker(const model::Model& model,
                             const PrefillWorkerOptions& options,
                             TransferCompleter* completer)
    : model_(model),
      options_(options),
      completer_(completer),
      metrics_(options.metrics != nullptr
                   ? options.metrics
                   : worker::WorkerMetrics::Unregistered()) {}

absl::StatusOr<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(
    const model::Model& model, const PrefillWorkerOptions& options,
    TransferCompleter* completer) {
  if (options.worker_id.empty() || completer == nullptr) {
    return absl::InvalidArgumentError(
        "a prefill worker needs a worker id and a transfer completer");
  }
  std::unique_ptr<PrefillWorker> w(
      new PrefillWorker(model, options, completer));
  PD_ASSIGN_OR_RETURN(w->runner_,
                      engine::ModelRunner::Create(model, options.runner));
  PD_ASSIGN_OR_RETURN(w->transport_,
                      kv_transfer::CreateKvTransport(options.transport));
  engine::KvCachePool& pool = w->runner_->backend().kv_pool();
  PD_ASSIGN_OR_RETURN(
      w->region_, w->transport_->RegisterRegion(pool.base(), pool.size_bytes(),
                                                v1::MEMORY_KIND_HOST, 0));
  w->peers_ = std::make_unique<PeerRegionCache>(w->transport_.get(),
                                                options.peer_region_capacity);
  const model::Tokenizer& tok = model.tokenizer();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsEndOfGeneration(id)) w->eos_ids_.push_back(id);
  }
  return w;
}

PrefillWorker::~PrefillWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
    finisher_wake_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
  std::deque<std::unique_ptr<Job>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
    // Handed over by a scheduler pass that ended after the finishers did.
    for (auto& job : finishing_) left.push_back(std::move(job));
    finishing_.clear();
  }
  for (auto& job : left) {
    job->writer.reset();
    job->done(absl::UnavailableError("prefill worker shutting down"));
  }
  for (auto& job : active_) {
    job->writer.reset();
    job->done(absl::UnavailableError("prefill worker shutting down"));
  }
  active_.clear();
  peers_.reset();
  // The pool is the source of writes: unregister it before freeing it.
  if (region_ != 0) transport_->DeregisterRegion(region_).IgnoreError();
  runner_.reset();
}

void PrefillWorker::Start() {
  threads_.emplace_back([this] { SchedulerLoop(); });
  for (int i = 0; i < std::max(1, options_.finisher_threads); ++i) {
    threads_.emplace_back([this] { FinisherLoop(); });
  }
}

void PrefillWorker::BeginDrain() { draining_ = true; }

uint32_t PrefillWorker::HandBack() {
  draining_ = true;
  absl::MutexLock lock(&mu_);
  hand_back_ = true;
  wake_.SignalAll();
  return static_cast<uint32_t>(inflight_);
}

absl::Status PrefillWorker::Prefill(const v1::PrefillRequest& request,
                                    absl::Time deadline, PrefillDone done) {
  absl::Status queued = Enqueue(request, deadline, std::move(done));
  if (!queued.ok() && request.has_target()) {
    // Refused before any write: the decode worker's blocks are free again
    // at once (the router cannot tell a refusal from a crash, so its own
    // release only quarantines them).
    // A finisher sends it: this runs on a gRPC callback thread, which
    // must not wait on another RPC.
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      refused_targets_.push_back({request.target(), request.request_id(),
                                  std::string(queued.message())});
      finisher_wake_.Signal();
    }
  }
  return queued;
}

absl::Status PrefillWorker::Enqueue(const v1::PrefillRequest& request,
                                    absl::Time deadline, PrefillDone done) {
  if (draining_) return absl::UnavailableError("prefill worker is draining");
  auto job = std::make_unique<Job>();
  job->tokens = worker::ToTokens(request.prompt_token_ids());
  if (job->tokens.empty()) {
    return absl::InvalidArgumentError("the prompt is empty");
  }
  job->tokens.insert(job->tokens.end(), request.generated_token_ids().begin(),
                     request.generated_token_ids().end());
  const int32_t vocab = runner_->vocab_size();
  for (int32_t t : job->tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", t, " is outside the vocabulary of ", vocab));
    }
  }
  if (static_cast<int64_t>(job->tokens.size()) >= runner_->context_length()) {
    return absl::InvalidArgumentError(
        absl::StrCat(job->tokens.size(),
                     " tokens leave no room to generate in "
                     "a context of ",
                     runner_->context_length()));
  }
  if (request.has_target() &&
      request.target().num_tokens() != job->tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the target holds ", request.target().num_tokens(),
                     " tokens, the request has ", job->tokens.size()));
  }
  engine::TokenStreamOptions stream_options;
  stream_options.tokenizer = &model_.tokenizer();
  stream_options.sampling = engine::FromProto(request.sampling());
  stream_options.eos_ids = eos_ids_;
  stream_options.context_length = runner_->context_length();
  stream_options.vocab_size = vocab;
  const size_t prompt_length = request.prompt_token_ids_size();
  PD_ASSIGN_OR_RETURN(
      job->stream,
      engine::TokenStream::Create(
          stream_options,
          absl::MakeConstSpan(job->tokens).subspan(0, prompt_length),
          absl::MakeConstSpan(job->tokens).subspan(prompt_length)));
  job->request = request;
  job->done = std::move(done);
  job->deadline = deadline;
  job->received = absl::Now();
  if (request.has_target() && request.target().expires_in_ms() > 0) {
    job->transfer_deadline =
        job->received + absl::Milliseconds(request.target().expires_in_ms());
  }

  absl::MutexLock lock(&mu_);
  if (cancelled_.contains(
          AttemptKey(request.request_id(), request.attempt())) ||
      cancelled_.contains(AttemptKey(request.request_id(), 0))) {
    return absl::CancelledError("this attempt was cancelled before it came");
  }
  if (inflight_ >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prefill queue full (", options_.max_queued_requests, " requests)"));
  }
  live_.insert(AttemptKey(request.request_id(), request.attempt()));
  job->seq = next_seq_++;
  queued_tokens_ += job->tokens.size();
  ++inflight_;
  // Higher priority first; FIFO among equals.
  auto at = std::find_if(queue_.begin(), queue_.end(), [&](const auto& q) {
    return q->request.priority() < request.priority();
  });
  PD_LOG(DEBUG) << "request " << request.request_id() << " attempt "
                << request.attempt() << ": queued for prefill, "
                << job->tokens.size() << " tokens, " << queue_.size()
                << " ahead";
  queue_.insert(at, std::move(job));
  wake_.SignalAll();
  return absl::OkStatus();
}

v1::CancelResponse PrefillWorker::Cancel(const v1::CancelRequest& request) {
  v1::CancelResponse response;
  absl::MutexLock lock(&mu_);
  cancels_.emplace_back(request.request_id(), request.attempt());
  wake_.SignalAll();
  const std::string key = AttemptKey(request.request_id(), request.attempt());
  if (cancelled_.insert(key).second) {
    cancelled_order_.push_back(key);
    if (cancelled_order_.size() > kRememberedCancels) {
      cancelled_.erase(cancelled_order_.front());
      cancelled_order_.pop_front();
    }
  }
  const absl::Time now = absl::Now();
  absl::erase_if(unquiesced_, [now](const auto& e) { return e.second <= now; });
  // attempt 0: every attempt of the request.
  const std::string any_attempt = absl::StrCat(request.request_id(), "#");
  auto matches = [&](const std::string& k) {
    return request.attempt() != 0 ? k == key : absl::StartsWith(k, any_attempt);
  };
  response.set_found(
      std::any_of(live_.begin(), live_.end(), matches) ||
      std::any_of(unquiesced_.begin(), unquiesced_.end(),
                  [&](const auto& e) { return matches(e.first); }));
  return response;
}

void PrefillWorker::FailJob(std::unique_ptr<Job> job,
                            const absl::Status& status) {
  job->failure = absl::Status(
      status.code(), absl::StrCat("request ", job->request.request_id(), ": ",
                                  status.message()));
  {
    absl::MutexLock lock(&mu_);
    if (job->sampled == absl::Time()) queued_tokens_ -= job->tokens.size();
    if (job->request.has_target() && !stop_) {
      // The finisher waits for the writes already posted and frees the
      // decode worker's blocks before answering (see Finish).
      finishing_.push_back(std::move(job));
      finisher_wake_.Signal();
      return;
    }
  }
  // Nothing held on a decode worker (or no finisher left to tell it):
  // answer now.
  job->writer.reset();  // Aborts what is in flight.
  {
    absl::MutexLock lock(&mu_);
    --inflight_;
    if (job->in_runner) to_release_.push_back(job->seq);
    live_.erase(AttemptKey(job->request.request_id(), job->request.attempt()));
  }
  job->done(job->failure);
}

void PrefillWorker::AdmitJobs(int32_t* budget) {
  while (*budget > 0) {
    std::unique_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (absl::Now() > std::min(job->deadline, job->transfer_deadline)) {
      FailJob(std::move(job),
              absl::DeadlineExceededError(
                  "deadline (or the decode worker's reservation) passed "
                  "while queued"));
      continue;
    }
    const int32_t prompt_length = job->request.prompt_token_ids_size();
    absl::StatusOr<int32_t> cached =
        runner_->AddSequence(job->seq, job->tokens, prompt_length);
    if (!cached.ok()) {
      FailJob(std::move(job), cached.status());
      continue;
    }
    job->in_runner = true;
    job->cached = *cached;
    const int32_t total = job->tokens.size();
    if (!runner_->blocks().CanReserve(job->seq, total)) {
      runner_->Release(job->seq);
      job->in_runner = false;
      if (active_.empty() && runner_->blocks().num_used_blocks() == 0) {
        FailJob(std::move(job),
                absl::ResourceExhaustedError(
                    "the prompt needs more KV blocks than the cache has"));
        continue;
      }
      // Wait for running prompts and transfers to give blocks back.
      absl::MutexLock lock(&mu_);
      queue_.push_front(std::move(job));
      return;
    }
    absl::Status reserved = runner_->blocks().Reserve(job->seq, total);
    if (reserved.ok() && job->request.has_target()) {
      const v1::KvTransferTarget& target = job->request.target();
      absl::StatusOr<kv_transfer::PeerRegionId> remote =
          peers_->Get(target.region());
      if (!remote.ok()) {
        reserved = remote.status();
      } else {
        kv_transfer::KvTransferWriterOptions w;
        w.transport = transport_.get();
        w.local_region = region_;
        w.local_pool = runner_->backend().kv_pool().base();
        w.local_layout = runner_->kv_layout();
        w.local_block_ids.clear();
        for (engine::BlockId b : runner_->blocks().CopyBlockTable(job->seq)) {
          w.local_block_ids.push_back(b);
        }
        w.target = target;
        w.remote_region = *remote;
        w.prefill_worker_id = options_.worker_id;
        // Counted from when the request arrived, not from now: the
        // decode worker's clock for its reservation started before.
        w.deadline = std::min(job->deadline, job->transfer_deadline);
        absl::StatusOr<std::unique_ptr<kv_transfer::KvTransferWriter>> writer =
            kv_transfer::KvTransferWriter::Create(std::move(w));
        if (writer.ok()) {
          job->writer = std::move(writer).value();
        } else {
          reserved = writer.status();
        }
      }
    }
    if (!reserved.ok()) {
      FailJob(std::move(job), reserved);
      continue;
    }
    job->started = absl::Now();
    *budget -= std::min(*budget, total - job->cached);
    active_.push_back(std::move(job));
  }
}

void PrefillWorker::SchedulerLoop() {
  std::vector<engine::ModelRunner::StepItem> items;
  for (;;) {
    std::vector<engine::SeqId> releases;
    std::vector<std::pair<std::string, uint32_t>> cancels;
    std::deque<std::unique_ptr<Job>> handed_back;
    bool hand_back = false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      releases.swap(to_release_);
      cancels.swap(cancels_);
      hand_back = hand_back_;
      if (hand_back) handed_back.swap(queue_);
    }
    for (engine::SeqId seq : releases) runner_->Release(seq);
    if (hand_back) {
      // Past the drain deadline: the router retries these elsewhere
      // (UNAVAILABLE), instead of their clients waiting on a worker that
      // is about to exit or getting an error.
      for (auto& job : active_) handed_back.push_back(std::move(job));
      active_.clear();
      if (!handed_back.empty()) {
        PD_LOG(INFO) << "drain deadline: handing " << handed_back.size()
                     << " prompt(s) back to the router";
      }
      for (auto& job : handed_back) {
        FailJob(std::move(job),
                absl::UnavailableError(
                    "prefill worker draining: prompt handed back"));
      }
    }
    // A prompt whose deadline (or target reservation) passed mid-way is
    // not worth another pass: its KV could no longer be written.
    const absl::Time now = absl::Now();
    for (auto& job : active_) {
      if (now > std::min(job->deadline, job->transfer_deadline)) {
        FailJob(std::move(job),
                absl::DeadlineExceededError(
                    "deadline (or the decode worker's reservation) passed "
                    "during prefill"));
      }
    }
    active_.erase(std::remove(active_.begin(), active_.end(), nullptr),
                  active_.end());
    if (!cancels.empty()) {
      auto matches = [&](const Job& job) {
        for (const auto& [id, attempt] : cancels) {
          if (job.request.request_id() == id &&
              (attempt == 0 || job.request.attempt() == attempt)) {
            return true;
          }
        }
        return false;
      };
      std::deque<std::unique_ptr<Job>> queued;
      {
        absl::MutexLock lock(&mu_);
        for (auto& job : queue_) {
          if (matches(*job)) queued.push_back(std::move(job));
        }
        queue_.erase(std::remove(queue_.begin(), queue_.end(), nullptr),
                     queue_.end());
      }
      for (auto& job : queued) {
        FailJob(std::move(job), absl::CancelledError("cancelled"));
      }
      for (auto& job : active_) {
        if (matches(*job)) {
          FailJob(std::move(job), absl::CancelledError("cancelled"));
        }
      }
      active_.erase(std::remove(active_.begin(), active_.end(), nullptr),
                    active_.end());
    }

    engine::ChunkBudget budget(runner_->max_batch_tokens());
    // Jobs already in the batch take their next chunk first.
    items.clear();
    for (const auto& job : active_) {
      const int32_t computed = runner_->num_computed(job->seq);
      const int32_t remaining =
          static_cast<int32_t>(job->tokens.size()) - computed;
      const int32_t n = budget.Fit(remaining);
      if (n <= 0) break;
      items.push_back(budget.Take(job->seq, n, remaining));
    }
    const size_t before = active_.size();
    int32_t room = budget.left();
    AdmitJobs(&room);
    for (size_t i = before; i < active_.size() && budget.left() > 0; ++i) {
      const Job& job = *active_[i];
      const int32_t remaining =
          static_cast<int32_t>(job.tokens.size()) - job.cached;
      items.push_back(budget.Take(job.seq, budget.Fit(remaining), remaining));
    }
    running_ = static_cast<int32_t>(active_.size());
    if (items.empty()) {
      absl::MutexLock lock(&mu_);
      if (queue_.empty() && to_release_.empty() && cancels_.empty() && !stop_) {
        wake_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      } else if (!to_release_.empty() || !cancels_.empty() || stop_) {
        // Go round again at once.
      } else {
        // Queued work waits for blocks held by transfers in flight.
        wake_.WaitWithTimeout(&mu_, absl::Milliseconds(5));
      }
      continue;
    }

    // Jobs whose prompt completes in this pass, in item order.
    std::vector<Job*> completing;
    for (const auto& item : items) {
      if (item.logits != engine::LogitsMode::kLast) continue;
      for (const auto& job : active_) {
        if (job->seq == item.id) completing.push_back(job.get());
      }
    }
    auto on_layer = [&](int layer) {
      for (Job* job : completing) {
        if (job->writer == nullptr || !job->write_error.ok()) continue;
        if (job->first_post == absl::Time()) job->first_post = absl::Now();
        job->write_error = job->writer->WriteLayer(layer);
      }
    };
    const absl::Time pass_start = absl::Now();
    absl::Status ran = runner_->Run(items, &logits_, on_layer);
    metrics_->step_duration->Observe(
        absl::ToDoubleSeconds(absl::Now() - pass_start));
    metrics_->batch_sequences->Observe(items.size());
    if (!ran.ok()) {
      for (auto& job : active_) {
        bool in_pass = false;
        for (const auto& item : items) in_pass |= item.id == job->seq;
        if (in_pass) FailJob(std::move(job), ran);
      }
      active_.erase(std::remove(active_.begin(), active_.end(), nullptr),
                    active_.end());
      continue;
    }
    for (const auto& item : items) {
      metrics_->prompt_tokens_computed->Inc(item.num_tokens);
    }
    const int32_t vocab = runner_->vocab_size();
    for (size_t row = 0; row < completing.size(); ++row) {
      Job* job = completing[row];
      auto it = std::find_if(active_.begin(), active_.end(),
                             [&](const auto& j) { return j.get() == job; });
      std::unique_ptr<Job> owned = std::move(*it);
      active_.erase(it);
      job->sampled = absl::Now();
      {
        absl::MutexLock lock(&mu_);
        queued_tokens_ -= job->tokens.size();
      }
      if (!job->write_error.ok()) {
        FailJob(std::move(owned), job->write_error);
        continue;
      }
      absl::StatusOr<engine::StreamStep> step = job->stream->Next(
          absl::MakeConstSpan(logits_).subspan(row * vocab, vocab));
      if (!step.ok()) {
        FailJob(std::move(owned), step.status());
        continue;
      }
      metrics_->generated_tokens->Inc();
      metrics_->time_to_first_token->Observe(
          absl::ToDoubleSeconds(job->sampled - job->received));
      PD_LOG(DEBUG) << "request " << job->request.request_id() << " attempt "
                    << job->request.attempt() << ": prefilled "
                    << job->tokens.size() - job->cached << " tokens ("
                    << job->cached << " cached), first token " << step->token;
      v1::PrefillResponse& r = job->response;
      r.set_request_id(job->request.request_id());
      r.set_prefill_worker_id(options_.worker_id);
      r.set_first_token_id(step->token);
      r.set_text(step->text);
      if (step->logprob.has_value()) {
        *r.mutable_logprob() =
            worker::ToProto(*step->logprob, model_.tokenizer());
      }
      if (step->finish != engine::FinishReason::kNone) {
        r.set_finish_reason(worker::ToProto(step->finish));
        if (step->stop_token_id.has_value()) {
          r.set_stop_token_id(*step->stop_token_id);
        } else if (step->stop_string.has_value()) {
          r.set_stop_string(*step->stop_string);
        }
      }
      r.set_cached_prefix_tokens(job->cached);
      r.set_computed_tokens(job->tokens.size() - job->cached);
      r.mutable_timing()->set_queue_ms(
          absl::ToDoubleMilliseconds(job->started - job->received));
      r.mutable_timing()->set_compute_ms(
          absl::ToDoubleMilliseconds(job->sampled - job->started));
      absl::MutexLock lock(&mu_);
      finishing_.push_back(std::move(owned));
      finisher_wake_.Signal();
    }
  }
}

void PrefillWorker::FinisherLoop() {
  for (;;) {
    std::unique_ptr<Job> job;
    std::optional<RefusedTarget> refused;
    {
      absl::MutexLock lock(&mu_);
      while (finishing_.empty() && refused_targets_.empty() && !stop_) {
        finisher_wake_.Wait(&mu_);
      }
      if (!refused_targets_.empty()) {
        refused = std::move(refused_targets_.front());
        refused_targets_.pop_front();
      } else if (!finishing_.empty()) {
        job = std::move(finishing_.front());
        finishing_.pop_front();
      } else {
        return;
      }
    }
    if (refused.has_value()) {
      ReleaseTarget(refused->target, refused->request_id, refused->why);
    } else {
      Finish(std::move(job));
    }
  }
}

void PrefillWorker::Finish(std::unique_ptr<Job> job) {
  absl::Status status = job->failure;
  if (status.ok() && job->writer != nullptr) {
    absl::StatusOr<v1::KvTransferComplete> notice = job->writer->Finish();
    if (notice.ok()) {
      job->response.set_kv_bytes_sent(notice->bytes_written());
      status = completer_->Complete(job->request.target().notify_address(),
                                    *notice, job->deadline);
    } else {
      status = notice.status();
    }
    if (!status.ok()) {
      // The decode worker may have restarted under the same region id.
      peers_->Invalidate(job->request.target().region().region_id());
    }
    const absl::Time done = absl::Now();
    if (status.ok()) {
      metrics_->transfer_bytes->Inc(job->response.kv_bytes_sent());
      metrics_->transfer_duration->Observe(
          absl::ToDoubleSeconds(done - job->first_post));
    }
    job->response.mutable_timing()->set_transfer_ms(
        absl::ToDoubleMilliseconds(done - job->first_post));
    job->response.mutable_timing()->set_transfer_tail_ms(
        absl::ToDoubleMilliseconds(done - job->sampled));
    if (!status.ok()) {
      status = absl::Status(
          status.code(),
          absl::StrCat("request ", job->request.request_id(),
                       ": KV transfer failed: ", status.message()));
    }
  }
  if (!status.ok() && job->writer != nullptr &&
      job->first_post != absl::Time()) {
    // Writes were posted: the transfer itself failed (or was cut short).
    metrics_->transfer_failures(worker::TransferFailureOf(status))->Inc();
  }
  if (!status.ok() && job->request.has_target()) GiveBackTarget(*job, status);
  job->writer.reset();
  {
    absl::MutexLock lock(&mu_);
    // The source blocks may be reused only now that no write reads them.
    if (job->in_runner) to_release_.push_back(job->seq);
    --inflight_;
    live_.erase(AttemptKey(job->request.request_id(), job->request.attempt()));
    wake_.SignalAll();
  }
  if (status.ok()) {
    PD_LOG(DEBUG) << "request " << job->request.request_id() << " attempt "
                  << job->request.attempt() << ": KV transfer "
                  << job->request.target().transfer_id() << " complete, "
                  << job->response.kv_bytes_sent() << " bytes";
    job->done(std::move(job->response));
  } else {
    PD_LOG(DEBUG) << "request " << job->request.request_id() << " attempt "
                  << job->request.attempt() << ": prefill failed: " << status;
    job->done(status);
  }
}

void PrefillWorker::GiveBackTarget(Job& job, const absl::Status& why) {
  // Once every write posted for it has finished, nothing can land in the
  // target's blocks any more: the decode worker may reuse them at once
  // instead of quarantining them until the admission expires. Told before
  // the router hears of the failure, so its own (quarantining) release
  // finds nothing left to do.
  const bool quiesced = job.writer == nullptr ||
                        job.writer->Quiesce(absl::Now() + kQuiesceTimeout);
  if (quiesced) {
    ReleaseTarget(job.request.target(), job.request.request_id(),
                  why.message());
    return;
  }
  // A write may still land until the target's deadline: a Cancel of the
  // attempt must say so (found), or its blocks would be freed too early.
  absl::MutexLock lock(&mu_);
  unquiesced_[AttemptKey(job.request.request_id(), job.request.attempt())] =
      std::min(job.transfer_deadline, absl::Now() + absl::Minutes(10));
}

void PrefillWorker::ReleaseTarget(const v1::KvTransferTarget& target,
                                  const std::string& request_id,
                                  absl::string_view why) {
  v1::ReleaseRequest release;
  release.set_transfer_id(target.transfer_id());
  release.set_request_id(request_id);
  release.set_writes_quiesced(true);
  release.set_reason(std::string(why));
  completer_->Release(target.notify_address(), release);
}

v1::ModelInfo PrefillWorker::model_info() const {
  return worker::ModelInfoFor(model_, model_.name(), runner_->kv_layout());
}

std::vector<v1::TransportKind> PrefillWorker::transports() const {
  return {transport_->kind()};
}

const engine::KvBlockManager& PrefillWorker::blocks() const {
  return runner_->blocks();
}

v1::WorkerLoad PrefillWorker::Load() {
  const engine::KvBlockManagerStats kv = runner_->blocks().stats();
  v1::WorkerLoad load;
  load.set_free_kv_blocks(kv.free_blocks);
  load.set_total_kv_blocks(kv.total_blocks);
  absl::MutexLock lock(&mu_);
  load.set_queued_prefill_tokens(queued_tokens_);
  load.set_queued_prefill_requests(inflight_);
  load.set_inflight_transfers(finishing_.size());
  return load;
}

std::vector<v1::PrefixCacheEvent> PrefillWorker::TakeEvents() {
  return worker::ToProto(runner_->blocks().TakeEvents());
}

worker::WorkerGauges PrefillWorker::MetricsGauges() {
  worker::WorkerGauges gauges;
  gauges.requests = [this] {
    absl::MutexLock lock(&mu_);
    return worker::WorkerGauges::Requests{
        .running = static_cast<double>(running_.load()),
        .waiting = static_cast<double>(queue_.size())};
  };
  gauges.kv_blocks = [this] {
    const engine::KvBlockManagerStats kv = runner_->blocks().stats();
    return worker::WorkerGauges::KvBlocks{
        .capacity = static_cast<double>(kv.total_blocks),
        .used = static_cast<double>(kv.used_blocks),
        .free = static_cast<double>(kv.free_blocks)};
  };
  gauges.prefix_cache = [this] {
    const engine::KvBlockManagerStats kv = runner_->blocks().stats();
    return worker::WorkerGauges::PrefixCache{
        .query_tokens = static_cast<double>(kv.prefix_cache_query_tokens),
        .hit_tokens = static_cast<double>(kv.prefix_cache_hit_tokens)};
  };
  gauges.draining = [this] { return draining_.load(); };
  return gauges;
}

uint32_t PrefillWorker::inflight() {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

}  // namespace pdserve::prefill_worker
