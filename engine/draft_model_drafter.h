// DraftModelDrafter: speculative decoding's draft model. A smaller GGUF
// model with the target's tokenizer runs k single-token steps ahead of the
// target, for every speculating sequence at once (one batched pass per draft
// position), with its KV in a paged cache of its own (its own ModelRunner).
//
// Each sequence keeps a twin in the draft runner. Propose first brings the
// twin up to the target's tokens (the prompt, the first time: the decode
// worker needs nothing from the prefill worker for it; afterwards the one or
// two tokens the last verification added) in one pass whose last logits
// give the first draft token, then drafts the rest one pass each; the draft
// tokens are held as the twin's pending draft (ModelRunner::AppendDraft),
// and Resolve keeps the accepted ones, exactly as the target does.
//
// Sampling: greedy requests get the draft model's argmax (a deterministic
// proposal); sampled ones draw from the draft model's distribution under the
// request's temperature, top-k, top-p and min-p (penalties and logit bias
// are left out: any proposal distribution keeps the output exact, and this
// one needs no history), seeded by (seed, step) so runs are reproducible.
//
// A twin that cannot get KV blocks in the draft cache proposes nothing this
// step (the sequence decodes plainly) and is dropped, to be rebuilt later.
//
// Ownership: borrows the draft model; owns the draft runner.
// Thread-safety: the engine's stepping thread only.
#ifndef PDSERVE_ENGINE_DRAFT_MODEL_DRAFTER_H_
#define PDSERVE_ENGINE_DRAFT_MODEL_DRAFTER_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/drafter.h"
#include "engine/model_runner.h"
#include "model/model.h"

namespace pdserve::engine {

class DraftModelDrafter : public Drafter {
 public:
  // INVALID_ARGUMENT when the draft model's vocabulary differs from the
  // target's (`target_vocab_size`): its token ids would mean other text.
  static absl::StatusOr<std::unique_ptr<DraftModelDrafter>> Create(
      const model::Model& draft_model, int32_t target_vocab_size,
      const ModelRunnerOptions& runner_options);

  absl::string_view method() const override { return "draft_model"; }
  absl::Status Propose(absl::Span<DraftJob> jobs) override;
  void Resolve(SeqId id, int32_t accepted) override;
  void Release(SeqId id) override;

  ModelRunner& runner() { return *runner_; }

 private:
  struct Twin {
    // Chooses the twin's draft tokens (see the file comment); created at
    // its first draft.
    std::optional<Sampler> sampler;
  };

  explicit DraftModelDrafter(std::unique_ptr<ModelRunner> runner)
      : runner_(std::move(runner)) {}

  // Brings the twin of `job` to job.tokens; false when it cannot (then it
  // has been dropped). Sets *pending to the tokens it still has to compute.
  bool Sync(const DraftJob& job, int32_t* pending);
  // Chooses draft token j of `job` from the draft logits row.
  absl::Status Choose(DraftJob& job, absl::Span<const float> logits);

  std::unique_ptr<ModelRunner> runner_;
  absl::flat_hash_map<SeqId, Twin> twins_;
  std::vector<ModelRunner::StepItem> items_;
  std::vector<float> logits_;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_DRAFT_MODEL_DRAFTER_H_
