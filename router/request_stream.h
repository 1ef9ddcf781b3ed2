// RequestStream: one request's stream to its client while the router runs
// it. The first token comes from a prefill worker (PrefillResponse), the
// rest from a decode worker (DecodeChunk), and after a migration from other
// workers again; this class turns them into one GenerateResponse stream,
// remembers the tokens the client has (replayed on a migration), and fills
// in usage and timing. Kept apart from GenerationCore so what the client
// sees is decided in one place, whichever path served the request.
//
// Thread-safety: used by the thread running the request only.
#ifndef PDSERVE_ROUTER_REQUEST_STREAM_H_
#define PDSERVE_ROUTER_REQUEST_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/client.pb.h"
#include "proto/worker.pb.h"
#include "router/client_api.h"
#include "router/router_metrics.h"

namespace pdserve::router {

class RequestStream {
 public:
  // Borrows `sink`, `cancel` (which may be null) and `metrics` for the
  // object's life. What the client is sent is recorded in `metrics`: its
  // latencies, its tokens (the prompt's `prompt_tokens` once the first
  // token is sent), and how it finished.
  RequestStream(const v1::GenerateRequest& request, const ChunkSink& sink,
                absl::Time arrival, CancelToken* cancel, RouterMetrics* metrics,
                uint32_t prompt_tokens);

  const std::string& id() const { return id_; }
  // The client went away: a sink call said so, or the front end cancelled.
  bool client_gone() const {
    return client_gone_ || (cancel_ != nullptr && cancel_->cancelled());
  }
  CancelToken* cancel() const { return cancel_; }
  void set_prefill(const std::string& worker_id,
                   const v1::PrefillResponse& response);
  void set_routed(absl::Time when) { routed_ = when; }

  // Sends the first token from a PrefillResponse (the last chunk when the
  // prefill finished the request). Returns false when the client is gone.
  bool SendFirst(const v1::PrefillResponse& p, uint32_t prompt_tokens);

  // Forwards one decode chunk. Returns false when the client is gone.
  bool SendDecode(const v1::DecodeChunk& c);

  bool finished() const { return finished_; }
  // Tokens the client has received, in order (replayed on a migration).
  const std::vector<uint32_t>& sent() const { return sent_; }
  void count_prefill_attempt() { ++prefill_attempts_; }
  void count_migration() { ++migrations_; }

 private:
  bool Send(v1::GenerateResponse out, const v1::Usage& usage,
            const std::string& decode_worker);

  // The request's figures once it finished (the last chunk is sent).
  void RecordFinished(const v1::GenerateResponse& last, absl::Time now);

  CancelToken* const cancel_;
  RouterMetrics* const metrics_;
  const uint32_t prompt_tokens_;
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

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_REQUEST_STREAM_H_
