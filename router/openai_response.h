// pdserve client protos -> OpenAI-compatible response bodies, for the
// router's HTTP front end: completion / chat.completion bodies and streaming
// chunks (the JSON payloads of SSE events; the "data: " framing is the
// caller's), errors, GET /v1/models and POST /tokenize. Requests go the
// other way in router/openai_request.h.
//
// Pure translation: no I/O, no clocks, no threads.
//
// Thread-safety: the free functions are thread-safe. An OpenAiStreamFormatter
// is used by one thread at a time (one per request).
#ifndef PDSERVE_ROUTER_OPENAI_RESPONSE_H_
#define PDSERVE_ROUTER_OPENAI_RESPONSE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/client.pb.h"
#include "router/openai_request.h"

namespace pdserve::router {

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

#endif  // PDSERVE_ROUTER_OPENAI_RESPONSE_H_
