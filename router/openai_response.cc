#include "router/openai_response.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pdserve::router {
namespace {

using json = nlohmann::json;

// JSON has no -inf; vLLM reports this instead.
constexpr double kMinLogprob = -9999.0;

// Serializes without throwing: invalid UTF-8 (which the protos promise not
// to carry in text fields) is replaced with U+FFFD instead of raising.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      // vLLM reports "abort" for aborted requests; the client sees the
      // output was cut short instead of a stream that merely ends.
      return "abort";
    default:
      return nullptr;
  }
}

json FinishReasonJson(v1::FinishReason reason) {
  const char* name = FinishReasonName(reason);
  return name == nullptr ? json(nullptr) : json(name);
}

// vLLM's "stop_reason": the stop string or stop token id that matched, else
// null.
json StopReasonJson(const v1::GenerateResponse* chunk) {
  if (chunk == nullptr) return nullptr;
  switch (chunk->matched_stop_case()) {
    case v1::GenerateResponse::kStopTokenId:
      return chunk->stop_token_id();
    case v1::GenerateResponse::kStopString:
      return chunk->stop_string();
    default:
      return nullptr;
  }
}

double LogprobValue(float logprob) {
  if (std::isnan(logprob)) return kMinLogprob;
  return std::max(static_cast<double>(logprob), kMinLogprob);
}

json BytesJson(const std::string& bytes) {
  json out = json::array();
  for (unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

// Code points in `bytes` (UTF-8 lead and ASCII bytes), for text_offset.
uint64_t CountCodePoints(absl::string_view bytes) {
  uint64_t n = 0;
  for (unsigned char c : bytes) n += (c & 0xC0) != 0x80;
  return n;
}

json UsageJson(const v1::Usage& usage) {
  return {
      {"prompt_tokens", usage.prompt_tokens()},
      {"completion_tokens", usage.completion_tokens()},
      {"total_tokens", static_cast<uint64_t>(usage.prompt_tokens()) +
                           usage.completion_tokens()},
      {"prompt_tokens_details",
       {{"cached_tokens", usage.cached_prompt_tokens()}}},
  };
}

const char* ErrorType(int http_status, absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kResourceExhausted:
      return "rate_limit_exceeded";
    case absl::StatusCode::kUnavailable:
      return "service_unavailable";
    default:
      break;
  }
  switch (http_status) {
    case 400:
      return "invalid_request_error";
    case 404:
      return "not_found_error";
    case 409:
      return "conflict_error";
    case 499:
      return "cancelled";
    case 501:
      return "not_implemented";
    case 504:
      return "timeout";
    default:
      return "internal_error";
  }
}

}  // namespace

std::string TokenizeBody(const v1::TokenizeResponse& response) {
  json tokens = json::array();
  for (uint32_t id : response.token_ids()) tokens.push_back(id);
  return Dump({{"tokens", std::move(tokens)},
               {"count", response.token_ids_size()},
               {"max_model_len", response.context_length()}});
}

std::string ResponseId(OpenAiKind kind, absl::string_view request_id) {
  return absl::StrCat(kind == OpenAiKind::kChat ? "chatcmpl-" : "cmpl-",
                      request_id);
}

OpenAiStreamFormatter::OpenAiStreamFormatter(OpenAiResponseOptions options)
    : options_(std::move(options)) {}

void OpenAiStreamFormatter::Accumulate(const v1::GenerateResponse& chunk) {
  text_ += chunk.text();
  num_tokens_ += chunk.token_ids_size();
  if (options_.logprobs) {
    for (const v1::TokenLogprob& lp : chunk.logprobs()) {
      TokenRecord record;
      record.text = lp.text();
      record.bytes = lp.raw_bytes().empty() ? lp.text() : lp.raw_bytes();
      record.logprob = lp.logprob();
      record.top.assign(lp.top_logprobs().begin(), lp.top_logprobs().end());
      text_offsets_.push_back(text_offset_);
      text_offset_ += CountCodePoints(record.bytes);
      tokens_.push_back(std::move(record));
    }
  }
  if (chunk.has_usage()) {
    has_usage_ = true;
    usage_ = chunk.usage();
  }
  if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = chunk.finish_reason();
    last_chunk_ = chunk;
  }
}

namespace {

// Completions logprobs for tokens [begin, end).
template <typename Record>
json CompletionLogprobs(const std::vector<Record>& tokens,
                        const std::vector<uint64_t>& offsets, size_t begin,
                        size_t end) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (size_t i = begin; i < end; ++i) {
    const Record& t = tokens[i];
    out["tokens"].push_back(t.text);
    out["token_logprobs"].push_back(LogprobValue(t.logprob));
    // OpenAI: the sampled token is always included, so a dict may hold
    // logprobs + 1 entries.
    json top = json::object();
    for (const v1::TopLogprob& alt : t.top) {
      if (!top.contains(alt.text())) {
        top[alt.text()] = LogprobValue(alt.logprob());
      }
    }
    if (!top.contains(t.text)) top[t.text] = LogprobValue(t.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offsets[i]);
  }
  return out;
}

// Chat logprobs for tokens [begin, end).
template <typename Record>
json ChatLogprobs(const std::vector<Record>& tokens, size_t begin, size_t end) {
  json content = json::array();
  for (size_t i = begin; i < end; ++i) {
    const Record& t = tokens[i];
    json top = json::array();
    for (const v1::TopLogprob& alt : t.top) {
      top.push_back(
          {{"token", alt.text()},
           {"logprob", LogprobValue(alt.logprob())},
           {"bytes", BytesJson(alt.raw_bytes().empty() ? alt.text()
                                                       : alt.raw_bytes())}});
    }
    content.push_back({{"token", t.text},
                       {"logprob", LogprobValue(t.logprob)},
                       {"bytes", BytesJson(t.bytes)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

}  // namespace

std::vector<std::string> OpenAiStreamFormatter::OnChunk(
    const v1::GenerateResponse& chunk) {
  size_t first_token = tokens_.size();
  Accumulate(chunk);
  std::vector<std::string> events;
  bool finished = chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  bool has_logprobs = options_.logprobs && tokens_.size() > first_token;
  if (!chunk.text().empty() || has_logprobs || finished) {
    events.push_back(ChunkJson(chunk, first_token));
  }
  if (finished && options_.include_usage) events.push_back(UsageChunkJson());
  return events;
}

std::string OpenAiStreamFormatter::ChunkJson(const v1::GenerateResponse& chunk,
                                             size_t first_token) {
  bool chat = options_.kind == OpenAiKind::kChat;
  bool finished = chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  json choice = {{"index", 0}};
  if (chat) {
    json delta = json::object();
    if (!sent_role_) {
      delta["role"] = "assistant";
      sent_role_ = true;
      delta["content"] = chunk.text();
    } else if (!chunk.text().empty()) {
      delta["content"] = chunk.text();
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = chunk.text();
  }
  if (!options_.logprobs) {
    choice["logprobs"] = nullptr;
  } else if (chat) {
    choice["logprobs"] = ChatLogprobs(tokens_, first_token, tokens_.size());
  } else {
    choice["logprobs"] =
        CompletionLogprobs(tokens_, text_offsets_, first_token, tokens_.size());
  }
  choice["finish_reason"] = FinishReasonJson(chunk.finish_reason());
  choice["stop_reason"] = StopReasonJson(finished ? &chunk : nullptr);
  json out = {{"id", options_.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", options_.created_unix_s},
              {"model", options_.model},
              {"choices", json::array({std::move(choice)})}};
  if (options_.include_usage) out["usage"] = nullptr;
  return Dump(out);
}

std::string OpenAiStreamFormatter::UsageChunkJson() const {
  bool chat = options_.kind == OpenAiKind::kChat;
  v1::Usage usage = usage_;
  if (!has_usage_) usage.set_completion_tokens(num_tokens_);
  return Dump({{"id", options_.id},
               {"object", chat ? "chat.completion.chunk" : "text_completion"},
               {"created", options_.created_unix_s},
               {"model", options_.model},
               {"choices", json::array()},
               {"usage", UsageJson(usage)}});
}

std::string OpenAiStreamFormatter::Final() const {
  bool chat = options_.kind == OpenAiKind::kChat;
  json choice = {{"index", 0}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  if (!options_.logprobs) {
    choice["logprobs"] = nullptr;
  } else if (chat) {
    choice["logprobs"] = ChatLogprobs(tokens_, 0, tokens_.size());
  } else {
    choice["logprobs"] =
        CompletionLogprobs(tokens_, text_offsets_, 0, tokens_.size());
  }
  choice["finish_reason"] = FinishReasonJson(finish_reason_);
  choice["stop_reason"] =
      StopReasonJson(last_chunk_.has_value() ? &*last_chunk_ : nullptr);
  v1::Usage usage = usage_;
  if (!has_usage_) usage.set_completion_tokens(num_tokens_);
  return Dump({{"id", options_.id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", options_.created_unix_s},
               {"model", options_.model},
               {"choices", json::array({std::move(choice)})},
               {"usage", UsageJson(usage)}});
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
      return 409;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

std::string ErrorBody(const absl::Status& status) {
  int http_status = HttpStatusFor(status.code());
  return ErrorBody(http_status, ErrorType(http_status, status.code()),
                   status.message());
}

std::string ErrorBody(int http_status, absl::string_view type,
                      absl::string_view message) {
  return Dump({{"error",
                {{"message", message},
                 {"type", type},
                 {"param", nullptr},
                 {"code", http_status}}}});
}

std::string ModelsBody(const v1::ListModelsResponse& response) {
  json data = json::array();
  for (const v1::ModelInfo& model : response.models()) {
    data.push_back({{"id", model.id()},
                    {"object", "model"},
                    {"created", model.created_unix_s()},
                    {"owned_by", model.owned_by()},
                    {"max_model_len", model.context_length()}});
  }
  return Dump({{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace pdserve::router
