#include "router/generation_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "engine/block_hash.h"
#include "engine/sampler.h"
#include "engine/sampling_proto.h"
#include "router/request_ids.h"

namespace pdserve::router {
namespace {

constexpr int32_t kMaxPriority = 100;

// A client's chat as the chat template takes it (Generate and Tokenize read
// a chat the same way).
absl::StatusOr<std::vector<model::ChatMessage>> TemplateMessages(
    const v1::ChatMessages& chat) {
  if (chat.messages().empty()) {
    return absl::InvalidArgumentError("'messages' must not be empty");
  }
  std::vector<model::ChatMessage> messages;
  for (const v1::ChatMessage& m : chat.messages()) {
    messages.push_back({m.role(), m.content()});
  }
  return messages;
}

// The chat's prompt tokens; a template that is missing or refuses the
// messages is the request's error (INVALID_ARGUMENT).
absl::StatusOr<std::vector<int32_t>> EncodeChat(
    const model::ModelText& model,
    absl::Span<const model::ChatMessage> messages, bool generation_prompt) {
  absl::StatusOr<std::vector<model::TokenId>> ids =
      model.EncodeChat(messages, generation_prompt);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot apply the chat template: ", ids.status().message()));
  }
  return std::vector<int32_t>(ids->begin(), ids->end());
}

// Waits `backoff`, or less if `cancel` (may be null) fires. Returns whether
// the client is still there.
bool WaitUnlessCancelled(CancelToken* cancel, absl::Duration backoff) {
  if (cancel == nullptr) {
    absl::SleepFor(backoff);
    return true;
  }
  absl::Notification woken;
  const int id = cancel->Register([&woken] { woken.Notify(); });
  woken.WaitForNotificationWithTimeout(backoff);
  cancel->Unregister(id);
  return !cancel->cancelled();
}

}  // namespace

void GenerationCore::WorkersLost(const std::vector<std::string>& worker_ids) {
  // A worker already registered again under the same id (it resumed, or a
  // new process took its name) is not lost: leave its calls alone.
  absl::flat_hash_set<std::string> registered;
  for (const WorkerRecord& r :
       registry_->List(absl::Now(), v1::WORKER_ROLE_UNSPECIFIED)) {
    registered.insert(r.registration.worker_id);
  }
  for (const std::string& id : worker_ids) {
    if (!registered.contains(id)) calls_.Cut(id);
  }
}

GenerationCore::GenerationCore(const model::ModelText* model,
                               WorkerRegistry* registry, RoutingPolicy* policy,
                               const GenerationCoreOptions& options)
    : model_(model),
      registry_(registry),
      policy_(policy),
      options_(options),
      metrics_(options.metrics != nullptr ? options.metrics
                                          : RouterMetrics::Unregistered()),
      decode_stubs_(options.credential),
      prefill_stubs_(options.credential) {}

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
      PD_ASSIGN_OR_RETURN(std::vector<model::ChatMessage> messages,
                          TemplateMessages(r.chat()));
      return EncodeChat(*model_, messages, !r.chat().continue_final_message());
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
  if (!request.request_id().empty()) {
    PD_RETURN_IF_ERROR(CheckRequestId(request.request_id()));
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

absl::Status GenerationCore::TakeInflightSlot(const std::string& id) {
  if (inflight_.fetch_add(1) >= options_.max_inflight) {
    inflight_.fetch_sub(1);
    metrics_->RecordOverload(Overload::kMaxInflight);
    return absl::ResourceExhaustedError(
        absl::StrCat("the router has ", options_.max_inflight,
                     " requests in flight; retry later"));
  }
  absl::MutexLock lock(&mu_);
  if (!active_ids_.insert(id).second) {
    inflight_.fetch_sub(1);
    return absl::AlreadyExistsError(
        absl::StrCat("a request with id '", id, "' is in flight"));
  }
  metrics_->requests_in_flight->Inc();
  return absl::OkStatus();
}

void GenerationCore::ReleaseInflightSlot(const std::string& id) {
  metrics_->requests_in_flight->Dec();
  absl::MutexLock lock(&mu_);
  active_ids_.erase(id);
  inflight_.fetch_sub(1);
}

absl::Status GenerationCore::Generate(v1::GenerateRequest request,
                                      absl::Time deadline,
                                      const ChunkSink& sink,
                                      CancelToken* cancel) {
  const absl::Time arrival = absl::Now();
  PD_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, Encode(request));
  PD_RETURN_IF_ERROR(Validate(request, tokens));
  // Offered load, refused or not: a planner sizes pools from arrivals.
  metrics_->request_prompt_tokens->Observe(tokens.size());
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  const std::string& id = request.request_id();

  PD_RETURN_IF_ERROR(TakeInflightSlot(id));
  struct Cleanup {
    GenerationCore* core;
    std::string id;
    ~Cleanup() { core->ReleaseInflightSlot(id); }
  } cleanup{this, id};

  PD_LOG(DEBUG) << "request " << id << ": received, " << tokens.size()
                << " prompt tokens";
  RequestStream state(request, sink, arrival, cancel, metrics_, tokens.size());
  const absl::Status status = Serve(request, tokens, deadline, state, cancel);
  PD_LOG(DEBUG) << "request " << id << ": ended ("
                << (status.ok() ? "ok" : status.ToString()) << ") after "
                << state.sent().size() << " tokens";
  if (status.code() == absl::StatusCode::kCancelled) {
    metrics_->cancellations->Inc();
  } else if (status.code() == absl::StatusCode::kResourceExhausted) {
    // Past the router's own limit: no decode worker had room.
    metrics_->RecordOverload(Overload::kNoKvCapacity);
  }
  return status;
}

absl::Status GenerationCore::Serve(const v1::GenerateRequest& request,
                                   const std::vector<int32_t>& tokens,
                                   absl::Time deadline, RequestStream& state,
                                   CancelToken* cancel) {
  // Workers that failed this request: tried again only when no other is
  // left, so a retry or migration lands elsewhere when it can.
  absl::flat_hash_set<std::string> failed;
  int retries = 0;
  int capacity_waits = 0;
  absl::Time waiting_since = absl::InfinitePast();
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
    {
      // The worker that computes the prompt, and what it has cached.
      const WorkerView& computes = route.prefill.has_value()
                                       ? prefill[*route.prefill]
                                       : decode[route.decode_order.front()];
      metrics_->RecordRoute(
          route.prefill.has_value() ? RoutingPath::kDisaggregated
                                    : RoutingPath::kLocalPrefill,
          tokens.size(),
          std::min<int64_t>(tokens.size(), int64_t{computes.cached_blocks} *
                                               computes.block_size));
    }
    // Workers this try's failure points at.
    std::vector<std::string> culprits;
    const Attempt a{request, tokens,       attempt,  deadline,
                    state,   state.sent(), &culprits};
    absl::Status status;
    PD_LOG(DEBUG)
        << "request " << request.request_id() << " attempt " << attempt << ": "
        << (route.prefill.has_value()
                ? absl::StrCat("prefill on ", prefill[*route.prefill].worker_id,
                               ", decode on ",
                               decode[route.decode_order.front()].worker_id)
                : absl::StrCat("local prefill and decode on ",
                               decode[route.decode_order.front()].worker_id));
    if (!route.prefill.has_value()) {
      status = RunLocal(a, decode[route.decode_order.front()]);
    } else {
      std::vector<const WorkerView*> decode_order;
      for (size_t i : route.decode_order) decode_order.push_back(&decode[i]);
      status = RunDisaggregated(a, prefill[*route.prefill], decode_order);
    }
    // Only a worker's failure is retried; the request's own errors, the
    // client going away and the deadline end it.
    if (state.client_gone()) {
      return status.ok() ? status
                         : absl::CancelledError("the client went away");
    }
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      PD_RETURN_IF_ERROR(
          WaitForCapacity(a, status, waiting_since, capacity_waits, cancel));
      continue;
    }
    if (status.ok() || status.code() != absl::StatusCode::kUnavailable) {
      return status;
    }
    failed.insert(culprits.begin(), culprits.end());
    PD_RETURN_IF_ERROR(PrepareRetry(a, status, retries, cancel));
  }
}

absl::Status GenerationCore::WaitForCapacity(const Attempt& failed_try,
                                             const absl::Status& status,
                                             absl::Time& waiting_since,
                                             int& waits, CancelToken* cancel) {
  const absl::Time now = absl::Now();
  if (waiting_since == absl::InfinitePast()) waiting_since = now;
  const absl::Time give_up =
      std::min(waiting_since + options_.capacity_wait, failed_try.deadline);
  const absl::Duration pause =
      std::min(absl::Milliseconds(50) * (1 << std::min(waits, 4)),
               absl::Milliseconds(500));
  if (now + pause > give_up) {
    if (waits == 0) return status;
    return absl::ResourceExhaustedError(
        absl::StrCat(status.message(), " (after waiting ",
                     absl::FormatDuration(absl::Trunc(now - waiting_since,
                                                      absl::Milliseconds(1))),
                     " for room)"));
  }
  ++waits;
  metrics_->capacity_waits->Inc();
  PD_LOG(DEBUG) << "request " << failed_try.state.id() << " attempt "
                << failed_try.number
                << ": no decode worker has room; trying again in " << pause;
  if (!WaitUnlessCancelled(cancel, pause)) {
    return absl::CancelledError("the client went away");
  }
  return absl::OkStatus();
}

absl::Status GenerationCore::PrepareRetry(const Attempt& failed_try,
                                          const absl::Status& status,
                                          int& retries, CancelToken* cancel) {
  const std::string& id = failed_try.state.id();
  const bool migrating = !failed_try.state.sent().empty();
  const int limit =
      migrating ? options_.max_migrations : options_.max_prefill_retries;
  if (++retries > limit) {
    return absl::InternalError(
        absl::StrCat("request ", id, " failed after ", retries,
                     " tries; last: ", status.message()));
  }
  PD_LOG(WARNING) << "request " << id << " attempt " << failed_try.number
                  << ": " << status << "; "
                  << (migrating ? absl::StrCat("migrating after ",
                                               failed_try.state.sent().size(),
                                               " tokens")
                                : std::string("retrying the prefill"));
  if (migrating) {
    failed_try.state.count_migration();
    metrics_->migrations->Inc();
  } else {
    metrics_->retries->Inc();
  }
  const absl::Duration backoff =
      std::min(options_.retry_backoff * (1 << std::min(retries - 1, 6)),
               absl::Seconds(2));
  if (absl::Now() + backoff >= failed_try.deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("request ", id, ": deadline passed while retrying (",
                     status.message(), ")"));
  }
  if (!WaitUnlessCancelled(cancel, backoff)) {
    return absl::CancelledError("the client went away");
  }
  return absl::OkStatus();
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
      PD_ASSIGN_OR_RETURN(std::vector<model::ChatMessage> messages,
                          TemplateMessages(request.chat()));
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
      PD_ASSIGN_OR_RETURN(ids,
                          EncodeChat(*model_, messages, generation_prompt));
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
