// OpenAI-compatible JSON <-> pdserve client protos (proto/client.proto,
// proto/common.proto), for the router's HTTP front end.
//
// Pure translation: no I/O, no clocks, no threads. Requests are parsed into a
// v1::GenerateRequest (or v1::TokenizeRequest) and checked for types and
// ranges, so a bad value is a 400 whose message names the OpenAI parameter;
// responses are formatted from v1::GenerateResponse chunks into OpenAI
// completion / chat.completion bodies and streaming chunks (the JSON payloads
// of SSE events; the "data: " framing is the caller's).
//
// Field coverage: every OpenAI request field is implemented, refused with a
// 400 naming it, or accepted and ignored for a stated reason; the table is in
// docs/openai_api.md, which this file must keep true. Fields OpenAI does not
// define are ignored, as vLLM's server does; of vLLM's extensions top_k,
// min_p, repetition_penalty, ignore_eos, stop_token_ids,
// continue_final_message, priority and request_id are understood; "timeout"
// (seconds) is a pdserve extension.
//
// Thread-safety: the free functions are thread-safe. An OpenAiStreamFormatter
// is used by one thread at a time (one per request).
#ifndef PDSERVE_ROUTER_OPENAI_API_H_
#define PDSERVE_ROUTER_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

// The /tokenize response: {"tokens": [...], "count": N, "max_model_len": L}.
std::string TokenizeBody(const v1::TokenizeResponse& response);

// The OpenAI response id for a request id: "cmpl-<id>" or "chatcmpl-<id>".
std::string ResponseId(OpenAiKind kind, absl::string_view request_id);

// What an OpenAiStreamFormatter writes into every response.
struct OpenAiResponseOptions {
  OpenAiKind kind = OpenAiKind::kCompletion;
  // Response "id", e.g. ResponseId(kind, request_id).
  std::string id;
  // Response "model".
  std::string model;
  // Response "created", Unix seconds.
  int64_t created_unix_s = 0;
  // Streaming: whether a final chunk with empty choices carries usage (and
  // every other chunk "usage": null), as OpenAI's
  // stream_options.include_usage. Final() always reports usage.
  bool include_usage = false;
  // Whether choices carry logprobs (OpenAiRequest::logprobs).
  bool logprobs = false;
};

// Turns the chunks of one generation into OpenAI streaming chunks and/or the
// non-streaming response body.
//
// Finish reasons: STOP -> "stop", LENGTH -> "length", CANCELLED -> "abort"
// (what vLLM reports for an aborted request, so a client sees that the
// output was cut short rather than a stream that just ends), anything else
// -> null. Logprob values of -inf (not representable in JSON) are reported
// as -9999.0, as vLLM does.
class OpenAiStreamFormatter {
 public:
  explicit OpenAiStreamFormatter(OpenAiResponseOptions options);

  // Records `chunk` for Final() and returns the SSE payloads it produces,
  // in order: none for a chunk with no text, no logprobs and no finish
  // reason (e.g. tokens whose text is held back); one chunk object
  // otherwise; plus, on the last chunk (finish_reason set) when
  // include_usage, the usage chunk with empty choices.
  std::vector<std::string> OnChunk(const v1::GenerateResponse& chunk);

  // Records `chunk` for Final() without formatting it (non-streaming).
  void Accumulate(const v1::GenerateResponse& chunk);

  // The non-streaming response body ("text_completion" or
  // "chat.completion") for everything recorded so far. Usage comes from the
  // last chunk's usage; when no chunk had usage, completion_tokens is the
  // number of tokens seen and prompt_tokens 0.
  std::string Final() const;

 private:
  struct TokenRecord {
    std::string text;   // TokenLogprob.text
    std::string bytes;  // TokenLogprob.raw_bytes
    float logprob = 0;
    std::vector<v1::TopLogprob> top;
  };

  std::string ChunkJson(const v1::GenerateResponse& chunk, size_t first_token);
  std::string UsageChunkJson() const;

  OpenAiResponseOptions options_;
  std::string text_;
  std::vector<TokenRecord> tokens_;
  uint64_t num_tokens_ = 0;
  // Code points of token text before tokens_[i], for text_offset.
  uint64_t text_offset_ = 0;
  std::vector<uint64_t> text_offsets_;
  v1::FinishReason finish_reason_ = v1::FINISH_REASON_UNSPECIFIED;
  std::optional<v1::GenerateResponse> last_chunk_;  // matched_stop, usage
  bool has_usage_ = false;
  v1::Usage usage_;
  bool sent_role_ = false;
};

// The HTTP status for an absl::Status code: INVALID_ARGUMENT, OUT_OF_RANGE,
// FAILED_PRECONDITION 400; NOT_FOUND 404; ALREADY_EXISTS 409;
// RESOURCE_EXHAUSTED 503 (the caller adds Retry-After); UNAVAILABLE 503;
// DEADLINE_EXCEEDED 504; CANCELLED 499 (nginx's "client closed request");
// UNIMPLEMENTED 501; OK 200; anything else 500.
int HttpStatusFor(absl::StatusCode code);

// OpenAI error body for `status`:
//   {"error": {"message", "type", "param": null, "code": <HttpStatusFor>}}
// with type invalid_request_error (400), not_found_error (404),
// conflict_error (409), rate_limit_exceeded (RESOURCE_EXHAUSTED),
// service_unavailable (UNAVAILABLE), timeout (504), cancelled (499),
// not_implemented (501) or internal_error (500).
std::string ErrorBody(const absl::Status& status);

// The same shape for errors that are HTTP-level rather than an
// absl::Status (404 unknown path, 405, 413).
std::string ErrorBody(int http_status, absl::string_view type,
                      absl::string_view message);

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model",
// "created", "owned_by", "max_model_len"}]}.
std::string ModelsBody(const v1::ListModelsResponse& response);

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_OPENAI_API_H_
