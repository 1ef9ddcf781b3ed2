#include "decode_worker/decode_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "engine/sampling_proto.h"
#include "kv_layout/kv_layout.h"
#include "kv_transfer/kv_block_transfer.h"
#include "worker/proto_conversion.h"

namespace pdserve::decode_worker {
namespace {

const char* FinishName(engine::RequestFinish finish) {
  switch (finish) {
    case engine::RequestFinish::kStop:
      return "stop";
    case engine::RequestFinish::kLength:
      return "length";
    case engine::RequestFinish::kCancelled:
      return "cancelled";
    case engine::RequestFinish::kError:
      return "error";
    default:
      return "running";
  }
}

}  // namespace

// Admissions reserve their blocks in the engine's own KV cache.
class DecodeWorker::EngineReserver : public KvReserver {
 public:
  explicit EngineReserver(engine::LlmEngine* engine) : engine_(engine) {}
  absl::StatusOr<Reservation> Reserve(
      absl::Span<const int32_t> tokens) override {
    PD_ASSIGN_OR_RETURN(engine::TransferReservation r,
                        engine_->ReserveTransfer(tokens));
    Reservation out;
    out.handle = r.id;
    out.cached_tokens = static_cast<uint32_t>(r.cached_tokens);
    out.blocks = std::move(r.blocks);
    return out;
  }
  void Free(int64_t handle) override { engine_->ReleaseTransfer(handle); }

 private:
  engine::LlmEngine* const engine_;
};

DecodeWorker::DecodeWorker(const model::Model& model,
                           const DecodeWorkerOptions& options)
    : model_(model),
      options_(options),
      metrics_(options.metrics != nullptr
                   ? options.metrics
                   : worker::WorkerMetrics::Unregistered()) {}

absl::StatusOr<std::unique_ptr<DecodeWorker>> DecodeWorker::Create(
    const model::Model& model, const DecodeWorkerOptions& options) {
  if (options.worker_id.empty()) {
    return absl::InvalidArgumentError("a decode worker needs a worker id");
  }
  std::unique_ptr<DecodeWorker> w(new DecodeWorker(model, options));
  PD_ASSIGN_OR_RETURN(w->transport_,
                      kv_transfer::CreateKvTransport(options.transport));
  engine::EngineOptions engine_options = options.engine;
  engine_options.runner.kv_pool_allocator = [worker = w.get()](uint64_t bytes) {
    return worker->AllocateKvPool(bytes);
  };
  PD_ASSIGN_OR_RETURN(w->engine_,
                      engine::LlmEngine::Create(model, engine_options));
  PD_ASSIGN_OR_RETURN(w->region_descriptor_,
                      w->transport_->ExportRegion(w->region_));
  w->reserver_ = std::make_unique<EngineReserver>(w->engine_.get());
  return w;
}

DecodeWorker::~DecodeWorker() {
  stop_.Notify();
  if (engine_thread_.joinable()) engine_thread_.join();
  if (sweep_thread_.joinable()) sweep_thread_.join();
  // Nothing steps any more: end every open stream so no caller waits.
  absl::flat_hash_map<engine::RequestId, std::shared_ptr<Decode>> open;
  {
    absl::MutexLock lock(&mu_);
    open.swap(decodes_);
  }
  for (auto& [id, d] : open) {
    if (d->sink.on_end) {
      d->sink.on_end(absl::UnavailableError("decode worker shutting down"));
    }
  }
  std::unique_ptr<KvAdmissions> admissions;
  {
    absl::MutexLock lock(&mu_);
    admissions = std::move(admissions_);
  }
  admissions.reset();
  // Frees the KV pool, deregistering it first (AllocateKvPool).
  engine_.reset();
}

absl::StatusOr<engine::KvPoolMemory> DecodeWorker::AllocateKvPool(
    uint64_t bytes) {
  kv_transfer::KvTransport* transport = transport_.get();
  absl::StatusOr<kv_transfer::AllocatedRegion> allocated =
      transport->AllocateRegion(bytes);
  if (allocated.ok()) {
    region_ = allocated->id;
    return engine::KvPoolMemory{.base = allocated->base,
                                .release = [transport, id = region_] {
                                  transport->DeregisterRegion(id).IgnoreError();
                                }};
  }
  if (!absl::IsUnimplemented(allocated.status())) return allocated.status();
  PD_ASSIGN_OR_RETURN(engine::KvPoolMemory own,
                      engine::KvCachePool::AnonymousMemory(bytes));
  absl::StatusOr<kv_transfer::RegionId> region =
      transport->RegisterRegion(own.base, bytes, v1::MEMORY_KIND_HOST, 0);
  if (!region.ok()) {
    own.release();
    return region.status();
  }
  region_ = *region;
  return engine::KvPoolMemory{
      .base = own.base,
      .release = [transport, id = region_, release = std::move(own.release)] {
        transport->DeregisterRegion(id).IgnoreError();
        release();
      }};
}

absl::Status DecodeWorker::Start(const std::string& address) {
  KvAdmissionsOptions options;
  options.worker_id = options_.worker_id;
  options.notify_address = address;
  options.layout = engine_->runner().kv_layout();
  options.region = region_descriptor_;
  options.time_to_live = options_.admission_ttl;
  options.quarantine = options_.quarantine;
  PD_ASSIGN_OR_RETURN(std::unique_ptr<KvAdmissions> admissions,
                      KvAdmissions::Create(options, reserver_.get()));
  {
    // The gRPC service is up before Start (which needs its address), so
    // Admit and Load may already be running on other threads.
    absl::MutexLock lock(&mu_);
    admissions_ = std::move(admissions);
  }
  engine_thread_ = std::thread([this] { EngineLoop(); });
  sweep_thread_ = std::thread([this] { SweepLoop(); });
  return absl::OkStatus();
}

void DecodeWorker::BeginDrain() { draining_ = true; }

uint32_t DecodeWorker::HandBack() {
  draining_ = true;
  std::vector<engine::RequestId> running;
  std::vector<std::string> admitted;
  std::vector<int64_t> verified;
  KvAdmissions* admissions;
  {
    absl::MutexLock lock(&mu_);
    handing_back_ = true;
    admissions = admissions_.get();
    for (auto& [id, d] : decodes_) {
      d->handed_back = true;
      running.push_back(id);
    }
    for (const auto& [transfer_id, t] : transfers_) {
      if (t.verified) {
        verified.push_back(t.reservation);
      } else {
        admitted.push_back(transfer_id);
      }
    }
    transfers_.clear();
  }
  // Outside mu_: the engine thread holds its lock while it takes mu_. Each
  // cancelled stream ends in OnOutput, which sees handed_back.
  for (engine::RequestId id : running) engine_->Cancel(id);
  for (int64_t id : verified) engine_->ReleaseTransfer(id);
  for (const std::string& id : admitted) {
    // A prefill worker may still be writing: the blocks wait out the
    // quarantine. Its completion notice then finds no transfer and its
    // router retries the request.
    admissions->Release(id, /*writes_quiesced=*/false, absl::Now())
        .IgnoreError();
  }
  if (!running.empty() || !admitted.empty() || !verified.empty()) {
    PD_LOG(INFO) << "drain deadline: handing " << running.size()
                 << " stream(s) and " << admitted.size() + verified.size()
                 << " transfer(s) back to the router";
  }
  return running.size() + admitted.size() + verified.size();
}

KvAdmissions* DecodeWorker::admissions() {
  absl::MutexLock lock(&mu_);
  return admissions_.get();
}

void DecodeWorker::EngineLoop() {
  while (!stop_.HasBeenNotified()) {
    if (!engine_->WaitForWork(absl::Milliseconds(50))) continue;
    const engine::EngineStats before = engine_->stats();
    const absl::Time step_start = absl::Now();
    if (absl::Status s = engine_->Step(); !s.ok()) {
      PD_LOG(ERROR) << "engine step failed: " << s;
    }
    const engine::EngineStats after = engine_->stats();
    if (after.last_step_sequences > 0) {
      metrics_->step_duration->Observe(
          absl::ToDoubleSeconds(absl::Now() - step_start));
      metrics_->batch_sequences->Observe(after.last_step_sequences);
    }
    metrics_->prompt_tokens_computed->Inc(after.prompt_tokens_computed -
                                          before.prompt_tokens_computed);
    metrics_->spec_draft_tokens->Inc(after.spec_drafted_tokens -
                                     before.spec_drafted_tokens);
    metrics_->spec_accepted_tokens->Inc(after.spec_accepted_tokens -
                                        before.spec_accepted_tokens);
    running_after_step_ = after.running;
    waiting_after_step_ = after.waiting;
    if (after.prompt_tokens_computed == before.prompt_tokens_computed &&
        after.decode_tokens == before.decode_tokens) {
      // Work is queued but nothing could run (its blocks are held by
      // transfer reservations until they are used or expire): wait a
      // little instead of spinning a core.
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
}

void DecodeWorker::SweepLoop() {
  // Started by Start after it set admissions_.
  KvAdmissions* const admissions = this->admissions();
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    const absl::Time now = absl::Now();
    std::vector<std::string> expired = admissions->Expire(now);
    metrics_->admissions_expired->Inc(expired.size());
    metrics_->transfer_failures(worker::TransferFailure::kDeadline)
        ->Inc(expired.size());
    std::vector<int64_t> unused;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : expired) transfers_.erase(id);
      for (auto it = transfers_.begin(); it != transfers_.end();) {
        if (it->second.verified && now > it->second.expires) {
          PD_LOG(WARNING) << "transfer " << it->first << " of request "
                          << it->second.request_id
                          << " was never decoded; freeing its blocks";
          unused.push_back(it->second.reservation);
          transfers_.erase(it++);
        } else {
          ++it;
        }
      }
    }
    for (int64_t id : unused) engine_->ReleaseTransfer(id);
  }
}

absl::StatusOr<v1::AdmitResponse> DecodeWorker::Admit(
    const v1::AdmitRequest& request) {
  if (draining_) return absl::UnavailableError("decode worker is draining");
  KvAdmissions* const admissions = this->admissions();
  if (admissions == nullptr) {
    return absl::UnavailableError("decode worker is not started yet");
  }
  if (request.token_ids().empty() ||
      request.num_prompt_tokens() >
          static_cast<uint32_t>(request.token_ids_size())) {
    return absl::InvalidArgumentError(
        "admission needs token ids and a prompt length within them");
  }
  const v1::KvLayout& mine = engine_->runner().kv_layout();
  if (request.has_writer_layout()) {
    if (absl::Status same =
            kv_layout::CheckKvLayoutsCompatible(request.writer_layout(), mine);
        !same.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the prefill worker's KV layout does not match this worker's: ",
          same.message()));
    }
  }
  if (!request.writer_transports().empty()) {
    bool common = false;
    for (int kind : request.writer_transports()) {
      common |= kind == transport_->kind();
    }
    if (!common) {
      return absl::FailedPreconditionError(
          "no KV transport in common with the prefill worker");
    }
  }
  std::vector<int32_t> tokens = worker::ToTokens(request.token_ids());
  PD_ASSIGN_OR_RETURN(
      v1::KvTransferTarget target,
      admissions->Admit(request.request_id(), request.attempt(), tokens,
                        absl::Now(),
                        absl::Milliseconds(request.reservation_timeout_ms())));
  Transfer transfer;
  transfer.request_id = request.request_id();
  transfer.attempt = request.attempt();
  transfer.tokens = std::move(tokens);
  transfer.num_prompt_tokens = request.num_prompt_tokens();
  transfer.admitted = absl::Now();
  transfer.expires =
      transfer.admitted + absl::Milliseconds(target.expires_in_ms());
  {
    absl::MutexLock lock(&mu_);
    transfers_[target.transfer_id()] = std::move(transfer);
  }
  PD_LOG(DEBUG) << "request " << request.request_id() << " attempt "
                << request.attempt() << ": admitted, transfer "
                << target.transfer_id() << " into " << target.block_ids_size()
                << " blocks for tokens from " << target.first_token_position()
                << " on";
  v1::AdmitResponse response;
  *response.mutable_target() = std::move(target);
  return response;
}

absl::StatusOr<v1::CompleteTransferResponse> DecodeWorker::CompleteTransfer(
    const v1::KvTransferComplete& notice) {
  const absl::Time start = absl::Now();
  KvAdmissions* admissions;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(notice.transfer_id());
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "no transfer ", notice.transfer_id(), " (expired or released)"));
    }
    if (it->second.verified) return v1::CompleteTransferResponse();
    // Set: the transfer was admitted through it.
    admissions = admissions_.get();
  }
  PD_ASSIGN_OR_RETURN(v1::KvTransferTarget target,
                      admissions->Find(notice.transfer_id()));
  // The transport also delivers the notice, after every write to this
  // worker; take it so the mailbox does not grow (its copy is the same).
  transport_->AwaitNotice(notice.transfer_id(), absl::Now() + absl::Seconds(1))
      .IgnoreError();
  engine::KvCachePool& pool = engine_->runner().backend().kv_pool();
  absl::Status verified = kv_transfer::VerifyKvTransfer(
      notice, target, pool.base(), pool.geometry());
  if (!verified.ok()) {
    PD_LOG(WARNING) << "transfer " << notice.transfer_id() << " of request "
                    << notice.request_id() << " refused: " << verified;
    ++refused_transfers_;
    metrics_->transfer_failures(worker::TransferFailureOf(verified))->Inc();
    admissions
        ->Release(notice.transfer_id(), /*writes_quiesced=*/true, absl::Now())
        .IgnoreError();
    absl::MutexLock lock(&mu_);
    transfers_.erase(notice.transfer_id());
    return verified;
  }
  PD_ASSIGN_OR_RETURN(int64_t reservation,
                      admissions->Claim(notice.transfer_id()));
  bool released = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(notice.transfer_id());
    if (it == transfers_.end()) {
      released = true;
    } else {
      it->second.verified = true;
      it->second.reservation = reservation;
      metrics_->transfer_bytes->Inc(notice.bytes_written());
      metrics_->transfer_duration->Observe(
          absl::ToDoubleSeconds(absl::Now() - it->second.admitted));
    }
  }
  if (released) {
    // Released concurrently: the blocks are ours to free. Outside mu_: the
    // engine thread takes mu_ while holding the runner lock.
    engine_->ReleaseTransfer(reservation);
    return absl::NotFoundError(
        absl::StrCat("transfer ", notice.transfer_id(), " was released"));
  }
  PD_LOG(DEBUG) << "request " << notice.request_id() << ": transfer "
                << notice.transfer_id() << " verified ("
                << notice.bytes_written() << " bytes)";
  v1::CompleteTransferResponse response;
  response.set_verify_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return response;
}

absl::Status DecodeWorker::StartDecode(const v1::StartDecodeRequest& request,
                                       DecodeSink sink) {
  // A draining worker finishes what it admitted (a verified transfer is in
  // flight work), but starts no new local prefills.
  if (draining_ &&
      request.kv_source_case() == v1::StartDecodeRequest::kLocalPrefill) {
    return absl::UnavailableError("decode worker is draining");
  }
  {
    absl::MutexLock lock(&mu_);
    if (handing_back_) {
      return absl::UnavailableError(
          "decode worker draining: its drain deadline passed");
    }
  }
  auto decode = std::make_shared<Decode>();
  decode->request_id = request.request_id();
  decode->attempt = request.attempt();
  decode->sink = std::move(sink);
  decode->started = absl::Now();

  engine::EngineRequest er;
  er.sampling = engine::FromProto(request.sampling());
  er.generated = worker::ToTokens(request.generated_token_ids());
  switch (request.kv_source_case()) {
    case v1::StartDecodeRequest::kTransferId: {
      absl::MutexLock lock(&mu_);
      auto it = transfers_.find(request.transfer_id());
      if (it == transfers_.end()) {
        return absl::NotFoundError(
            absl::StrCat("no transfer ", request.transfer_id()));
      }
      Transfer& t = it->second;
      if (!t.verified) {
        return absl::FailedPreconditionError(absl::StrCat(
            "transfer ", request.transfer_id(), " is not complete"));
      }
      if (t.request_id != request.request_id()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "transfer ", request.transfer_id(), " belongs to another request"));
      }
      // The admitted tokens must be prompt + generated but the last.
      std::vector<int32_t> expected(t.tokens.begin(),
                                    t.tokens.begin() + t.num_prompt_tokens);
      if (!er.generated.empty()) {
        expected.insert(expected.end(), er.generated.begin(),
                        er.generated.end() - 1);
      }
      if (er.generated.empty() || expected != t.tokens) {
        return absl::InvalidArgumentError(
            "generated_token_ids do not continue the admitted tokens");
      }
      er.prompt.assign(t.tokens.begin(),
                       t.tokens.begin() + t.num_prompt_tokens);
      er.transferred = t.reservation;
      decode->num_prompt_tokens = t.num_prompt_tokens;
      transfers_.erase(it);
      break;
    }
    case v1::StartDecodeRequest::kLocalPrefill:
      er.prompt = worker::ToTokens(request.local_prefill().prompt_token_ids());
      decode->num_prompt_tokens = er.prompt.size();
      decode->local_prefill = true;
      break;
    default:
      return absl::InvalidArgumentError(
          "StartDecode needs a transfer_id or a local_prefill");
  }
  const std::optional<engine::RequestId> reservation = er.transferred;
  er.on_output = [this, decode](const engine::RequestOutput& out) {
    OnOutput(decode, out);
  };
  absl::StatusOr<engine::RequestId> id = engine_->AddRequest(std::move(er));
  if (!id.ok()) {
    if (reservation.has_value()) engine_->ReleaseTransfer(*reservation);
    return id.status();
  }
  PD_LOG(DEBUG) << "request " << request.request_id() << " attempt "
                << request.attempt() << ": decoding"
                << (decode->local_prefill ? " after a local prefill of "
                                          : " after a transferred prompt of ")
                << decode->num_prompt_tokens << " tokens";
  bool hand_back = false;
  {
    absl::MutexLock lock(&mu_);
    if (!decode->finished) {
      decodes_[*id] = decode;
      // HandBack ran since the check above: this one goes back too.
      hand_back = decode->handed_back = handing_back_;
    }
  }
  if (hand_back) engine_->Cancel(*id);
  return absl::OkStatus();
}

void DecodeWorker::OnOutput(const std::shared_ptr<Decode>& decode,
                            const engine::RequestOutput& out) {
  const absl::Time now = absl::Now();
  Decode& d = *decode;
  if (!out.token_ids.empty()) {
    if (d.outputs == 0) {
      d.first_output = now;
      metrics_->time_to_first_token->Observe(
          absl::ToDoubleSeconds(now - d.started));
    } else {
      metrics_->inter_token_latency->Observe(
          absl::ToDoubleSeconds(now - d.last_output));
    }
    d.last_output = now;
    ++d.outputs;
    metrics_->generated_tokens->Inc(out.token_ids.size());
  }
  const bool last = out.finish != engine::RequestFinish::kNone;
  bool handed_back = false;
  if (last) {
    PD_LOG(DEBUG) << "request " << d.request_id << " attempt " << d.attempt
                  << ": decode ended (" << FinishName(out.finish) << ") after "
                  << d.outputs << " outputs";
    absl::MutexLock lock(&mu_);
    d.finished = true;
    decodes_.erase(out.id);
    handed_back = d.handed_back;
  }
  if (handed_back && out.finish == engine::RequestFinish::kCancelled) {
    // Not a final chunk: the router migrates the stream, continuing after
    // the tokens it already forwarded (none of this output carries any).
    PD_LOG(DEBUG) << "request " << d.request_id << " attempt " << d.attempt
                  << ": handed back after " << d.outputs << " outputs";
    if (d.sink.on_end) {
      d.sink.on_end(absl::UnavailableError(
          "decode worker draining: stream handed back for migration"));
    }
    return;
  }
  if (out.finish == engine::RequestFinish::kError) {
    PD_LOG(WARNING) << "request " << d.request_id << " failed: " << out.error;
    if (d.sink.on_end) {
      d.sink.on_end(out.error.ok() ? absl::InternalError("decode failed")
                                   : out.error);
    }
    return;
  }
  v1::DecodeChunk chunk;
  chunk.set_request_id(d.request_id);
  for (int32_t t : out.token_ids) chunk.add_token_ids(t);
  chunk.set_text(out.text);
  for (const engine::SampleResult& s : out.logprobs) {
    *chunk.add_logprobs() = worker::ToProto(s, model_.tokenizer());
  }
  chunk.set_generated_offset(out.generated_offset);
  if (last) {
    switch (out.finish) {
      case engine::RequestFinish::kStop:
        chunk.set_finish_reason(v1::FINISH_REASON_STOP);
        break;
      case engine::RequestFinish::kLength:
        chunk.set_finish_reason(v1::FINISH_REASON_LENGTH);
        break;
      default:
        chunk.set_finish_reason(v1::FINISH_REASON_CANCELLED);
        break;
    }
    if (out.stop_token_id.has_value()) {
      chunk.set_stop_token_id(*out.stop_token_id);
    } else if (out.stop_string.has_value()) {
      chunk.set_stop_string(*out.stop_string);
    }
    v1::Usage* usage = chunk.mutable_usage();
    usage->set_prompt_tokens(d.num_prompt_tokens);
    usage->set_completion_tokens(out.completion_tokens);
    if (d.local_prefill) usage->set_cached_prompt_tokens(out.cached_tokens);
    v1::DecodeTiming* timing = chunk.mutable_timing();
    timing->set_decode_worker_id(options_.worker_id);
    if (d.outputs > 0) {
      timing->set_decode_ms(
          absl::ToDoubleMilliseconds(d.last_output - d.started));
      if (d.outputs > 1) {
        timing->set_tpot_ms(
            absl::ToDoubleMilliseconds(d.last_output - d.first_output) /
            (d.outputs - 1));
      }
    }
    if (d.local_prefill) {
      timing->set_local_cached_tokens(out.cached_tokens);
      if (d.outputs > 0) {
        timing->set_local_prefill_ms(
            absl::ToDoubleMilliseconds(d.first_output - d.started));
      }
    }
  }
  if (d.sink.on_chunk) d.sink.on_chunk(chunk);
  if (last && d.sink.on_end) d.sink.on_end(absl::OkStatus());
}

v1::ReleaseResponse DecodeWorker::Release(const v1::ReleaseRequest& request) {
  v1::ReleaseResponse response;
  std::optional<int64_t> verified;
  KvAdmissions* admissions;
  {
    absl::MutexLock lock(&mu_);
    admissions = admissions_.get();
    auto it = transfers_.find(request.transfer_id());
    if (it == transfers_.end()) {
      admissions = request.writes_quiesced() ? admissions : nullptr;
    } else {
      if (it->second.verified) verified = it->second.reservation;
      transfers_.erase(it);
      response.set_found(true);
    }
  }
  if (!response.found()) {
    // Already released (say by the router, which cannot know whether a
    // write may still land), but its blocks may be in quarantine: the
    // writer saying its writes are over frees them. Outside mu_: freeing
    // takes the engine's lock.
    if (admissions != nullptr) {
      response.set_found(
          admissions->Release(request.transfer_id(), true, absl::Now()).ok());
    }
    return response;
  }
  if (verified.has_value()) {
    engine_->ReleaseTransfer(*verified);
  } else {
    admissions
        ->Release(request.transfer_id(), request.writes_quiesced(), absl::Now())
        .IgnoreError();
  }
  return response;
}

v1::CancelResponse DecodeWorker::Cancel(const v1::CancelRequest& request) {
  v1::CancelResponse response;
  auto matches = [&](const std::string& request_id, uint32_t attempt) {
    return request_id == request.request_id() &&
           (request.attempt() == 0 || attempt == request.attempt());
  };
  std::vector<engine::RequestId> running;
  std::vector<std::string> admitted;
  std::vector<int64_t> verified;
  KvAdmissions* admissions;
  {
    absl::MutexLock lock(&mu_);
    // Set whenever `admitted` ends up non-empty (they came through it).
    admissions = admissions_.get();
    for (const auto& [id, d] : decodes_) {
      if (matches(d->request_id, d->attempt)) running.push_back(id);
    }
    for (auto it = transfers_.begin(); it != transfers_.end();) {
      if (matches(it->second.request_id, it->second.attempt)) {
        if (it->second.verified) {
          verified.push_back(it->second.reservation);
        } else {
          admitted.push_back(it->first);
        }
        transfers_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (engine::RequestId id : running) engine_->Cancel(id);
  for (int64_t id : verified) engine_->ReleaseTransfer(id);
  for (const std::string& id : admitted) {
    // Unless the router says no writer was ever given the target, one may
    // still be running: its blocks wait out the quarantine.
    admissions->Release(id, request.writes_quiesced(), absl::Now())
        .IgnoreError();
  }
  response.set_found(!running.empty() || !admitted.empty() ||
                     !verified.empty());
  return response;
}

v1::ModelInfo DecodeWorker::model_info() const {
  return worker::ModelInfoFor(model_, model_.name(),
                              engine_->runner().kv_layout());
}

std::vector<v1::TransportKind> DecodeWorker::transports() const {
  return {transport_->kind()};
}

const engine::KvBlockManager& DecodeWorker::blocks() const {
  return engine_->runner().blocks();
}

v1::WorkerLoad DecodeWorker::Load() {
  const engine::KvBlockManagerStats kv = blocks().stats();
  KvAdmissions* const admissions = this->admissions();
  const KvAdmissionStats admitted =
      admissions != nullptr ? admissions->stats() : KvAdmissionStats();
  v1::WorkerLoad load;
  load.set_free_kv_blocks(kv.free_blocks);
  load.set_total_kv_blocks(kv.total_blocks);
  load.set_reserved_kv_blocks(admitted.reserved_blocks +
                              admitted.quarantined_blocks);
  load.set_quarantined_kv_blocks(admitted.quarantined_blocks);
  load.set_failed_kv_transfers(refused_transfers_ + admitted.expired);
  load.set_inflight_transfers(admitted.admissions);
  absl::MutexLock lock(&mu_);
  load.set_running_sequences(decodes_.size());
  return load;
}

std::vector<v1::PrefixCacheEvent> DecodeWorker::TakeEvents() {
  return worker::ToProto(engine_->runner().blocks().TakeEvents());
}

worker::WorkerGauges DecodeWorker::MetricsGauges() {
  worker::WorkerGauges gauges;
  gauges.requests = [this] {
    KvAdmissions* const admissions = this->admissions();
    // Waiting: queued in the engine (local prefills, preempted sequences)
    // or for their KV (admitted, transfer not yet claimed).
    return worker::WorkerGauges::Requests{
        .running = static_cast<double>(running_after_step_.load()),
        .waiting = static_cast<double>(
            waiting_after_step_.load() +
            (admissions != nullptr ? admissions->stats().admissions : 0))};
  };
  gauges.kv_blocks = [this] {
    const engine::KvBlockManagerStats kv = blocks().stats();
    KvAdmissions* const admissions = this->admissions();
    const KvAdmissionStats admitted =
        admissions != nullptr ? admissions->stats() : KvAdmissionStats();
    return worker::WorkerGauges::KvBlocks{
        .capacity = static_cast<double>(kv.total_blocks),
        .used = static_cast<double>(kv.used_blocks),
        .free = static_cast<double>(kv.free_blocks),
        .reserved = static_cast<double>(admitted.reserved_blocks +
                                        admitted.quarantined_blocks),
        .quarantined = static_cast<double>(admitted.quarantined_blocks)};
  };
  gauges.prefix_cache = [this] {
    const engine::KvBlockManagerStats kv = blocks().stats();
    return worker::WorkerGauges::PrefixCache{
        .query_tokens = static_cast<double>(kv.prefix_cache_query_tokens),
        .hit_tokens = static_cast<double>(kv.prefix_cache_hit_tokens)};
  };
  gauges.draining = [this] { return draining_.load(); };
  return gauges;
}

uint32_t DecodeWorker::inflight() {
  absl::MutexLock lock(&mu_);
  return decodes_.size() + transfers_.size();
}

}  // namespace pdserve::decode_worker
