// When a sequence stops generating, and which text may be streamed before it
// does.
//
// StopChecker: incremental stop-string detection over streamed text
// (SamplingParams.stop). The caller feeds each newly decoded text chunk;
// Feed returns the text that is safe to emit now. It holds back the longest
// suffix of the pending text that is a proper prefix of some stop string
// (it could still grow into a match), plus a trailing incomplete UTF-8
// sequence (so emitted text never ends inside a character; bytes that can
// never start a valid sequence are passed through). Generation stops as soon
// as the text seen so far contains a stop string: the returned text then
// ends right before the earliest-starting match, and nothing after it is
// ever returned. Flush, at the end of generation, returns whatever was held
// back. Matching is on bytes; for valid UTF-8 that is the same as matching
// characters, since UTF-8 never matches in the middle of a character.
//
// Because stopping happens at the first chunk whose text contains a match,
// the outcome can depend on chunking when stop strings overlap: with stops
// "b" and "abc", the chunks "ab", "c" stop after "ab" (returning "a"), while
// the single chunk "abc" returns "". This is the streaming semantics of the
// proto ("generation stops when the generated text contains one").
//
// StopTokenChecker: whether a just-generated token ends the sequence: EOS
// tokens (unless ignore_eos) and stop_token_ids give kStop; max_tokens and the
// context length give kLength.
//
// Ownership: both classes own copies of what they are given.
// Thread-safety: none; each belongs to one sequence. StopTokenChecker is
// immutable after construction, so its const methods may run concurrently.
#ifndef PDSERVE_ENGINE_STOP_CHECKER_H_
#define PDSERVE_ENGINE_STOP_CHECKER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/sampler.h"

namespace pdserve::engine {

// Mirrors pdserve.v1.FinishReason for what the engine decides by itself
// (cancellation and errors are the serving layer's).
enum class FinishReason {
  kNone,    // Keep generating.
  kStop,    // EOS, a stop_token_ids entry or a stop string.
  kLength,  // max_tokens reached or the context is full.
};

class StopChecker {
 public:
  struct FeedResult {
    // Text to emit now (possibly empty).
    std::string text;
    // A stop string matched; `text` ends right before it, and later Feed /
    // Flush calls return nothing.
    bool stopped = false;
  };

  // Empty strings are ignored (ValidateSamplingParams rejects them; here
  // they would match everywhere). With no stop strings, text passes through
  // as soon as it is complete UTF-8.
  explicit StopChecker(std::vector<std::string> stop_strings);

  FeedResult Feed(absl::string_view chunk);

  // Returns the held-back text and ends the stream (later calls return
  // nothing). Empty after a stop.
  std::string Flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched (the earliest-starting one; the first
  // listed among those starting there); empty until stopped().
  const std::string& matched_stop() const { return matched_; }

 private:
  // Bytes at the end of pending_ that could still become part of a match or
  // complete a character.
  size_t HoldBack() const;

  std::vector<std::string> stops_;
  // Fed but not yet emitted. Never contains a complete stop string.
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
  bool finished_ = false;
};

class StopTokenChecker {
 public:
  // `eos_token_ids`: the model's end-of-generation tokens (ignored when
  // params.ignore_eos). `context_length`: the model's maximum sequence length
  // (prompt + generated), in tokens; a sequence that reaches it stops with
  // kLength (0 would stop every sequence after its first token).
  StopTokenChecker(const SamplingParams& params,
                   absl::Span<const uint32_t> eos_token_ids,
                   uint32_t context_length);

  // Whether `token` ends generation by itself (EOS or stop_token_ids).
  bool IsStopToken(uint32_t token) const;

  // Called after `token` has been generated. `num_generated` counts the
  // request's generated tokens including this one (delivered tokens only,
  // as max_tokens is defined); `sequence_length` is prompt + generated
  // tokens including this one. A stop token wins over a length limit
  // reached by the same token (it is then the natural end).
  FinishReason Check(uint32_t token, uint64_t num_generated,
                     uint64_t sequence_length) const;

 private:
  absl::flat_hash_set<uint32_t> stop_tokens_;
  std::optional<uint32_t> max_tokens_;
  uint32_t context_length_;
};

}  // namespace pdserve::engine

#endif  // PDSERVE_ENGINE_STOP_CHECKER_H_
