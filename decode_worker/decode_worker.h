// DecodeWorker: the decode side of disaggregated serving, and the whole of a
// colocated worker. The gRPC service (decode_service.h) is a thin layer over
// it; this class holds no gRPC.
//
// It owns the continuous-batching engine over the worker's KV cache and the
// KV transport whose registered region is that cache. A request arrives in
// one of two ways:
//   - transferred: Admit reserves blocks (through KvAdmissions, reusing the
//     local prefix cache) and returns the target a prefill worker writes
//     into; CompleteTransfer verifies the per-layer checksums over the bytes
//     that landed; StartDecode then joins the running batch at once, its
//     first step feeding the token the prefill worker sampled;
//   - local prefill (conditional disaggregation, colocated mode):
//     StartDecode with the prompt; the engine prefills it in chunks between
//     decode steps.
// Either way tokens stream to the caller's DecodeSink until a stop
// condition, a cancel or an error.
//
// Every block is accounted for: admissions end in a claim, a release or
// expiry (then quarantine); a verified transfer nobody starts decoding is
// freed after the admission time to live; a cancelled or finished sequence
// frees its blocks in the engine.
//
// Threads: an engine loop thread runs the engine's steps (sinks are called
// on it); a sweeper thread expires admissions. Thread-safety: every public
// method is thread-safe.
#ifndef PDSERVE_DECODE_WORKER_DECODE_WORKER_H_
#define PDSERVE_DECODE_WORKER_DECODE_WORKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "decode_worker/kv_admissions.h"
#include "engine/llm_engine.h"
#include "kv_transfer/transport.h"
#include "kv_transfer/transport_factory.h"
#include "model/model.h"
#include "proto/membership.pb.h"
#include "proto/worker.pb.h"
#include "worker/worker_metrics.h"

namespace pdserve::decode_worker {

struct DecodeWorkerOptions {
  std::string worker_id;
  engine::EngineOptions engine;
  kv_transfer::KvTransportConfig transport;
  // How long an admission waits for its transfer, and a verified transfer
  // for its StartDecode. It must cover the prefill's queueing and compute
  // (long prompts on CPU take seconds) and the transfer; the router releases
  // admissions it gives up on, so this only bounds what a lost router or
  // prefill worker can strand.
  absl::Duration admission_ttl = absl::Seconds(120);
  // Blocks possibly still being written wait this long after the
  // admission's life before reuse (see KvAdmissions).
  absl::Duration quarantine = absl::Seconds(10);
  // Where the worker records its metrics; null records to series nobody
  // exports (WorkerMetrics::Unregistered). Not owned.
  worker::WorkerMetrics* metrics = nullptr;
};

// Where a decode's output goes. on_chunk is called for every chunk, in
// order; on_end exactly once after the last one: OK after the chunk with
// finish_reason (also after a cancel), an error otherwise. Both run on the
// engine thread and must not block.
struct DecodeSink {
  std::function<void(const v1::DecodeChunk& chunk)> on_chunk;
  std::function<void(const absl::Status& status)> on_end;
};

class DecodeWorker {
 public:
  // Builds the engine and the transport and registers the KV cache with
  // it. Nothing runs until Start.
  static absl::StatusOr<std::unique_ptr<DecodeWorker>> Create(
      const model::Model& model, const DecodeWorkerOptions& options);
  ~DecodeWorker();  // Cancels what is running and stops the threads.
  DecodeWorker(const DecodeWorker&) = delete;
  DecodeWorker& operator=(const DecodeWorker&) = delete;

  // Starts the threads; `address` is where prefill workers send
  // CompleteTransfer (this worker's gRPC address).
  absl::Status Start(const std::string& address);
  // From now on Admit and StartDecode refuse with UNAVAILABLE.
  void BeginDrain();
  // The drain deadline passed: every stream still running ends, after the
  // tokens it already sent, with UNAVAILABLE ("decode worker draining"),
  // which the router answers by migrating it (prompt + tokens sent
  // re-prefilled on another worker, the stream continuing with the next
  // token); transfers not yet decoding are given back (their router
  // retries), and StartDecode refuses from now on. Returns the streams and
  // transfers handed back.
  uint32_t HandBack();

  // ---- The DecodeWorker service (proto/worker.proto) --------------------
  absl::StatusOr<v1::AdmitResponse> Admit(const v1::AdmitRequest& request);
  absl::StatusOr<v1::CompleteTransferResponse> CompleteTransfer(
      const v1::KvTransferComplete& notice);
  // On error nothing is started and the sink is never called.
  absl::Status StartDecode(const v1::StartDecodeRequest& request,
                           DecodeSink sink);
  v1::ReleaseResponse Release(const v1::ReleaseRequest& request);
  v1::CancelResponse Cancel(const v1::CancelRequest& request);

  // ---- Membership -------------------------------------------------------
  v1::ModelInfo model_info() const;
  std::vector<v1::TransportKind> transports() const;
  v1::WorkerLoad Load();
  std::vector<v1::PrefixCacheEvent> TakeEvents();
  // Admissions not yet ended plus decodes running.
  uint32_t inflight();
  // What the worker's metrics read at scrape time.
  worker::WorkerGauges MetricsGauges();

  // For tests and metrics: the engine's block accounting.
  const engine::KvBlockManager& blocks() const;

 private:
  class EngineReserver;
  // A transfer between Admit and StartDecode (or Release / expiry).
  struct Transfer {
    std::string request_id;
    uint32_t attempt = 0;
    std::vector<int32_t> tokens;  // prompt + replayed tokens but the last
    uint32_t num_prompt_tokens = 0;
    bool verified = false;
    int64_t reservation = 0;  // the engine's id, once verified
    // The admission's deadline: verified KV nobody started decoding by
    // then is freed (the router that asked for it is gone).
    absl::Time expires;
    absl::Time admitted;
  };
  // A StartDecode in progress; shared by the engine callback and the map
  // Cancel looks in (the callback may fire before the map entry exists).
  struct Decode {
    std::string request_id;
    uint32_t attempt = 0;
    DecodeSink sink;
    uint32_t num_prompt_tokens = 0;
    bool local_prefill = false;
    // Engine thread only.
    absl::Time started;
    absl::Time first_output;
    absl::Time last_output;
    int32_t outputs = 0;
    // Guarded by DecodeWorker::mu_.
    bool finished = false;
    // Cancelled by HandBack: ends with UNAVAILABLE, not a final chunk.
    bool handed_back = false;
  };

  DecodeWorker(const model::Model& model, const DecodeWorkerOptions& options);
  void EngineLoop();
  void SweepLoop();
  // Engine thread: one engine output of decode `id` to its sink.
  void OnOutput(const std::shared_ptr<Decode>& decode,
                const engine::RequestOutput& out);
  // admissions_, read under mu_; null before Start.
  KvAdmissions* admissions() ABSL_LOCKS_EXCLUDED(mu_);
  // The engine's KV pool memory, registered with transport_ as region_:
  // memory the transport allocates where it has faster memory for peers
  // (UCX: shared memory that a prefill worker on this host stores into
  // directly), else anonymous memory registered with it. Freeing it
  // deregisters it first, so no peer writes into memory that is gone.
  absl::StatusOr<engine::KvPoolMemory> AllocateKvPool(uint64_t bytes);

  const model::Model& model_;
  const DecodeWorkerOptions options_;
  // Before engine_: the engine's pool lives in the transport's region.
  std::unique_ptr<kv_transfer::KvTransport> transport_;
  kv_transfer::RegionId region_ = 0;
  std::unique_ptr<engine::LlmEngine> engine_;
  v1::MemoryRegionDescriptor region_descriptor_;
  std::unique_ptr<EngineReserver> reserver_;

  std::atomic<bool> draining_{false};
  // Transfers whose completion notice failed verification.
  std::atomic<uint64_t> refused_transfers_{0};
  worker::WorkerMetrics* const metrics_;
  // The engine's queues after its last step, for scrapes (the engine's own
  // counts are the engine thread's).
  std::atomic<int32_t> running_after_step_{0};
  std::atomic<int32_t> waiting_after_step_{0};
  absl::Notification stop_;
  std::thread engine_thread_;
  std::thread sweep_thread_;

  // Never held while calling into the engine: the engine thread holds its
  // runner lock while its output callbacks take mu_.
  absl::Mutex mu_;
  // Null until Start sets it: the gRPC service is up before Start (which
  // needs its address), so calls may read it concurrently. Set once and kept
  // until the destructor, so a pointer read under mu_ (admissions()) stays
  // valid after mu_ is released; KvAdmissions is thread-safe itself.
  std::unique_ptr<KvAdmissions> admissions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<engine::RequestId, std::shared_ptr<Decode>> decodes_
      ABSL_GUARDED_BY(mu_);
  // HandBack was called: new decodes are refused, late ones handed back.
  bool handing_back_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pdserve::decode_worker

#endif  // PDSERVE_DECODE_WORKER_DECODE_WORKER_H_
