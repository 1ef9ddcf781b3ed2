#include "worker/speculative_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

namespace pdserve::worker {

// --speculative_method's value; a bad one is refused when flags are parsed.
struct SpeculativeMethodFlag {
  engine::SpeculativeOptions::Method method =
      engine::SpeculativeOptions::Method::kNone;
};

bool AbslParseFlag(absl::string_view text, SpeculativeMethodFlag* flag,
                   std::string* error) {
  using Method = engine::SpeculativeOptions::Method;
  if (text == "off" || text.empty()) {
    flag->method = Method::kNone;
  } else if (text == "ngram") {
    flag->method = Method::kNgram;
  } else if (text == "draft_model") {
    flag->method = Method::kDraftModel;
  } else {
    *error = "expected off, ngram or draft_model";
    return false;
  }
  return true;
}

std::string SpeculativeMethodName(engine::SpeculativeOptions::Method method) {
  switch (method) {
    case engine::SpeculativeOptions::Method::kNgram:
      return "ngram";
    case engine::SpeculativeOptions::Method::kDraftModel:
      return "draft_model";
    case engine::SpeculativeOptions::Method::kNone:
      break;
  }
  return "";
}

std::string AbslUnparseFlag(const SpeculativeMethodFlag& flag) {
  const std::string name = SpeculativeMethodName(flag.method);
  return name.empty() ? "off" : name;
}

}  // namespace pdserve::worker

ABSL_FLAG(pdserve::worker::SpeculativeMethodFlag, speculative_method, {},
          "speculative decoding: off (default), ngram (prompt lookup: "
          "drafts what follows an earlier occurrence of the last tokens) or "
          "draft_model (--draft_model drafts)");
ABSL_FLAG(int32_t, num_speculative_tokens, 6,
          "most tokens drafted per sequence and step");
ABSL_FLAG(bool, speculative_adaptive, true,
          "draft length follows each sequence's acceptance rate (pausing "
          "where drafts keep failing)");
ABSL_FLAG(int32_t, speculative_disable_by_batch_size, 0,
          "no drafting in a step whose running batch has at least this many "
          "sequences (0: no limit)");
ABSL_FLAG(int32_t, prompt_lookup_min, 3,
          "ngram: shortest suffix looked up in the sequence");
ABSL_FLAG(int32_t, prompt_lookup_max, 6,
          "ngram: longest suffix looked up in the sequence");
ABSL_FLAG(std::string, draft_model, "",
          "draft_model: GGUF file of the draft model (same tokenizer as the "
          "served model)");
ABSL_FLAG(int32_t, draft_kv_cache_mb, 64,
          "draft_model: the draft model's KV cache in MiB");

namespace pdserve::worker {

absl::Status SpeculativeOptionsFromFlags(
    engine::SpeculativeOptions* options,
    std::unique_ptr<model::Model>* draft_model) {
  options->method = absl::GetFlag(FLAGS_speculative_method).method;
  options->num_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  options->adaptive = absl::GetFlag(FLAGS_speculative_adaptive);
  options->disable_by_batch_size =
      absl::GetFlag(FLAGS_speculative_disable_by_batch_size);
  options->ngram.min_ngram = absl::GetFlag(FLAGS_prompt_lookup_min);
  options->ngram.max_ngram = absl::GetFlag(FLAGS_prompt_lookup_max);
  options->draft_kv_cache_bytes =
      int64_t{absl::GetFlag(FLAGS_draft_kv_cache_mb)} << 20;
  if (options->method == engine::SpeculativeOptions::Method::kNone) {
    return absl::OkStatus();
  }
  if (options->num_tokens <= 0 || options->num_tokens > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_speculative_tokens must be in [1, 64], got ",
                     options->num_tokens));
  }
  if (options->method != engine::SpeculativeOptions::Method::kDraftModel) {
    return absl::OkStatus();
  }
  const std::string path = absl::GetFlag(FLAGS_draft_model);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "--speculative_method=draft_model needs --draft_model=FILE.gguf");
  }
  absl::StatusOr<std::unique_ptr<model::Model>> opened =
      model::Model::Open(path);
  if (!opened.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--draft_model: ", opened.status().message()));
  }
  *draft_model = *std::move(opened);
  options->draft_model = draft_model->get();
  return absl::OkStatus();
}

}  // namespace pdserve::worker
