#include "decode_worker/testing/prefill_peer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engine/chunk_budget.h"
#include "engine/sampling_proto.h"
#include "engine/token_stream.h"

namespace pdserve::decode_worker {

absl::StatusOr<std::unique_ptr<PrefillPeer>> PrefillPeer::Create(
    const model::Model& model, PrefillPeerOptions options) {
  if (!options.complete || !options.release) {
    return absl::InvalidArgumentError("a prefill peer needs both callbacks");
  }
  std::unique_ptr<PrefillPeer> peer(new PrefillPeer(model, std::move(options)));
  PD_ASSIGN_OR_RETURN(
      peer->runner_, engine::ModelRunner::Create(model, peer->options_.runner));
  PD_ASSIGN_OR_RETURN(peer->transport_,
                      kv_transfer::CreateKvTransport(peer->options_.transport));
  engine::KvCachePool& pool = peer->runner_->backend().kv_pool();
  PD_ASSIGN_OR_RETURN(peer->region_, peer->transport_->RegisterRegion(
                                         pool.base(), pool.size_bytes(),
                                         v1::MEMORY_KIND_HOST, 0));
  const model::Tokenizer& tok = model.tokenizer();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsEndOfGeneration(id)) peer->eos_ids_.push_back(id);
  }
  return peer;
}

PrefillPeer::~PrefillPeer() {
  for (const auto& [id, peer] : peers_) {
    transport_->ReleasePeerRegion(peer).IgnoreError();
  }
  // The pool is the source of writes: unregister it before freeing it.
  if (region_ != 0) transport_->DeregisterRegion(region_).IgnoreError();
  runner_.reset();
}

absl::StatusOr<v1::PrefillResponse> PrefillPeer::Prefill(
    const v1::PrefillRequest& request) {
  std::vector<int32_t> tokens(request.prompt_token_ids().begin(),
                              request.prompt_token_ids().end());
  tokens.insert(tokens.end(), request.generated_token_ids().begin(),
                request.generated_token_ids().end());
  const engine::SeqId seq = next_seq_++;
  std::unique_ptr<kv_transfer::KvTransferWriter> writer;
  v1::PrefillResponse response;
  absl::Status status = Run(request, seq, tokens, &writer, &response);
  if (!status.ok()) {
    // As a prefill worker does: once no write of it can land any more, the
    // target's blocks go back to the decode worker at once.
    if (writer == nullptr || writer->Quiesce(absl::Now() + absl::Seconds(2))) {
      v1::ReleaseRequest release;
      release.set_transfer_id(request.target().transfer_id());
      release.set_request_id(request.request_id());
      release.set_writes_quiesced(true);
      release.set_reason(std::string(status.message()));
      options_.release(request.target().notify_address(), release);
    }
  }
  writer.reset();
  // The source blocks may be reused only now that no write reads them.
  runner_->Release(seq);
  if (!status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("request ", request.request_id(), ": ", status.message()));
  }
  return response;
}

absl::Status PrefillPeer::Run(
    const v1::PrefillRequest& request, engine::SeqId seq,
    const std::vector<int32_t>& tokens,
    std::unique_ptr<kv_transfer::KvTransferWriter>* writer,
    v1::PrefillResponse* response) {
  const size_t prompt_length = request.prompt_token_ids_size();
  engine::TokenStreamOptions stream_options;
  stream_options.tokenizer = &model_.tokenizer();
  stream_options.sampling = engine::FromProto(request.sampling());
  stream_options.eos_ids = eos_ids_;
  stream_options.context_length = runner_->context_length();
  stream_options.vocab_size = runner_->vocab_size();
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::TokenStream> stream,
      engine::TokenStream::Create(
          stream_options, absl::MakeConstSpan(tokens).subspan(0, prompt_length),
          absl::MakeConstSpan(tokens).subspan(prompt_length)));

  // The whole sequence's blocks first, so the writer knows all of them.
  PD_ASSIGN_OR_RETURN(const int32_t cached,
                      runner_->AddSequence(seq, tokens, prompt_length));
  PD_RETURN_IF_ERROR(runner_->blocks().Reserve(seq, tokens.size()));
  const v1::KvTransferTarget& target = request.target();
  auto [peer, fresh] = peers_.try_emplace(target.region().region_id());
  if (fresh) {
    absl::StatusOr<kv_transfer::PeerRegionId> imported =
        transport_->ImportPeerRegion(target.region());
    if (!imported.ok()) {
      peers_.erase(peer);
      return imported.status();
    }
    peer->second = *imported;
  }
  const kv_transfer::PeerRegionId remote = peer->second;
  kv_transfer::KvTransferWriterOptions w;
  w.transport = transport_.get();
  w.local_region = region_;
  w.local_pool = runner_->backend().kv_pool().base();
  w.local_layout = runner_->kv_layout();
  for (engine::BlockId b : runner_->blocks().CopyBlockTable(seq)) {
    w.local_block_ids.push_back(b);
  }
  w.target = target;
  w.remote_region = remote;
  w.prefill_worker_id = options_.worker_id;
  PD_ASSIGN_OR_RETURN(*writer,
                      kv_transfer::KvTransferWriter::Create(std::move(w)));

  // Chunked as a prefill worker's passes are; each layer is written as soon
  // as the pass that completes the prompt has computed it.
  absl::Status write_error;
  auto write_layer = [&](int layer) {
    if (write_error.ok()) write_error = (*writer)->WriteLayer(layer);
  };
  std::vector<float> logits;
  for (int32_t computed = cached;
       computed < static_cast<int32_t>(tokens.size());) {
    engine::ChunkBudget budget(runner_->max_batch_tokens());
    const int32_t remaining = static_cast<int32_t>(tokens.size()) - computed;
    const engine::ModelRunner::StepItem item =
        budget.Take(seq, budget.Fit(remaining), remaining);
    const bool last = item.logits == engine::LogitsMode::kLast;
    PD_RETURN_IF_ERROR(runner_->Run(
        {&item, 1}, &logits,
        last ? engine::ModelRunner::LayerCallback(write_layer) : nullptr));
    computed += item.num_tokens;
  }
  PD_RETURN_IF_ERROR(write_error);
  PD_ASSIGN_OR_RETURN(const engine::StreamStep step,
                      stream->Next(absl::MakeConstSpan(logits).subspan(
                          0, runner_->vocab_size())));

  PD_ASSIGN_OR_RETURN(const v1::KvTransferComplete notice, (*writer)->Finish());
  response->set_kv_bytes_sent(notice.bytes_written());
  if (absl::Status done = options_.complete(target.notify_address(), notice);
      !done.ok()) {
    return absl::Status(done.code(),
                        absl::StrCat("KV transfer failed: ", done.message()));
  }
  response->set_request_id(request.request_id());
  response->set_prefill_worker_id(options_.worker_id);
  response->set_first_token_id(step.token);
  response->set_text(step.text);
  response->set_cached_prefix_tokens(cached);
  response->set_computed_tokens(tokens.size() - cached);
  return absl::OkStatus();
}

}  // namespace pdserve::decode_worker
