// PrefillWorker: the prefill side of disaggregated serving. The gRPC
// service (prefill_service.h) is a thin layer over it; this class holds no
// gRPC.
//
// Requests queue (bounded) and a scheduler thread packs their prompts into
// forward passes of at most max_batch_tokens new tokens (chunked prefill;
// several prompts per pass), reusing this worker's prefix cache. A request's
// blocks are reserved whole when it is admitted, so the KV writer knows
// every local block from the start. In the pass that completes a prompt,
// the per-layer callback posts that layer's writes into the decode worker's
// reserved blocks as soon as the layer is done (KvTransferWriter), so the
// transfer overlaps the remaining layers' compute. After the pass the first
// token is sampled (engine::TokenStream, the same code the decode side
// continues with), and a finisher thread waits for the writes, sends the
// completion notice through the TransferCompleter, and answers. The
// request's local blocks are released only after its writes are done (they
// are the source), and their full blocks stay in the prefix cache.
//
// Threads: the scheduler thread owns the ModelRunner; finisher threads wait
// for transfers. Thread-safety: every public method is thread-safe.
#ifndef PDSERVE_PREFILL_WORKER_PREFILL_WORKER_H_
#define PDSERVE_PREFILL_WORKER_PREFILL_WORKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/model_runner.h"
#include "kv_transfer/transport.h"
#include "kv_transfer/transport_factory.h"
#include "model/model.h"
#include "prefill_worker/peer_region_cache.h"
#include "proto/membership.pb.h"
#include "proto/worker.pb.h"
#include "worker/worker_metrics.h"

namespace pdserve::prefill_worker {

// Delivers a completion notice to the decode worker that issued the target
// (DecodeWorker.CompleteTransfer at notify_address, in the process).
class TransferCompleter {
 public:
  virtual ~TransferCompleter() = default;
  virtual absl::Status Complete(const std::string& notify_address,
                                const v1::KvTransferComplete& notice,
                                absl::Time deadline) = 0;
  // Gives an admission back to the decode worker (best effort, bounded):
  // the transfer failed or was cancelled.
  virtual void Release(const std::string& notify_address,
                       const v1::ReleaseRequest& release) = 0;
};

struct PrefillWorkerOptions {
  std::string worker_id;
  engine::ModelRunnerOptions runner;
  kv_transfer::KvTransportConfig transport;
  // Requests waiting or computing beyond this are refused
  // (RESOURCE_EXHAUSTED).
  int32_t max_queued_requests = 256;
  // Threads waiting for transfers to complete.
  int32_t finisher_threads = 4;
  // Imported decode-pool regions kept.
  size_t peer_region_capacity = 64;
  // Where the worker records its metrics; null records to series nobody
  // exports (WorkerMetrics::Unregistered). Not owned.
  worker::WorkerMetrics* metrics = nullptr;
};

// The answer to one Prefill: the response, or why it failed. Called once,
// from a worker thread; must not block long.
using PrefillDone = std::function<void(absl::StatusOr<v1::PrefillResponse>)>;

class PrefillWorker {
 public:
  static absl::StatusOr<std::unique_ptr<PrefillWorker>> Create(
      const model::Model& model, const PrefillWorkerOptions& options,
      TransferCompleter* completer);
  ~PrefillWorker();  // Fails what is queued and stops the threads.
  PrefillWorker(const PrefillWorker&) = delete;
  PrefillWorker& operator=(const PrefillWorker&) = delete;

  void Start();
  // From now on Prefill refuses with UNAVAILABLE.
  void BeginDrain();
  // The drain deadline passed: every prompt still queued or computing is
  // answered UNAVAILABLE ("prefill worker draining"), which the router
  // retries on another prefill worker; a prompt whose KV was written goes
  // through its finisher as usual (blocks given back to the decode worker
  // first). Prompts that arrive later are handed back the same way. Returns
  // the requests in flight when called.
  uint32_t HandBack();

  // Queues a prompt; `done` gets the result. Errors returned here (bad
  // request, queue full, draining) mean `done` is never called; the
  // request's target, if any, has then been given back to its decode worker.
  absl::Status Prefill(const v1::PrefillRequest& request, absl::Time deadline,
                       PrefillDone done);
  // Drops the request from the queue or the batch; a request whose
  // transfer is already being completed finishes on its own. `found` is
  // false only when no write for the attempt can land now or later (see
  // CancelResponse.found).
  v1::CancelResponse Cancel(const v1::CancelRequest& request);

  v1::ModelInfo model_info() const;
  std::vector<v1::TransportKind> transports() const;
  v1::WorkerLoad Load();
  std::vector<v1::PrefixCacheEvent> TakeEvents();
  uint32_t inflight();
  const engine::KvBlockManager& blocks() const;
  // What the worker's metrics read at scrape time.
  worker::WorkerGauges MetricsGauges();

 private:
  struct Job;
  PrefillWorker(const model::Model& model, const PrefillWorkerOptions& options,
                TransferCompleter* completer);
  // Prefill without giving the target back on refusal.
  absl::Status Enqueue(const v1::PrefillRequest& request, absl::Time deadline,
                       PrefillDone done);
  void SchedulerLoop();
  void FinisherLoop();
  // Scheduler thread: moves queued jobs into the batch while blocks allow.
  void AdmitJobs(int32_t* budget);
  // Scheduler thread: fails a job with `status` (non-OK). One holding
  // blocks on a decode worker goes through a finisher (Finish), which
  // waits for its writes and gives the blocks back before answering.
  void FailJob(std::unique_ptr<Job> job, const absl::Status& status);
  // Finisher thread: completes (or, when it failed, winds up) a transfer,
  // releases the job's sequence and answers.
  void Finish(std::unique_ptr<Job> job);
  // Finisher thread: tells the decode worker that a failed job's target
  // blocks can be reused, once none of its writes can land any more.
  void GiveBackTarget(Job& job, const absl::Status& why);
  // Tells the decode worker that no write to `target` can land any more.
  void ReleaseTarget(const v1::KvTransferTarget& target,
                     const std::string& request_id, absl::string_view why);

  const model::Model& model_;
  const PrefillWorkerOptions options_;
  TransferCompleter* const completer_;
  std::unique_ptr<engine::ModelRunner> runner_;
  std::unique_ptr<kv_transfer::KvTransport> transport_;
  kv_transfer::RegionId region_ = 0;
  std::unique_ptr<PeerRegionCache> peers_;
  std::vector<uint32_t> eos_ids_;

  std::atomic<bool> draining_{false};
  worker::WorkerMetrics* const metrics_;
  // Prompts in the batch (active_), for scrapes.
  std::atomic<int32_t> running_{0};
  std::vector<std::thread> threads_;

  absl::Mutex mu_;
  absl::CondVar wake_;  // scheduler: queue, cancels, releases, stop
  absl::CondVar finisher_wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // HandBack was called: the scheduler fails what is queued or computing.
  bool hand_back_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Job>> finishing_ ABSL_GUARDED_BY(mu_);
  // Targets of refused prompts, for a finisher to give back.
  struct RefusedTarget {
    v1::KvTransferTarget target;
    std::string request_id;
    std::string why;
  };
  std::deque<RefusedTarget> refused_targets_ ABSL_GUARDED_BY(mu_);
  std::vector<engine::SeqId> to_release_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, uint32_t>> cancels_ ABSL_GUARDED_BY(mu_);
  // By AttemptKey: the attempts held here (queued, computing or finishing),
  // and those answered while a write of theirs might still land (until the
  // time given). Cancel reports both as found: of any other attempt no
  // write can land, and none ever will, since a Prefill of a cancelled
  // attempt that arrives late is refused (cancelled_ remembers the last
  // kRememberedCancels).
  absl::flat_hash_set<std::string> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> unquiesced_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> cancelled_order_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // Requests in the queue, the batch or finishing.
  int32_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;

  // Scheduler thread only.
  std::vector<std::unique_ptr<Job>> active_;
  std::vector<float> logits_;
};

}  // namespace pdserve::prefill_worker

#endif  // PDSERVE_PREFILL_WORKER_PREFILL_WORKER_H_
