#include "router/request_stream.h"

#include <utility>

#include "absl/time/clock.h"

namespace pdserve::router {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }
double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

RequestStream::RequestStream(const v1::GenerateRequest& request,
                             const ChunkSink& sink, absl::Time arrival,
                             CancelToken* cancel, RouterMetrics* metrics,
                             uint32_t prompt_tokens)
    : cancel_(cancel),
      metrics_(metrics),
      prompt_tokens_(prompt_tokens),
      id_(request.request_id()),
      include_usage_(request.stream_options().include_usage()),
      include_timing_(request.stream_options().include_timing()),
      sink_(sink),
      arrival_(arrival) {}

void RequestStream::set_prefill(const std::string& worker_id,
                                const v1::PrefillResponse& response) {
  prefill_worker_ = worker_id;
  prefill_cached_ = response.cached_prefix_tokens();
  kv_transfer_ms_ = response.timing().transfer_ms();
  kv_transfer_tail_ms_ = response.timing().transfer_tail_ms();
  prefill_compute_ms_ = response.timing().compute_ms();
  prefill_queue_ms_ = response.timing().queue_ms();
}

bool RequestStream::SendFirst(const v1::PrefillResponse& p,
                              uint32_t prompt_tokens) {
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

bool RequestStream::SendDecode(const v1::DecodeChunk& c) {
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

bool RequestStream::Send(v1::GenerateResponse out, const v1::Usage& usage,
                         const std::string& decode_worker) {
  const absl::Time now = absl::Now();
  out.set_request_id(id_);
  const bool last = out.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  if (out.token_ids_size() > 0) {
    if (sent_.empty()) {
      first_token_ = now;
      metrics_->time_to_first_token->Observe(Seconds(now - arrival_));
      metrics_->prompt_tokens->Inc(prompt_tokens_);
    } else {
      metrics_->inter_token_latency->Observe(Seconds(now - last_token_));
    }
    last_token_ = now;
    sent_.insert(sent_.end(), out.token_ids().begin(), out.token_ids().end());
    metrics_->generation_tokens->Inc(out.token_ids_size());
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
  if (last) RecordFinished(out, now);
  if (!sink_(out)) client_gone_ = true;
  return !client_gone_;
}

void RequestStream::RecordFinished(const v1::GenerateResponse& last,
                                   absl::Time now) {
  metrics_->e2e_latency->Observe(Seconds(now - arrival_));
  if (sent_.size() > 1) {
    metrics_->time_per_output_token->Observe(
        Seconds(last_token_ - first_token_) / (sent_.size() - 1));
  }
  metrics_->queue_time->Observe(Seconds(routed_ - arrival_) +
                                prefill_queue_ms_ / 1000);
  if (prefill_compute_ms_ > 0) {
    metrics_->prefill_time->Observe(prefill_compute_ms_ / 1000);
  }
  if (!prefill_worker_.empty()) {
    metrics_->kv_transfer_tail->Observe(kv_transfer_tail_ms_ / 1000);
  }
  if (last.finish_reason() == v1::FINISH_REASON_STOP ||
      last.finish_reason() == v1::FINISH_REASON_LENGTH) {
    metrics_->RecordSuccess(last.finish_reason());
    metrics_->request_generation_tokens->Observe(sent_.size());
  }
}

}  // namespace pdserve::router
