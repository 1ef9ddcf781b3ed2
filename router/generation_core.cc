#include "router/generation_core.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "engine/block_hash.h"
#include "engine/sampler.h"
#include "engine/sampling_proto.h"
#include "rpc/status_conversion.h"

namespace pdserve::router {
namespace {

constexpr size_t kMaxRequestIdBytes = 128;
constexpr int32_t kMaxPriority = 100;

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

void SetDeadline(grpc::ClientContext* context, absl::Time deadline) {
  if (deadline != absl::InfiniteFuture()) {
    context->set_deadline(absl::ToChronoTime(deadline));
  }
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// A worker's error as the client should see it: its own code when it is
// about the request (bad input, no room, deadline), UNAVAILABLE when the
// worker failed.
// A worker's error as the request's: the request's own problems keep their
// code; everything else is the worker failing (UNAVAILABLE: retried). A
// DEADLINE_EXCEEDED before the request's deadline is the worker's (a KV
// transfer that stalled past its reservation).
absl::Status WorkerError(absl::string_view what, const absl::Status& status,
                         absl::Time deadline) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      if (absl::Now() < deadline) break;
      [[fallthrough]];
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kCancelled:
      return absl::Status(status.code(),
                          absl::StrCat(what, ": ", status.message()));
    default:
      break;
  }
  return absl::UnavailableError(
      absl::StrCat(what, " failed (", absl::StatusCodeToString(status.code()),
                   "): ", status.message()));
}

// Best-effort Cancel of one attempt of a request on a worker (DecodeWorker
// or PrefillWorker stub), bounded by a short deadline.
// Returns whether the worker had (or may have had: no answer) something for
// the attempt. `writes_quiesced`: no writer was ever given its KV target.
template <typename Stub>
bool CancelAttempt(Stub* stub, const std::string& request_id, uint32_t attempt,
                   bool writes_quiesced = false) {
  v1::CancelRequest cancel;
  cancel.set_request_id(request_id);
  cancel.set_attempt(attempt);
  cancel.set_reason(v1::CANCEL_REASON_ROUTER);
  cancel.set_writes_quiesced(writes_quiesced);
  grpc::ClientContext context;
  SetDeadline(&context, absl::Now() + absl::Seconds(2));
  v1::CancelResponse response;
  return !stub->Cancel(&context, cancel, &response).ok() || response.found();
}

}  // namespace

// Cancels `context` if `token` fires while the scope lives (a blocking RPC
// made on behalf of a client that may cancel meanwhile).
class CancelScope {
 public:
  CancelScope(CancelToken* token, grpc::ClientContext* context)
      : token_(token) {
    if (token_ != nullptr) {
      id_ = token_->Register([context] { context->TryCancel(); });
    }
  }
  ~CancelScope() {
    if (token_ != nullptr) token_->Unregister(id_);
  }

 private:
  CancelToken* const token_;
  int id_ = 0;
};

// A blocking call to one worker, cut (TryCancel) if the worker loses its
// lease while the call waits: a hung worker keeps its connection open and
// would hold the request until its deadline.
class GenerationCore::WorkerCall {
 public:
  WorkerCall(GenerationCore* core, const std::string& worker_id,
             grpc::ClientContext* context)
      : core_(core), worker_id_(worker_id), context_(context) {
    absl::MutexLock lock(&core_->calls_mu_);
    core_->calls_[worker_id_].insert(this);
  }
  ~WorkerCall() {
    absl::MutexLock lock(&core_->calls_mu_);
    auto it = core_->calls_.find(worker_id_);
    it->second.erase(this);
    if (it->second.empty()) core_->calls_.erase(it);
  }
  // Called with calls_mu_ held.
  void Cut() {
    lost_ = true;
    context_->TryCancel();
  }
  // `status`, or UNAVAILABLE naming the worker when the call was cut (a
  // call that succeeded before the cut stands).
  absl::Status Check(absl::Status status) const {
    if (!lost_ || status.ok()) return status;
    return absl::UnavailableError(absl::StrCat(
        "worker ", worker_id_, " stopped answering (its lease ran out)"));
  }

 private:
  GenerationCore* const core_;
  const std::string worker_id_;
  grpc::ClientContext* const context_;
  std::atomic<bool> lost_{false};
};

void GenerationCore::WorkersLost(const std::vector<std::string>& worker_ids) {
  // A worker already registered again under the same id (it resumed, or a
  // new process took its name) is not lost: leave its calls alone.
  absl::flat_hash_set<std::string> registered;
  for (const WorkerRecord& r :
       registry_->List(absl::Now(), v1::WORKER_ROLE_UNSPECIFIED)) {
    registered.insert(r.registration.worker_id);
  }
  absl::MutexLock lock(&calls_mu_);
  for (const std::string& id : worker_ids) {
    if (registered.contains(id)) continue;
    auto it = calls_.find(id);
    if (it == calls_.end()) continue;
    PD_LOG(WARNING) << "cutting " << it->second.size() << " call(s) to lost "
                    << "worker " << id;
    for (WorkerCall* call : it->second) call->Cut();
  }
}

// One request's state while it runs: what the client asked for and what has
// been sent, so chunks from the prefill and the decode worker become one
// stream.
class GenerationCore::Request {
 public:
  Request(const v1::GenerateRequest& request, const ChunkSink& sink,
          absl::Time arrival, CancelToken* cancel)
      : cancel_(cancel),
        id_(request.request_id()),
        include_usage_(request.stream_options().include_usage()),
        include_timing_(request.stream_options().include_timing()),
        sink_(sink),
        arrival_(arrival) {}

  const std::string& id() const { return id_; }
  // The client went away: a sink call said so, or the front end cancelled.
  bool client_gone() const {
    return client_gone_ || (cancel_ != nullptr && cancel_->cancelled());
  }
  CancelToken* cancel() const { return cancel_; }
  void set_prefill(const std::string& worker_id,
                   const v1::PrefillResponse& response) {
    prefill_worker_ = worker_id;
    prefill_cached_ = response.cached_prefix_tokens();
    kv_transfer_ms_ = response.timing().transfer_ms();
    kv_transfer_tail_ms_ = response.timing().transfer_tail_ms();
    prefill_compute_ms_ = response.timing().compute_ms();
    prefill_queue_ms_ = response.timing().queue_ms();
  }
  void set_routed(absl::Time when) { routed_ = when; }

  // Sends the first token from a PrefillResponse; `last` when it ends the
  // request.
  bool SendFirst(const v1::PrefillResponse& p, uint32_t prompt_tokens) {
    v1::GenerateResponse out;
    out.add_token_ids(p.first_token_id());
    out.set_text(p.text());
    if (p.has_logprob()) *out.add_logprobs() = p.logprob();
    // After a migration the prefill samples the next token of the stream.
    out.set_generated_offset(sent_.size());
    if (p.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out.set_finish_reason(p.finish_reason());
      if (p.has_stop_token_id()) out.set_stop_token_id(p.stop_token_id());
      if (p.has_stop_string()) out.set_stop_string(p.stop_string());
      v1::Usage usage;
      usage.set_prompt_tokens(prompt_tokens);
      usage.set_completion_tokens(sent_.size() + 1);
      usage.set_cached_prompt_tokens(p.cached_prefix_tokens());
      return Send(std::move(out), usage, "");
    }
    return Send(std::move(out), v1::Usage(), "");
  }

  // Forwards one decode chunk.
  bool SendDecode(const v1::DecodeChunk& c) {
    v1::GenerateResponse out;
    *out.mutable_token_ids() = c.token_ids();
    out.set_text(c.text());
    *out.mutable_logprobs() = c.logprobs();
    out.set_generated_offset(c.generated_offset());
    out.set_finish_reason(c.finish_reason());
    if (c.has_stop_token_id()) out.set_stop_token_id(c.stop_token_id());
    if (c.has_stop_string()) out.set_stop_string(c.stop_string());
    v1::Usage usage = c.usage();
    if (!prefill_worker_.empty()) {
      usage.set_cached_prompt_tokens(prefill_cached_);
    }
    if (c.timing().local_prefill_ms() > 0) {
      prefill_compute_ms_ = c.timing().local_prefill_ms();
    }
    return Send(std::move(out), usage, c.timing().decode_worker_id());
  }

  bool finished() const { return finished_; }
  // Tokens the client has received, in order (replayed on a migration).
  const std::vector<uint32_t>& sent() const { return sent_; }
  void count_prefill_attempt() { ++prefill_attempts_; }
  void count_migration() { ++migrations_; }

 private:
  bool Send(v1::GenerateResponse out, const v1::Usage& usage,
            const std::string& decode_worker) {
    const absl::Time now = absl::Now();
    out.set_request_id(id_);
    const bool last = out.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
    if (out.token_ids_size() > 0) {
      if (sent_.empty()) first_token_ = now;
      last_token_ = now;
      sent_.insert(sent_.end(), out.token_ids().begin(), out.token_ids().end());
    }
    if (!decode_worker.empty()) decode_worker_ = decode_worker;
    if (last && include_usage_) *out.mutable_usage() = usage;
    if (include_timing_ && (!sent_any_ || last)) {
      v1::Timing* t = out.mutable_timing();
      // The router's own wait plus the prefill worker's queue.
      t->set_queue_ms(Ms(routed_ - arrival_) + prefill_queue_ms_);
      t->set_ttft_ms(Ms(first_token_ - arrival_));
      t->set_prefill_worker_id(prefill_worker_);
      t->set_prefill_attempts(prefill_attempts_);
      t->set_migrations(migrations_);
      if (last) {
        if (sent_.size() > 1) {
          t->set_tpot_ms(Ms(last_token_ - first_token_) / (sent_.size() - 1));
        }
        t->set_e2e_ms(Ms(now - arrival_));
        t->set_decode_worker_id(decode_worker_);
        t->set_kv_transfer_ms(kv_transfer_ms_);
        t->set_kv_transfer_tail_ms(kv_transfer_tail_ms_);
        t->set_prefill_compute_ms(prefill_compute_ms_);
      }
    }
    sent_any_ = true;
    finished_ |= last;
    if (!sink_(out)) client_gone_ = true;
    return !client_gone_;
  }

  CancelToken* const cancel_;
  const std::string id_;
  const bool include_usage_;
  const bool include_timing_;
  const ChunkSink& sink_;
  const absl::Time arrival_;
  absl::Time routed_;
  absl::Time first_token_;
  absl::Time last_token_;
  std::vector<uint32_t> sent_;
  uint32_t prefill_attempts_ = 0;
  uint32_t migrations_ = 0;
  bool sent_any_ = false;
  bool finished_ = false;
  bool client_gone_ = false;
  std::string prefill_worker_;
  std::string decode_worker_;
  uint32_t prefill_cached_ = 0;
  double kv_transfer_ms_ = 0;
  double kv_transfer_tail_ms_ = 0;
  double prefill_compute_ms_ = 0;
  double prefill_queue_ms_ = 0;
};

GenerationCore::GenerationCore(const model::ModelText* model,
                               WorkerRegistry* registry, RoutingPolicy* policy,
                               const GenerationCoreOptions& options)
    : model_(model), registry_(registry), policy_(policy), options_(options) {}

GenerationCore::~GenerationCore() = default;

absl::StatusOr<std::vector<int32_t>> GenerationCore::Encode(
    const v1::GenerateRequest& r) {
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (r.text().empty()) {
        return absl::InvalidArgumentError("the prompt is empty");
      }
      std::vector<int32_t> ids = model_->EncodePrompt(r.text());
      return ids;
    }
    case v1::GenerateRequest::kChat: {
      if (r.chat().messages().empty()) {
        return absl::InvalidArgumentError("'messages' must not be empty");
      }
      std::vector<model::ChatMessage> messages;
      for (const v1::ChatMessage& m : r.chat().messages()) {
        messages.push_back({m.role(), m.content()});
      }
      absl::StatusOr<std::vector<model::TokenId>> ids =
          model_->EncodeChat(messages, !r.chat().continue_final_message());
      if (!ids.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cannot apply the chat template: ", ids.status().message()));
      }
      return std::vector<int32_t>(ids->begin(), ids->end());
    }
    case v1::GenerateRequest::kTokenIds: {
      if (r.token_ids().ids().empty()) {
        return absl::InvalidArgumentError("the prompt is empty");
      }
      const int32_t vocab = model_->config().vocab_size;
      std::vector<int32_t> ids;
      for (uint32_t id : r.token_ids().ids()) {
        if (id >= static_cast<uint32_t>(vocab)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "token id ", id, " is outside the vocabulary of ", vocab));
        }
        ids.push_back(static_cast<int32_t>(id));
      }
      return ids;
    }
    default:
      return absl::InvalidArgumentError(
          "a prompt is required: text, chat or token_ids");
  }
}

absl::Status GenerationCore::Validate(v1::GenerateRequest& request,
                                      const std::vector<int32_t>& tokens) {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id is longer than ", kMaxRequestIdBytes, " bytes"));
  }
  if (!request.model().empty() && request.model() != options_.model_id) {
    return absl::NotFoundError(absl::StrCat("model '", request.model(),
                                            "' is not served here; try '",
                                            options_.model_id, "'"));
  }
  if (tokens.empty()) return absl::InvalidArgumentError("the prompt is empty");
  const int32_t context = model_->config().context_length;
  if (static_cast<int64_t>(tokens.size()) >= context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", tokens.size(), " tokens; the model's context is ",
        context, " tokens, including at least one generated token"));
  }
  if (std::abs(request.priority()) > kMaxPriority) {
    return absl::InvalidArgumentError("priority must be in [-100, 100]");
  }
  return engine::ValidateSamplingParams(engine::FromProto(request.sampling()),
                                        model_->config().vocab_size);
}

std::vector<WorkerView> GenerationCore::Candidates(
    v1::WorkerRole role, absl::Span<const int32_t> tokens) {
  std::vector<WorkerView> out;
  // Chain keys depend on the block size; workers normally share one.
  absl::flat_hash_map<int32_t, std::vector<uint64_t>> keys_by_block_size;
  for (const WorkerRecord& r :
       registry_->List(absl::Now(), role,
                       /*exact_role=*/role == v1::WORKER_ROLE_PREFILL)) {
    if (r.state != v1::WORKER_STATE_SERVING) continue;
    if (r.registration.model.id() != options_.model_id) continue;
    WorkerView w;
    w.worker_id = r.registration.worker_id;
    w.address = r.registration.address;
    w.role = r.registration.role;
    w.load = r.load;
    w.block_size = std::max<int32_t>(
        1, r.registration.model.kv_layout().block_size_tokens());
    w.kv_layout = r.registration.model.kv_layout();
    w.transports = r.registration.transports;
    auto [keys, fresh] = keys_by_block_size.try_emplace(w.block_size);
    if (fresh) {
      keys->second = engine::ChainKeys(tokens, w.block_size);
    }
    w.cached_blocks =
        registry_->CachedPrefixBlocks(r.registration.worker_id, keys->second);
    out.push_back(std::move(w));
  }
  absl::MutexLock lock(&mu_);
  for (WorkerView& w : out) {
    auto it = outstanding_.find(w.worker_id);
    if (it == outstanding_.end()) continue;
    w.outstanding_tokens = it->second.tokens;
    w.outstanding_sequences = it->second.sequences;
  }
  return out;
}

void GenerationCore::AddOutstanding(const std::string& worker_id,
                                    int64_t tokens, int32_t sequences) {
  absl::MutexLock lock(&mu_);
  Outstanding& o = outstanding_[worker_id];
  o.tokens += tokens;
  o.sequences += sequences;
  if (o.tokens == 0 && o.sequences == 0) outstanding_.erase(worker_id);
}

absl::Status GenerationCore::Generate(v1::GenerateRequest request,
                                      absl::Time deadline,
                                      const ChunkSink& sink,
                                      CancelToken* cancel) {
  const absl::Time arrival = absl::Now();
  PD_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, Encode(request));
  PD_RETURN_IF_ERROR(Validate(request, tokens));
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  const std::string& id = request.request_id();

  if (inflight_.fetch_add(1) >= options_.max_inflight) {
    inflight_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("the router has ", options_.max_inflight,
                     " requests in flight; retry later"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!active_ids_.insert(id).second) {
      inflight_.fetch_sub(1);
      return absl::AlreadyExistsError(
          absl::StrCat("a request with id '", id, "' is in flight"));
    }
  }
  struct Cleanup {
    GenerationCore* core;
    std::string id;
    ~Cleanup() {
      absl::MutexLock lock(&core->mu_);
      core->active_ids_.erase(id);
      core->inflight_.fetch_sub(1);
    }
  } cleanup{this, id};

  Request state(request, sink, arrival, cancel);
  // Workers that failed this request: tried again only when no other is
  // left, so a retry or migration lands elsewhere when it can.
  absl::flat_hash_set<std::string> failed;
  int retries = 0;
  for (uint32_t attempt = 1;; ++attempt) {
    std::vector<WorkerView> decode =
        Prefer(Candidates(v1::WORKER_ROLE_DECODE, tokens), failed);
    if (decode.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "no decode worker is serving model '", options_.model_id, "'"));
    }
    std::vector<WorkerView> prefill =
        Prefer(Candidates(v1::WORKER_ROLE_PREFILL, tokens), failed);
    const Route route = policy_->Choose(prefill, decode, tokens.size(),
                                        decode.front().block_size);
    if (attempt == 1) state.set_routed(absl::Now());
    // Workers this try's failure points at.
    std::vector<std::string> culprits;
    absl::Status status;
    if (!route.prefill.has_value()) {
      status = RunLocal(request, tokens, decode[route.decode_order.front()],
                        attempt, deadline, state, &culprits);
    } else {
      std::vector<const WorkerView*> decode_order;
      for (size_t i : route.decode_order) decode_order.push_back(&decode[i]);
      status =
          RunDisaggregated(request, tokens, prefill[*route.prefill],
                           decode_order, attempt, deadline, state, &culprits);
    }
    // Only a worker's failure is retried; the request's own errors, the
    // client going away and the deadline end it.
    if (state.client_gone()) {
      return status.ok() ? status
                         : absl::CancelledError("the client went away");
    }
    if (status.ok() || status.code() != absl::StatusCode::kUnavailable) {
      return status;
    }
    failed.insert(culprits.begin(), culprits.end());
    const bool migrating = !state.sent().empty();
    const int limit =
        migrating ? options_.max_migrations : options_.max_prefill_retries;
    if (++retries > limit) {
      return absl::InternalError(
          absl::StrCat("request ", id, " failed after ", retries,
                       " tries; last: ", status.message()));
    }
    PD_LOG(WARNING) << "request " << id << " attempt " << attempt << ": "
                    << status << "; "
                    << (migrating ? absl::StrCat("migrating after ",
                                                 state.sent().size(), " tokens")
                                  : std::string("retrying the prefill"));
    if (migrating) {
      state.count_migration();
    }
    const absl::Duration backoff =
        std::min(options_.retry_backoff * (1 << std::min(retries - 1, 6)),
                 absl::Seconds(2));
    if (absl::Now() + backoff >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("request ", id, ": deadline passed while retrying (",
                       status.message(), ")"));
    }
    if (cancel != nullptr) {
      absl::Notification woken;
      const int id = cancel->Register([&woken] { woken.Notify(); });
      woken.WaitForNotificationWithTimeout(backoff);
      cancel->Unregister(id);
      if (cancel->cancelled()) {
        return absl::CancelledError("the client went away");
      }
    } else {
      absl::SleepFor(backoff);
    }
  }
}

std::vector<WorkerView> GenerationCore::Prefer(
    std::vector<WorkerView> workers,
    const absl::flat_hash_set<std::string>& failed) {
  std::vector<WorkerView> healthy;
  for (WorkerView& w : workers) {
    if (!failed.contains(w.worker_id)) healthy.push_back(std::move(w));
  }
  return healthy.empty() ? workers : healthy;
}

absl::Status GenerationCore::StreamDecode(const WorkerView& worker,
                                          const v1::StartDecodeRequest& start,
                                          absl::Time deadline, Request& state) {
  AddOutstanding(worker.worker_id, 0, 1);
  struct Done {
    GenerationCore* core;
    const std::string& worker;
    ~Done() { core->AddOutstanding(worker, 0, -1); }
  } done{this, worker.worker_id};
  grpc::ClientContext context;
  SetDeadline(&context, deadline);
  CancelScope cancellable(state.cancel(), &context);
  WorkerCall call(this, worker.worker_id, &context);
  std::unique_ptr<grpc::ClientReader<v1::DecodeChunk>> reader =
      DecodeStub(worker.address)->StartDecode(&context, start);
  v1::DecodeChunk chunk;
  while (reader->Read(&chunk)) {
    if (!state.SendDecode(chunk)) {
      // The client is gone: stop the stream (the decode worker cancels the
      // request and frees its blocks when the call is cancelled).
      context.TryCancel();
      break;
    }
  }
  const absl::Status status = call.Check(rpc::FromGrpcStatus(reader->Finish()));
  if (state.client_gone() && !state.finished()) {
    CancelAttempt(DecodeStub(worker.address), start.request_id(),
                  start.attempt());
    return absl::CancelledError("the client went away");
  }
  // The last chunk arrived: the answer is complete, whatever the stream's
  // status says after it (a worker dying right then must not cause a retry).
  if (state.finished()) return absl::OkStatus();
  if (!status.ok()) {
    return WorkerError(absl::StrCat("decode on ", worker.worker_id), status,
                       deadline);
  }
  if (!state.finished()) {
    return absl::UnavailableError(absl::StrCat(
        "decode worker ", worker.worker_id, " ended the stream early"));
  }
  return absl::OkStatus();
}

absl::Status GenerationCore::RunLocal(const v1::GenerateRequest& request,
                                      const std::vector<int32_t>& tokens,
                                      const WorkerView& worker,
                                      uint32_t attempt, absl::Time deadline,
                                      Request& state,
                                      std::vector<std::string>* culprits) {
  v1::StartDecodeRequest start;
  start.set_request_id(state.id());
  start.set_attempt(attempt);
  for (int32_t t : tokens)
    start.mutable_local_prefill()->add_prompt_token_ids(t);
  *start.mutable_sampling() = request.sampling();
  // After a migration the worker recomputes prompt + what was sent.
  for (uint32_t t : state.sent()) start.add_generated_token_ids(t);
  start.set_priority(request.priority());
  AddOutstanding(worker.worker_id, tokens.size(), 0);
  absl::Status status = StreamDecode(worker, start, deadline, state);
  AddOutstanding(worker.worker_id, -static_cast<int64_t>(tokens.size()), 0);
  if (!status.ok()) culprits->push_back(worker.worker_id);
  return status;
}

absl::Status GenerationCore::RunDisaggregated(
    const v1::GenerateRequest& request, const std::vector<int32_t>& tokens,
    const WorkerView& prefill, const std::vector<const WorkerView*>& decode,
    uint32_t attempt, absl::Time deadline, Request& state,
    std::vector<std::string>* culprits) {
  // Tokens already sent (a migration): the prefill computes prompt + them
  // and samples the next one.
  const std::vector<uint32_t> replayed = state.sent();
  // 1. Admission first: blocks on a decode worker with room.
  v1::AdmitRequest admit;
  admit.set_request_id(state.id());
  admit.set_attempt(attempt);
  for (int32_t t : tokens) admit.add_token_ids(t);
  for (uint32_t t : replayed) admit.add_token_ids(t);
  admit.set_num_prompt_tokens(tokens.size());
  *admit.mutable_writer_layout() = prefill.kv_layout;
  for (v1::TransportKind kind : prefill.transports) {
    admit.add_writer_transports(kind);
  }
  admit.set_prefill_worker_id(prefill.worker_id);
  // The blocks are useless after the request's deadline: a failed or hung
  // prefill must not hold them longer.
  admit.set_reservation_timeout_ms(absl::ToInt64Milliseconds(
      std::max(std::min(deadline - absl::Now(), options_.reservation_timeout),
               absl::Milliseconds(1))));
  admit.set_priority(request.priority());
  const WorkerView* decoder = nullptr;
  v1::AdmitResponse admitted;
  absl::Status refused;
  for (const WorkerView* candidate : decode) {
    if (state.client_gone())
      return absl::CancelledError("the client went away");
    grpc::ClientContext context;
    SetDeadline(&context, deadline);
    CancelScope cancellable(state.cancel(), &context);
    WorkerCall call(this, candidate->worker_id, &context);
    const absl::Status s = call.Check(rpc::FromGrpcStatus(
        DecodeStub(candidate->address)->Admit(&context, admit, &admitted)));
    if (s.ok()) {
      decoder = candidate;
      break;
    }
    refused = s;
    if (s.code() == absl::StatusCode::kCancelled ||
        s.code() == absl::StatusCode::kDeadlineExceeded) {
      // The worker may have reserved before the call was cut short: ask it
      // to drop whatever this attempt holds (no prefill was sent for it).
      CancelAttempt(DecodeStub(candidate->address), state.id(), attempt,
                    /*writes_quiesced=*/true);
      break;
    }
    if (s.code() == absl::StatusCode::kUnavailable) {
      culprits->push_back(candidate->worker_id);
    } else if (s.code() != absl::StatusCode::kResourceExhausted) {
      break;
    }
  }
  if (decoder == nullptr) {
    if (state.client_gone()) {
      return absl::CancelledError("the client went away");
    }
    return WorkerError("admission on a decode worker", refused, deadline);
  }
  const v1::KvTransferTarget& target = admitted.target();
  auto release = [&](bool writes_quiesced, const std::string& why) {
    v1::ReleaseRequest release;
    release.set_transfer_id(target.transfer_id());
    release.set_request_id(state.id());
    release.set_writes_quiesced(writes_quiesced);
    release.set_reason(why);
    grpc::ClientContext context;
    SetDeadline(&context, absl::Now() + absl::Seconds(2));
    v1::ReleaseResponse ignored;
    DecodeStub(decoder->address)->Release(&context, release, &ignored);
  };

  // 2. Prefill, with the KV pushed into the admitted blocks.
  v1::PrefillRequest prefill_request;
  prefill_request.set_request_id(state.id());
  prefill_request.set_attempt(attempt);
  for (int32_t t : tokens) prefill_request.add_prompt_token_ids(t);
  for (uint32_t t : replayed) prefill_request.add_generated_token_ids(t);
  *prefill_request.mutable_sampling() = request.sampling();
  *prefill_request.mutable_target() = target;
  prefill_request.set_priority(request.priority());
  v1::PrefillResponse first;
  AddOutstanding(prefill.worker_id, tokens.size(), 0);
  state.count_prefill_attempt();
  absl::Status prefilled;
  {
    grpc::ClientContext context;
    SetDeadline(&context, deadline);
    CancelScope cancellable(state.cancel(), &context);
    WorkerCall call(this, prefill.worker_id, &context);
    prefilled = call.Check(
        rpc::FromGrpcStatus(PrefillStub(prefill.address)
                                ->Prefill(&context, prefill_request, &first)));
  }
  AddOutstanding(prefill.worker_id, -static_cast<int64_t>(tokens.size()), 0);
  if (!prefilled.ok()) {
    // Whether a write may still land is known only to the prefill worker,
    // which frees the blocks itself once its writes are over (or when it
    // refused the prompt). Told to stop, a worker that has nothing for the
    // attempt will never write for it (it refuses the attempt should its
    // Prefill still arrive), so the blocks can go at once; otherwise (and
    // for a worker that cannot be reached) this release quarantines them.
    bool may_write = true;
    if (prefilled.code() != absl::StatusCode::kUnavailable) {
      may_write =
          CancelAttempt(PrefillStub(prefill.address), state.id(), attempt);
    }
    release(/*writes_quiesced=*/!may_write,
            absl::StrCat("prefill failed: ",
                         absl::StatusCodeToString(prefilled.code())));
    // An unreachable prefill worker is the one to avoid next time; a
    // transfer that failed may be either end's fault (a corrupting writer,
    // a receiver that lost its region): the retry avoids both if it can.
    culprits->push_back(prefill.worker_id);
    if (prefilled.code() != absl::StatusCode::kUnavailable) {
      culprits->push_back(decoder->worker_id);
    }
    if (state.client_gone()) {
      return absl::CancelledError("the client went away");
    }
    return WorkerError(absl::StrCat("prefill on ", prefill.worker_id),
                       prefilled, deadline);
  }
  state.set_prefill(prefill.worker_id, first);

  // 3. The first token goes to the client now; decoding continues it.
  const bool client_there = state.SendFirst(first, tokens.size());
  if (!client_there || state.finished()) {
    release(/*writes_quiesced=*/true,
            client_there ? "finished at the first token" : "client went away");
    return client_there ? absl::OkStatus()
                        : absl::CancelledError("the client went away");
  }
  v1::StartDecodeRequest start;
  start.set_request_id(state.id());
  start.set_attempt(attempt);
  start.set_transfer_id(target.transfer_id());
  *start.mutable_sampling() = request.sampling();
  for (uint32_t t : replayed) start.add_generated_token_ids(t);
  start.add_generated_token_ids(first.first_token_id());
  start.set_priority(request.priority());
  const absl::Status decoded = StreamDecode(*decoder, start, deadline, state);
  if (!decoded.ok() && !state.client_gone()) {
    // A StartDecode refused before it began leaves the admission to free.
    release(/*writes_quiesced=*/true, "decode failed");
    culprits->push_back(decoder->worker_id);
  }
  return decoded;
}

absl::StatusOr<v1::TokenizeResponse> GenerationCore::Tokenize(
    const v1::TokenizeRequest& request) {
  if (!request.model().empty() && request.model() != options_.model_id) {
    return absl::NotFoundError(
        absl::StrCat("model '", request.model(), "' is not served here"));
  }
  v1::TokenizeResponse response;
  std::vector<int32_t> ids;
  switch (request.input_case()) {
    case v1::TokenizeRequest::kText: {
      const bool special =
          !request.has_add_special_tokens() || request.add_special_tokens();
      std::vector<model::TokenId> t =
          special ? model_->EncodePrompt(request.text())
                  : model_->tokenizer().Encode(request.text(),
                                               /*add_special=*/false,
                                               /*parse_special=*/false);
      ids.assign(t.begin(), t.end());
      break;
    }
    case v1::TokenizeRequest::kChat: {
      if (request.chat().messages().empty()) {
        return absl::InvalidArgumentError("'messages' must not be empty");
      }
      std::vector<model::ChatMessage> messages;
      for (const v1::ChatMessage& m : request.chat().messages()) {
        messages.push_back({m.role(), m.content()});
      }
      const bool generation_prompt = !request.chat().continue_final_message();
      if (!model_->chat_template().ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot apply the chat template: ",
                         model_->chat_template().status().message()));
      }
      absl::StatusOr<std::string> rendered =
          model_->chat_template()->Render(messages, generation_prompt);
      if (!rendered.ok()) {
        return absl::InvalidArgumentError(rendered.status().message());
      }
      response.set_rendered_prompt(*rendered);
      PD_ASSIGN_OR_RETURN(std::vector<model::TokenId> t,
                          model_->EncodeChat(messages, generation_prompt));
      ids.assign(t.begin(), t.end());
      break;
    }
    default:
      return absl::InvalidArgumentError("text or chat is required");
  }
  for (int32_t id : ids) {
    response.add_token_ids(id);
    response.add_pieces(model_->tokenizer()
                            .TokenToPiece(id, /*render_special=*/true)
                            .value_or(""));
  }
  response.set_context_length(model_->config().context_length);
  return response;
}

absl::StatusOr<v1::ListModelsResponse> GenerationCore::ListModels() {
  v1::ListModelsResponse response;
  absl::flat_hash_set<std::string> seen;
  for (const WorkerRecord& r :
       registry_->List(absl::Now(), v1::WORKER_ROLE_DECODE)) {
    if (r.state != v1::WORKER_STATE_SERVING) continue;
    if (!seen.insert(r.registration.model.id()).second) continue;
    v1::ModelInfo* info = response.add_models();
    *info = r.registration.model;
    info->mutable_kv_layout()->set_num_blocks(0);
    if (info->created_unix_s() == 0) {
      info->set_created_unix_s(absl::ToUnixSeconds(r.registered_at));
    }
  }
  std::sort(response.mutable_models()->begin(),
            response.mutable_models()->end(),
            [](const v1::ModelInfo& a, const v1::ModelInfo& b) {
              return a.id() < b.id();
            });
  return response;
}

absl::Status GenerationCore::CheckReady() {
  for (const WorkerRecord& r :
       registry_->List(absl::Now(), v1::WORKER_ROLE_DECODE)) {
    if (r.state == v1::WORKER_STATE_SERVING &&
        r.registration.model.id() == options_.model_id) {
      return absl::OkStatus();
    }
  }
  return absl::UnavailableError(absl::StrCat(
      "no decode worker is serving model '", options_.model_id, "'"));
}

}  // namespace pdserve::router
