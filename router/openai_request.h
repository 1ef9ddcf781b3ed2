// OpenAI-compatible request bodies -> pdserve client protos
// (proto/client.proto, proto/common.proto), for the router's HTTP front end.
// The answers go the other way in router/openai_response.h.
//
// Pure translation: no I/O, no clocks, no threads. Requests are parsed into a
// v1::GenerateRequest (or v1::TokenizeRequest) and checked for types and
// ranges, so a bad value is a 400 whose message names the OpenAI parameter.
//
// Field coverage: every OpenAI request field is implemented, refused with a
// 400 naming it, or accepted and ignored for a stated reason; the table is in
// docs/openai_api.md, which this file must keep true. Fields OpenAI does not
// define are ignored, as vLLM's server does; of vLLM's extensions top_k,
// min_p, repetition_penalty, ignore_eos, stop_token_ids,
// continue_final_message, priority and request_id are understood; "timeout"
// (seconds) is a pdserve extension.
//
// Thread-safety: the functions are thread-safe.
#ifndef PDSERVE_ROUTER_OPENAI_REQUEST_H_
#define PDSERVE_ROUTER_OPENAI_REQUEST_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/client.pb.h"

namespace pdserve::router {

// Which OpenAI endpoint a request came from / a response is for.
enum class OpenAiKind {
  kCompletion,  // POST /v1/completions
  kChat,        // POST /v1/chat/completions
};

// A parsed OpenAI request.
struct OpenAiRequest {
  OpenAiKind kind = OpenAiKind::kCompletion;
  // What to ask ClientApi::Generate. stream_options.include_usage is always
  // true for non-streaming requests (the body reports usage) and the
  // client's stream_options.include_usage for streaming ones.
  v1::GenerateRequest generate;
  // "stream".
  bool stream = false;
  // "stream_options.include_usage" as the client sent it.
  bool include_usage = false;
  // Whether the response carries logprobs: completions "logprobs" present
  // (an integer 0..20), chat "logprobs": true. The number of alternatives
  // is generate.sampling().top_logprobs().
  bool logprobs = false;
  // "timeout": the pdserve extension bounding the whole request, in seconds
  // (a positive number). Absent: the front end's default.
  std::optional<absl::Duration> timeout;
};

// max_tokens of a /v1/completions request that sets none: OpenAI's legacy
// completions and vLLM both default to 16. (Chat, like both of them, runs to
// the end of the context.)
inline constexpr uint32_t kDefaultCompletionMaxTokens = 16;

// Parses a POST /v1/completions body. Errors are INVALID_ARGUMENT, with a
// message naming the offending parameter; batched prompts, n > 1, best_of > 1,
// echo and suffix are refused as unsupported. logit_bias keys must be decimal
// token ids and its values numbers in [-100, 100]; whether an id is in the
// vocabulary is checked by the router, which knows the model.
absl::StatusOr<OpenAiRequest> ParseCompletionRequest(absl::string_view body);

// Parses a POST /v1/chat/completions body. Errors as above. Every message
// needs a "content": a string, an array of {"type": "text", "text": ...}
// parts (joined with "\n" as vLLM does; other part types are refused), or,
// for an assistant message only, null (taken as empty, as vLLM does). Tool
// calling (tools, tool_choice other than "none", a message's tool_calls or
// tool_call_id), structured output (response_format other than text), audio
// and store: true are refused.
absl::StatusOr<OpenAiRequest> ParseChatCompletionRequest(
    absl::string_view body);

// Parses a vLLM-style POST /tokenize body: {"model", "prompt"} or
// {"model", "messages", "continue_final_message"}, plus an optional
// "add_special_tokens" boolean. Errors are INVALID_ARGUMENT.
absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(
    absl::string_view body);

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_OPENAI_REQUEST_H_
