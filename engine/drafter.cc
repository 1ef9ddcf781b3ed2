#include "engine/drafter.h"

#include <algorithm>

namespace pdserve::engine {

std::vector<int32_t> PromptLookup(absl::Span<const int32_t> tokens,
                                  int32_t max_tokens, int32_t min_ngram,
                                  int32_t max_ngram) {
  const int32_t size = static_cast<int32_t>(tokens.size());
  for (int32_t n = std::min(max_ngram, size - 1); n >= std::max(min_ngram, 1);
       --n) {
    const absl::Span<const int32_t> suffix = tokens.subspan(size - n, n);
    // Most recent occurrence first: recent text predicts the next tokens
    // best (and an edit's source usually precedes its rewrite closely).
    for (int32_t start = size - n - 1; start >= 0; --start) {
      if (tokens[start] != suffix[0] ||
          !std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) {
        continue;
      }
      const int32_t from = start + n;
      const int32_t count = std::min(max_tokens, size - from);
      return std::vector<int32_t>(tokens.begin() + from,
                                  tokens.begin() + from + count);
    }
  }
  return {};
}

absl::Status NgramDrafter::Propose(absl::Span<DraftJob> jobs) {
  for (DraftJob& job : jobs) {
    job.draft = PromptLookup(job.tokens, job.max_tokens, options_.min_ngram,
                             options_.max_ngram);
    job.probs.clear();
  }
  return absl::OkStatus();
}

int32_t DraftLength::Next() {
  if (paused_for_ > 0) {
    --paused_for_;
    return 0;
  }
  return next_;
}

void DraftLength::Record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  constexpr double kWeight = 0.25;  // about the last four verifications
  acceptance_ = (1 - kWeight) * acceptance_ +
                kWeight * static_cast<double>(accepted) / drafted;
  if (!options_.adaptive) return;
  next_ = accepted == drafted ? std::min(options_.max_tokens, drafted + 1)
                              : std::max(1, accepted + 1);
  if (acceptance_ < options_.min_acceptance) {
    paused_for_ = options_.pause_steps;
    next_ = 1;
    // Start the next trial from the threshold, so one more miss pauses
    // again and one hit resumes.
    acceptance_ = options_.min_acceptance;
  }
}

}  // namespace pdserve::engine
