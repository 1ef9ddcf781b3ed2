#include "engine/model_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engine/cpu_backend.h"
#include "engine/kv_cache_pool.h"
#include "kv_layout/kv_layout.h"

namespace pdserve::engine {

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(
    const model::Model& model, const ModelRunnerOptions& options) {
  if (options.block_size <= 0 || options.max_batch_tokens <= 0) {
    return absl::InvalidArgumentError(
        "block_size and max_batch_tokens must be positive");
  }
  if (options.attention_sinks < 0 || options.sink_window < 0 ||
      (options.attention_sinks > 0 && options.sink_window == 0)) {
    return absl::InvalidArgumentError(
        "attention_sinks and sink_window must be >= 0, and sinks need a "
        "sink_window");
  }
  std::unique_ptr<ModelRunner> r(new ModelRunner(model, options));
  const model::ModelConfig& c = model.config();
  v1::KvLayout& l = r->layout_;
  l.set_layout_version(kv_layout::kKvLayoutVersion);
  l.set_model_fingerprint(model.fingerprint());
  l.set_num_layers(c.num_layers);
  l.set_num_kv_heads(c.num_kv_heads);
  l.set_head_dim(c.head_dim);
  l.set_dtype(options.kv_dtype);
  l.set_block_size_tokens(options.block_size);
  int64_t num_blocks = options.num_blocks;
  if (num_blocks <= 0) {
    PD_ASSIGN_OR_RETURN(kv_layout::KvGeometry g,
                        kv_layout::KvGeometry::FromProto(l));
    num_blocks = options.kv_cache_bytes /
                 static_cast<int64_t>(g.block_bytes() * c.num_layers);
  }
  if (num_blocks <= 0 || num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("the KV cache must hold at least one block (asked for ",
                     num_blocks, " blocks)"));
  }
  l.set_num_blocks(num_blocks);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<KvCachePool> pool,
                      KvCachePool::Create(l, options.kv_pool_allocator));
  CpuBackendOptions backend_options;
  backend_options.num_threads = options.num_threads;
  backend_options.llamacpp_prompt_numerics = options.llamacpp_prompt_numerics;
  backend_options.pack_weights = options.pack_weights;
  backend_options.matmul_arithmetic = options.matmul_arithmetic;
  backend_options.testing_attention_mask = options.testing_attention_mask;
  PD_ASSIGN_OR_RETURN(
      r->backend_,
      CpuBackend::Create(c, model.weights(), std::move(pool), backend_options));
  KvBlockManagerOptions block_options;
  block_options.num_blocks = static_cast<int32_t>(num_blocks);
  block_options.block_size = options.block_size;
  block_options.enable_prefix_cache = options.enable_prefix_cache;
  r->max_sequence_tokens_ = static_cast<int32_t>(std::min<int64_t>(
      c.context_length, num_blocks * int64_t{options.block_size}));
  block_options.max_blocks_per_sequence = r->MaxSequenceBlocks();
  PD_ASSIGN_OR_RETURN(r->blocks_, KvBlockManager::Create(block_options));
  return r;
}

absl::StatusOr<int32_t> ModelRunner::AddSequence(
    SeqId id, absl::Span<const int32_t> prompt, int32_t prompt_length) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (static_cast<int64_t>(prompt.size()) >= context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", prompt.size(), " tokens does not fit the context of ",
        context_length(), " tokens (at least one token must be generated)"));
  }
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", t, " outside the vocabulary of ", vocab_size()));
    }
  }
  if (seqs_.contains(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", id, " already exists"));
  }
  PD_ASSIGN_OR_RETURN(int32_t cached, blocks_->AddSequence(id, prompt));
  Sequence& s = seqs_[id];
  // Room for the longest sequence (4 bytes a token, against this model's KV
  // of kilobytes a token), so that appending a token never allocates; vLLM
  // keeps its token ids the same way.
  s.tokens.reserve(max_sequence_tokens_);
  s.tokens.assign(prompt.begin(), prompt.end());
  s.num_computed = cached;
  s.registered_length = static_cast<int32_t>(prompt.size());
  s.prompt_length =
      prompt_length < 0
          ? static_cast<int32_t>(prompt.size())
          : std::min(prompt_length, static_cast<int32_t>(prompt.size()));
  return cached;
}

absl::Status ModelRunner::AppendToken(SeqId id, int32_t token) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("no sequence ", id));
  }
  if (token < 0 || token >= vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", token, " outside the vocabulary of ", vocab_size()));
  }
  if (it->second.num_draft > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", id, " has an unresolved draft; ResolveDraft first"));
  }
  if (static_cast<int64_t>(it->second.tokens.size()) >= sequence_limit()) {
    return absl::OutOfRangeError(absl::StrCat(
        "sequence ", id, " has reached the context length ", context_length()));
  }
  // Within the reserved context (past it only with attention sinks).
  it->second.tokens.push_back(token);
  return absl::OkStatus();
}

absl::Status ModelRunner::AppendDraft(SeqId id,
                                      absl::Span<const int32_t> draft) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("no sequence ", id));
  }
  Sequence& s = it->second;
  if (static_cast<int64_t>(s.tokens.size() + draft.size()) > sequence_limit()) {
    return absl::OutOfRangeError(
        absl::StrCat("a draft of ", draft.size(), " tokens takes sequence ", id,
                     " past the context length ", context_length()));
  }
  for (int32_t t : draft) {
    if (t < 0 || t >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "draft token id ", t, " outside the vocabulary of ", vocab_size()));
    }
  }
  s.tokens.insert(s.tokens.end(), draft.begin(), draft.end());
  s.num_draft += static_cast<int32_t>(draft.size());
  return absl::OkStatus();
}

absl::Status ModelRunner::ResolveDraft(SeqId id, int32_t accepted) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("no sequence ", id));
  }
  Sequence& s = it->second;
  if (s.num_draft == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", id, " has no draft pending"));
  }
  if (accepted < 0 || accepted > s.num_draft) {
    return absl::InvalidArgumentError(
        absl::StrCat("accepted ", accepted, " of a draft of ", s.num_draft));
  }
  s.tokens.resize(s.tokens.size() - (s.num_draft - accepted));
  s.num_draft = 0;
  s.num_computed =
      std::min(s.num_computed, static_cast<int32_t>(s.tokens.size()));
  return blocks_->MarkComputed(id, s.tokens, s.num_computed);
}

int32_t ModelRunner::num_draft(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.num_draft;
}

void ModelRunner::Release(SeqId id) {
  if (seqs_.erase(id) > 0) blocks_->FreeSequence(id);
}

absl::Span<const int32_t> ModelRunner::tokens(SeqId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return {};
  return it->second.tokens;
}

int32_t ModelRunner::num_computed(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.num_computed;
}

absl::Status ModelRunner::Run(absl::Span<const StepItem> items,
                              std::vector<float>* logits,
                              const LayerCallback& on_layer_done) {
  if (items.empty()) return absl::InvalidArgumentError("empty step");
  for (const StepItem& item : items) {
    auto it = seqs_.find(item.id);
    if (it == seqs_.end()) {
      return absl::NotFoundError(absl::StrCat("no sequence ", item.id));
    }
    const Sequence& s = it->second;
    if (s.awaiting_transfer) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", item.id, " is waiting for its KV transfer"));
    }
    if (item.num_tokens <= 0 || s.num_computed + item.num_tokens >
                                    static_cast<int64_t>(s.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", item.id, " has ", s.tokens.size() - s.num_computed,
          " tokens to compute, asked for ", item.num_tokens));
    }
  }
  for (const StepItem& item : items) {
    const Sequence& s = seqs_[item.id];
    PD_RETURN_IF_ERROR(
        blocks_->Reserve(item.id, s.num_computed + item.num_tokens));
  }
  ForwardBatch& batch = batch_;
  batch.chunks.clear();
  batch.on_layer_done = on_layer_done;
  if (items.size() > table_scratch_.size()) {
    const size_t old_size = table_scratch_.size();
    table_scratch_.resize(items.size());
    // Room for a whole context's table: a copy one block longer than the
    // last step's then allocates nothing.
    for (size_t i = old_size; i < items.size(); ++i) {
      table_scratch_[i].reserve(MaxSequenceBlocks());
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& item = items[i];
    const Sequence& s = seqs_[item.id];
    blocks_->CopyBlockTable(item.id, &table_scratch_[i]);
    SequenceChunk chunk;
    chunk.tokens =
        absl::MakeConstSpan(s.tokens).subspan(s.num_computed, item.num_tokens);
    chunk.start_pos = s.num_computed;
    chunk.block_table = table_scratch_[i];
    chunk.logits = item.logits;
    chunk.prompt_length = s.prompt_length;
    chunk.attention_sinks = options_.attention_sinks;
    chunk.sink_window = options_.sink_window;
    batch.chunks.push_back(chunk);
  }
  const absl::Status forward = backend_->Forward(batch, logits);
  batch.on_layer_done = nullptr;  // holds references into the caller
  PD_RETURN_IF_ERROR(forward);
  if (options_.testing_pass_delay > absl::ZeroDuration() ||
      options_.testing_token_delay > absl::ZeroDuration()) {
    int64_t tokens = 0;
    for (const StepItem& item : items) tokens += item.num_tokens;
    absl::SleepFor(options_.testing_pass_delay +
                   tokens * options_.testing_token_delay);
  }
  for (const StepItem& item : items) {
    Sequence& s = seqs_[item.id];
    s.num_computed += item.num_tokens;
    // A draft's positions wait for ResolveDraft (see AppendDraft).
    const int32_t verified = std::min(
        s.num_computed, static_cast<int32_t>(s.tokens.size()) - s.num_draft);
    PD_RETURN_IF_ERROR(blocks_->MarkComputed(item.id, s.tokens, verified));
    PD_RETURN_IF_ERROR(FreeBlocksOutOfWindow(item.id, s));
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::FreeBlocksOutOfWindow(SeqId id, Sequence& s) {
  if ((!streaming() && model_.config().sliding_window == 0) ||
      s.num_computed <= s.registered_length) {
    return absl::OkStatus();
  }
  // Queries to come are at positions >= next. A layer's attended set
  // (engine/forward_backend.h) only moves forward as the query does: its
  // window starts no earlier, and its sinks end no earlier but never past
  // attention_sinks. So every key position that a query at `next` or later
  // attends lies in [sink_begin, attention_sinks) or [recent_begin, ...)
  // of `next`'s set; the union over layers is kept, whole blocks outside it
  // are freed.
  // A pending draft may be rolled back: the next query can be as early as
  // its first position.
  const int32_t next = std::min(
      s.num_computed, static_cast<int32_t>(s.tokens.size()) - s.num_draft);
  const model::ModelConfig& c = model_.config();
  int32_t sink_begin = INT32_MAX, recent_begin = INT32_MAX;
  for (int l = 0; l < c.num_layers; ++l) {
    const AttendedKeys k = KeysAttended(
        next, c.LayerWindow(l), options_.attention_sinks, options_.sink_window);
    sink_begin = std::min(sink_begin, k.sink_begin);
    recent_begin = std::min(recent_begin, k.recent_begin);
  }
  const int32_t sink_end =
      std::max(sink_begin, std::min(options_.attention_sinks, recent_begin));
  const int32_t bs = options_.block_size;
  // Blocks wholly below the sinks' start, and wholly between the sinks'
  // end and the recent window's start.
  // Both ranges only grow (the gap's start stops at the sinks' last block):
  // each step frees only what is new since the last.
  const int32_t low_end = sink_begin / bs;
  if (low_end > s.freed_low_end) {
    PD_RETURN_IF_ERROR(
        blocks_->FreeBlocks(id, s.freed_low_end, low_end).status());
    s.freed_low_end = low_end;
  }
  const int32_t gap_first = std::max((sink_end + bs - 1) / bs, s.freed_gap_end);
  const int32_t gap_end = recent_begin / bs;
  if (gap_end > gap_first) {
    PD_RETURN_IF_ERROR(blocks_->FreeBlocks(id, gap_first, gap_end).status());
    s.freed_gap_end = gap_end;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModelRunner::PrefillOutput>> ModelRunner::Prefill(
    absl::Span<const PrefillInput> inputs, const LayerCallback& on_layer_done) {
  std::vector<PrefillOutput> outputs(inputs.size());
  std::vector<SeqId> registered;
  auto fail = [&](absl::Status s) {
    for (SeqId id : registered) Release(id);
    return s;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    absl::StatusOr<int32_t> cached =
        AddSequence(inputs[i].id, inputs[i].prompt);
    if (!cached.ok()) return fail(cached.status());
    registered.push_back(inputs[i].id);
    outputs[i].id = inputs[i].id;
    outputs[i].prompt_tokens = static_cast<int32_t>(inputs[i].prompt.size());
    outputs[i].cached_tokens = *cached;
  }
  for (const PrefillInput& in : inputs) {
    absl::Status s = blocks_->Reserve(in.id, in.prompt.size());
    if (!s.ok()) return fail(s);
  }
  // Pack chunks into passes of at most max_batch_tokens new tokens; a
  // prompt's last chunk asks for logits.
  size_t next = 0;
  std::vector<StepItem> items;
  std::vector<size_t> finishing;  // output index of each logits row
  std::vector<float> logits;
  while (next < inputs.size()) {
    items.clear();
    finishing.clear();
    int32_t budget = options_.max_batch_tokens;
    for (size_t i = next; i < inputs.size() && budget > 0; ++i) {
      const Sequence& s = seqs_[inputs[i].id];
      const int32_t remaining =
          static_cast<int32_t>(s.tokens.size()) - s.num_computed;
      const int32_t n = std::min(remaining, budget);
      const bool last = n == remaining;
      items.push_back(
          {inputs[i].id, n, last ? LogitsMode::kLast : LogitsMode::kNone});
      if (last) finishing.push_back(i);
      budget -= n;
    }
    absl::Status s = Run(items, &logits, on_layer_done);
    if (!s.ok()) return fail(s);
    for (size_t r = 0; r < finishing.size(); ++r) {
      outputs[finishing[r]].logits.assign(
          logits.begin() + r * vocab_size(),
          logits.begin() + (r + 1) * vocab_size());
    }
    while (next < inputs.size()) {
      const Sequence& s = seqs_[inputs[next].id];
      if (s.num_computed < static_cast<int32_t>(s.tokens.size())) break;
      ++next;
    }
  }
  return outputs;
}

absl::StatusOr<ModelRunner::TransferTarget> ModelRunner::ReserveForTransfer(
    SeqId id, absl::Span<const int32_t> prompt) {
  PD_ASSIGN_OR_RETURN(int32_t cached, AddSequence(id, prompt));
  absl::Status reserved = blocks_->Reserve(id, prompt.size());
  if (!reserved.ok()) {
    Release(id);
    return reserved;
  }
  seqs_[id].awaiting_transfer = true;
  TransferTarget target;
  target.cached_tokens = cached;
  target.blocks = blocks_->CopyBlockTable(id);
  return target;
}

absl::Status ModelRunner::CompleteTransfer(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("no sequence ", id));
  }
  Sequence& s = it->second;
  if (!s.awaiting_transfer) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", id, " has no transfer pending"));
  }
  s.awaiting_transfer = false;
  s.num_computed = static_cast<int32_t>(s.tokens.size());
  return blocks_->MarkComputed(id, s.tokens, s.num_computed);
}

absl::Status ModelRunner::Decode(absl::Span<const SeqId> ids,
                                 absl::Span<const int32_t> tokens,
                                 std::vector<float>* logits) {
  if (ids.size() != tokens.size() || ids.empty()) {
    return absl::InvalidArgumentError(
        "Decode needs one token for each of at least one sequence");
  }
  // Reserve first, so a full cache leaves every sequence as it was.
  for (SeqId id : ids) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) {
      return absl::NotFoundError(absl::StrCat("no sequence ", id));
    }
    if (it->second.num_computed !=
        static_cast<int32_t>(it->second.tokens.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", id, " still has prompt tokens to prefill"));
    }
    // Checked here too (AppendToken checks again), so that a full context
    // takes no block past it.
    if (static_cast<int64_t>(it->second.tokens.size()) >= sequence_limit()) {
      return absl::OutOfRangeError(
          absl::StrCat("sequence ", id, " has reached the context length ",
                       context_length()));
    }
    PD_RETURN_IF_ERROR(blocks_->Reserve(id, it->second.tokens.size() + 1));
  }
  std::vector<StepItem>& items = step_items_;
  items.clear();
  for (size_t i = 0; i < ids.size(); ++i) {
    PD_RETURN_IF_ERROR(AppendToken(ids[i], tokens[i]));
    items.push_back({ids[i], 1, LogitsMode::kLast});
  }
  return Run(items, logits);
}

}  // namespace pdserve::engine
