// PrefillPeer: what a prefill worker does to a decode worker, for the
// decode worker's tests, built from the engine and the KV transfer library
// rather than from //prefill_worker (the two workers meet only over the
// wire, and their tests keep it so): it computes a prompt's KV with its own
// ModelRunner and prefix cache, writes it layer by layer into the target a
// decode worker's Admit issued, samples the first token with the same
// TokenStream the decode side continues with, and delivers the completion
// notice (or, when the transfer failed, gives the target back) through the
// callbacks the test supplies in place of gRPC.
//
// Unlike a prefill worker it runs each Prefill to the end on the calling
// thread, one at a time, and holds no blocks between calls.
//
// Ownership: borrows the model. Thread-safety: one caller at a time.
#ifndef PDSERVE_DECODE_WORKER_TESTING_PREFILL_PEER_H_
#define PDSERVE_DECODE_WORKER_TESTING_PREFILL_PEER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model_runner.h"
#include "kv_transfer/kv_block_transfer.h"
#include "kv_transfer/transport.h"
#include "kv_transfer/transport_factory.h"
#include "model/model.h"
#include "proto/worker.pb.h"

namespace pdserve::decode_worker {

struct PrefillPeerOptions {
  std::string worker_id = "prefill-0";
  engine::ModelRunnerOptions runner;
  kv_transfer::KvTransportConfig transport;
  // DecodeWorker.CompleteTransfer at `notify_address`.
  std::function<absl::Status(const std::string& notify_address,
                             const v1::KvTransferComplete& notice)>
      complete;
  // DecodeWorker.Release at `notify_address`, after a failed transfer whose
  // writes are over.
  std::function<void(const std::string& notify_address,
                     const v1::ReleaseRequest& release)>
      release;
};

class PrefillPeer {
 public:
  static absl::StatusOr<std::unique_ptr<PrefillPeer>> Create(
      const model::Model& model, PrefillPeerOptions options);
  ~PrefillPeer();
  PrefillPeer(const PrefillPeer&) = delete;
  PrefillPeer& operator=(const PrefillPeer&) = delete;

  // The prompt (and replayed tokens) of `request` into request.target(),
  // then the first token. Errors carry the code a prefill worker answers
  // with (DATA_LOSS for a transfer the decode worker refused).
  absl::StatusOr<v1::PrefillResponse> Prefill(
      const v1::PrefillRequest& request);

  // What the router puts in AdmitRequest for this writer.
  const v1::KvLayout& kv_layout() const { return runner_->kv_layout(); }
  v1::TransportKind transport_kind() const { return transport_->kind(); }
  const engine::KvBlockManager& blocks() const { return runner_->blocks(); }

 private:
  PrefillPeer(const model::Model& model, PrefillPeerOptions options)
      : model_(model), options_(std::move(options)) {}
  // Computes sequence `seq` (`tokens`), writes its KV through `*writer`
  // (created here) and samples its first token into `response`.
  absl::Status Run(const v1::PrefillRequest& request, engine::SeqId seq,
                   const std::vector<int32_t>& tokens,
                   std::unique_ptr<kv_transfer::KvTransferWriter>* writer,
                   v1::PrefillResponse* response);

  const model::Model& model_;
  const PrefillPeerOptions options_;
  std::unique_ptr<engine::ModelRunner> runner_;
  std::unique_ptr<kv_transfer::KvTransport> transport_;
  kv_transfer::RegionId region_ = 0;
  // Decode pools imported, by region id.
  absl::flat_hash_map<std::string, kv_transfer::PeerRegionId> peers_;
  std::vector<uint32_t> eos_ids_;
  engine::SeqId next_seq_ = 1;
};

}  // namespace pdserve::decode_worker

#endif  // PDSERVE_DECODE_WORKER_TESTING_PREFILL_PEER_H_
