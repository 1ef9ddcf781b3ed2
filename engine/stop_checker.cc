#include "engine/stop_checker.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pdserve::engine {
namespace {

// Length of the sequence a UTF-8 lead byte announces; 0 for continuation
// bytes and for bytes that never start a valid sequence (0xC0, 0xC1,
// 0xF5..0xFF), which are passed through rather than held forever.
int Utf8SequenceLength(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Bytes at the end of `s` forming the start of a multi-byte character whose
// remaining bytes have not arrived yet; 0 if `s` ends on a boundary.
size_t IncompleteUtf8Tail(absl::string_view s) {
  const size_t n = s.size();
  // A 4-byte sequence missing its last byte is the longest incomplete tail.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char b = static_cast<unsigned char>(s[n - back]);
    if (IsContinuation(b)) continue;
    const int len = Utf8SequenceLength(b);
    return len > static_cast<int>(back) ? back : 0;
  }
  return 0;
}

}  // namespace

StopChecker::StopChecker(std::vector<std::string> stop_strings) {
  for (std::string& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

size_t StopChecker::HoldBack() const {
  const absl::string_view pending = pending_;
  size_t hold = IncompleteUtf8Tail(pending);
  for (const std::string& stop : stops_) {
    // Longest proper prefix of `stop` that `pending` ends with; anything
    // longer than the current hold is worth checking.
    const size_t longest = std::min(stop.size() - 1, pending.size());
    for (size_t k = longest; k > hold; --k) {
      if (pending.substr(pending.size() - k) ==
          absl::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

StopChecker::FeedResult StopChecker::Feed(absl::string_view chunk) {
  FeedResult result;
  result.stopped = stopped_;
  if (stopped_ || finished_) return result;
  pending_.append(chunk.data(), chunk.size());

  // Emitted text never holds the start of a possible match (it was not a
  // prefix of any stop string), so every match starts inside pending_.
  size_t match = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& stop : stops_) {
    const size_t at = pending_.find(stop);
    if (at < match) {
      match = at;
      matched = &stop;
    }
  }
  if (match != std::string::npos) {
    matched_ = *matched;
    result.text = pending_.substr(0, match);
    result.stopped = stopped_ = true;
    pending_.clear();
    pending_.shrink_to_fit();
    return result;
  }
  const size_t emit = pending_.size() - HoldBack();
  result.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return result;
}

std::string StopChecker::Flush() {
  if (stopped_ || finished_) return "";
  finished_ = true;
  return std::exchange(pending_, std::string());
}

StopTokenChecker::StopTokenChecker(const SamplingParams& params,
                                   absl::Span<const uint32_t> eos_token_ids,
                                   uint32_t context_length)
    : max_tokens_(params.max_tokens), context_length_(context_length) {
  if (!params.ignore_eos) {
    stop_tokens_.insert(eos_token_ids.begin(), eos_token_ids.end());
  }
  stop_tokens_.insert(params.stop_token_ids.begin(),
                      params.stop_token_ids.end());
}

bool StopTokenChecker::IsStopToken(uint32_t token) const {
  return stop_tokens_.contains(token);
}

FinishReason StopTokenChecker::Check(uint32_t token, uint64_t num_generated,
                                     uint64_t sequence_length) const {
  if (IsStopToken(token)) return FinishReason::kStop;
  if (max_tokens_.has_value() && num_generated >= *max_tokens_) {
    return FinishReason::kLength;
  }
  // No room for another token's KV once the context is full.
  if (sequence_length >= context_length_) return FinishReason::kLength;
  return FinishReason::kNone;
}

}  // namespace pdserve::engine
