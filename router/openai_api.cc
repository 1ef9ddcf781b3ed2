#include "router/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve::router {
namespace {

using json = nlohmann::json;

// Limits from proto/common.proto (SamplingParams) and proto/client.proto.
constexpr int kMaxTopLogprobs = 20;
constexpr int kMaxStopStrings = 16;
constexpr int kMinPriority = -100;
constexpr int kMaxPriority = 100;
constexpr double kMaxLogitBias = 100.0;
// JSON has no -inf; vLLM reports this instead.
constexpr double kMinLogprob = -9999.0;

// Serializes without throwing: invalid UTF-8 (which the protos promise not
// to carry in text fields) is replaced with U+FFFD instead of raising.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::Status BadParam(absl::string_view param, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("'", param, "' ", what));
}

absl::StatusOr<json> ParseBody(absl::string_view body) {
  json value;
  try {
    value = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("request body is not valid JSON: ", e.what()));
  }
  if (!value.is_object()) {
    return absl::InvalidArgumentError("request body must be a JSON object");
  }
  return value;
}

// The value of `key` in `object`, or nullptr when absent or null (OpenAI
// clients send null for "use the default").
const json* Find(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<std::string>> GetString(const json& object,
                                                     const char* key) {
  const json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) return BadParam(key, "must be a string");
  return value->get<std::string>();
}

absl::StatusOr<std::optional<bool>> GetBool(const json& object,
                                            const char* key) {
  const json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) return BadParam(key, "must be a boolean");
  return value->get<bool>();
}

absl::StatusOr<std::optional<double>> GetNumber(const json& object,
                                                const char* key) {
  const json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) return BadParam(key, "must be a number");
  return value->get<double>();
}

// An integer that fits int64; a float with an integral value (10.0) is
// accepted, as Python servers do.
std::optional<int64_t> AsInt64(const json& value) {
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    return value.get<int64_t>();
  }
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(v);
  }
  if (value.is_number_float()) {
    double v = value.get<double>();
    // 2^63 is exactly representable; anything >= it does not fit.
    if (std::floor(v) != v || v < -9223372036854775808.0 ||
        v >= 9223372036854775808.0) {
      return std::nullopt;
    }
    return static_cast<int64_t>(v);
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<int64_t>> GetInt(const json& object,
                                              const char* key) {
  const json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  std::optional<int64_t> v = AsInt64(*value);
  if (!v.has_value()) return BadParam(key, "must be an integer");
  return v;
}

// A token id: an integer in [0, 2^32).
std::optional<uint32_t> AsTokenId(const json& value) {
  std::optional<int64_t> v = AsInt64(value);
  if (!v.has_value() || *v < 0 || *v > std::numeric_limits<uint32_t>::max()) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(*v);
}

// Fills `ids` when `value` is a non-empty array of token ids.
bool AsTokenIds(const json& value, v1::TokenIds* ids) {
  if (!value.is_array() || value.empty()) return false;
  for (const json& element : value) {
    std::optional<uint32_t> id = AsTokenId(element);
    if (!id.has_value()) return false;
    ids->add_ids(*id);
  }
  return true;
}

absl::Status ParseCompletionPrompt(const json& body,
                                   v1::GenerateRequest* request) {
  const json* prompt = Find(body, "prompt");
  if (prompt == nullptr) return BadParam("prompt", "is required");
  if (prompt->is_string()) {
    request->set_text(prompt->get<std::string>());
    return absl::OkStatus();
  }
  if (prompt->is_array()) {
    if (prompt->empty()) return BadParam("prompt", "must not be empty");
    const json& first = prompt->front();
    if (first.is_string() || first.is_array()) {
      if (prompt->size() > 1) {
        return BadParam("prompt",
                        "holds several prompts: batched prompts are not "
                        "supported; send one request per prompt");
      }
      if (first.is_string()) {
        request->set_text(first.get<std::string>());
        return absl::OkStatus();
      }
      if (AsTokenIds(first, request->mutable_token_ids())) {
        return absl::OkStatus();
      }
    } else if (AsTokenIds(*prompt, request->mutable_token_ids())) {
      return absl::OkStatus();
    }
  }
  request->clear_prompt();
  return BadParam("prompt",
                  "must be a string, a non-empty array of token ids "
                  "(integers in [0, 2^32)), or an array holding one of those");
}

absl::StatusOr<std::string> ParseContent(const json& content,
                                         const std::string& param) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return BadParam(param, "must be a string or an array of text parts");
  }
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    std::string part_param = absl::StrCat(param, "[", j, "]");
    if (!part.is_object()) return BadParam(part_param, "must be an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text") {
      return BadParam(absl::StrCat(part_param, ".type"),
                      "must be \"text\" (only text content parts are "
                      "supported)");
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return BadParam(absl::StrCat(part_param, ".text"), "must be a string");
    }
    texts.push_back(text->get<std::string>());
  }
  // vLLM joins text parts with newlines when the template takes a string.
  return absl::StrJoin(texts, "\n");
}

absl::Status ParseMessages(const json& body, v1::ChatMessages* chat) {
  const json* messages = Find(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return BadParam("messages", "must be a non-empty array");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    std::string param = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return BadParam(param, "must be an object");
    v1::ChatMessage* out = chat->add_messages();
    auto role = message.find("role");
    if (role == message.end() || !role->is_string() ||
        role->get_ref<const std::string&>().empty()) {
      return BadParam(absl::StrCat(param, ".role"),
                      "must be a non-empty string");
    }
    out->set_role(role->get<std::string>());
    // OpenAI lets only an assistant message go without content, and only
    // when it carries tool_calls, which are refused below. Null content on
    // an assistant message is taken as empty, as vLLM does (clients echo
    // earlier turns back that way); anywhere else it is a mistake.
    auto content = message.find("content");
    if (content == message.end()) {
      return BadParam(absl::StrCat(param, ".content"), "is required");
    }
    if (content->is_null() && out->role() != "assistant") {
      return BadParam(absl::StrCat(param, ".content"),
                      "must not be null (only an assistant message may have "
                      "null content)");
    }
    PD_ASSIGN_OR_RETURN(*out->mutable_content(),
                        ParseContent(*content, param + ".content"));
    // Parts of a message pdserve cannot render: tool calling, audio and
    // refusals. Dropping them would change the conversation the model sees.
    for (const char* key :
         {"tool_calls", "function_call", "tool_call_id", "audio", "refusal"}) {
      const json* value = Find(message, key);
      if (value == nullptr) continue;
      if (value->is_array() && value->empty()) continue;  // "no tool calls"
      return BadParam(absl::StrCat(param, ".", key),
                      "is not supported (pdserve has no tool calling, audio "
                      "or refusals)");
    }
    auto name = message.find("name");
    if (name != message.end() && !name->is_null()) {
      if (!name->is_string()) {
        return BadParam(absl::StrCat(param, ".name"), "must be a string");
      }
      out->set_name(name->get<std::string>());
    }
  }
  PD_ASSIGN_OR_RETURN(std::optional<bool> continue_final,
                      GetBool(body, "continue_final_message"));
  if (continue_final.value_or(false)) {
    if (chat->messages(chat->messages_size() - 1).role() != "assistant") {
      return BadParam("continue_final_message",
                      "requires the last message to have role \"assistant\"");
    }
    chat->set_continue_final_message(true);
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& body, v1::SamplingParams* sampling) {
  const json* stop = Find(body, "stop");
  if (stop == nullptr) return absl::OkStatus();
  std::vector<std::string> strings;
  if (stop->is_string()) {
    strings.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    for (const json& s : *stop) {
      if (!s.is_string()) {
        return BadParam("stop", "must be a string or an array of strings");
      }
      strings.push_back(s.get<std::string>());
    }
  } else {
    return BadParam("stop", "must be a string or an array of strings");
  }
  if (strings.size() > kMaxStopStrings) {
    return BadParam(
        "stop", absl::StrCat("may hold at most ", kMaxStopStrings, " strings"));
  }
  for (std::string& s : strings) {
    if (s.empty()) return BadParam("stop", "must not contain empty strings");
    sampling->add_stop(std::move(s));
  }
  return absl::OkStatus();
}

// A decimal token id: digits only (no sign, point or exponent), below 2^32.
std::optional<uint32_t> TokenIdKey(const std::string& key) {
  if (key.empty() || key.size() > 10) return std::nullopt;
  uint64_t id = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + static_cast<uint64_t>(c - '0');
  }
  if (id > std::numeric_limits<uint32_t>::max()) return std::nullopt;
  return static_cast<uint32_t>(id);
}

// "logit_bias": {"<token id>": bias in [-100, 100], ...}. Whether each id is
// in the vocabulary is the router's check (it knows the model; a JSON body
// does not).
absl::Status ParseLogitBias(const json& body, v1::SamplingParams* sampling) {
  const json* bias = Find(body, "logit_bias");
  if (bias == nullptr) return absl::OkStatus();
  if (!bias->is_object()) {
    return BadParam("logit_bias",
                    "must be an object mapping token ids to numbers in "
                    "[-100, 100]");
  }
  auto& out = *sampling->mutable_logit_bias();
  for (const auto& [key, value] : bias->items()) {
    std::optional<uint32_t> id = TokenIdKey(key);
    if (!id.has_value()) {
      return BadParam(
          "logit_bias",
          absl::StrCat("key \"", key,
                       "\" is not a token id (a decimal integer in [0, "
                       "2^32))"));
    }
    // "1" and "01" are the same token; which one should win is a guess.
    if (out.find(*id) != out.end()) {
      return BadParam("logit_bias",
                      absl::StrCat("names token id ", *id, " twice"));
    }
    if (!value.is_number() || !(value.get<double>() >= -kMaxLogitBias &&
                                value.get<double>() <= kMaxLogitBias)) {
      return BadParam("logit_bias",
                      absl::StrCat("value for token id ", *id,
                                   " must be a number in [-100, 100]"));
    }
    out[*id] = static_cast<float>(value.get<double>());
  }
  return absl::OkStatus();
}

// Chat fields that ask for what pdserve does not have. Absent, null, and the
// values that ask for nothing (no tools, text output) are accepted, so
// clients that send the defaults explicitly work; anything else is a 400
// naming the field rather than an answer that silently lacks it.
absl::Status RefuseUnsupportedChatFields(const json& body) {
  for (const char* key : {"tools", "functions"}) {
    const json* value = Find(body, key);
    if (value != nullptr && !(value->is_array() && value->empty())) {
      return BadParam(key, "is not supported (pdserve has no tool calling)");
    }
  }
  for (const char* key : {"tool_choice", "function_call"}) {
    const json* value = Find(body, key);
    if (value != nullptr && *value != "none") {
      return BadParam(key, "must be \"none\" (pdserve has no tool calling)");
    }
  }
  if (const json* format = Find(body, "response_format"); format != nullptr) {
    auto type = format->is_object() ? format->find("type") : format->end();
    if (!format->is_object() || type == format->end() || *type != "text") {
      return BadParam("response_format",
                      "must be {\"type\": \"text\"} (structured output, "
                      "json_object and json_schema, is not supported)");
    }
  }
  if (const json* modalities = Find(body, "modalities");
      modalities != nullptr) {
    if (*modalities != json::array({"text"})) {
      return BadParam("modalities",
                      "must be [\"text\"] (pdserve generates text only)");
    }
  }
  for (const char* key : {"audio", "web_search_options"}) {
    if (Find(body, key) != nullptr) {
      return BadParam(key, "is not supported");
    }
  }
  PD_ASSIGN_OR_RETURN(std::optional<bool> store, GetBool(body, "store"));
  if (store.value_or(false)) {
    return BadParam("store",
                    "must be false (pdserve does not store completions)");
  }
  return absl::OkStatus();
}

// Fields shared by completions and chat completions.
absl::Status ParseCommon(const json& body, OpenAiRequest* out) {
  v1::GenerateRequest& request = out->generate;
  v1::SamplingParams& sampling = *request.mutable_sampling();

  PD_ASSIGN_OR_RETURN(std::optional<std::string> model,
                      GetString(body, "model"));
  if (model.has_value()) request.set_model(*model);
  PD_ASSIGN_OR_RETURN(std::optional<std::string> request_id,
                      GetString(body, "request_id"));
  if (request_id.has_value()) request.set_request_id(*request_id);

  // max_completion_tokens (the newer OpenAI name) wins, as in vLLM.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    PD_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, GetInt(body, key));
    if (!max_tokens.has_value()) continue;
    if (*max_tokens < 1 || *max_tokens > std::numeric_limits<uint32_t>::max()) {
      return BadParam(key, "must be a positive integer");
    }
    sampling.set_max_tokens(static_cast<uint32_t>(*max_tokens));
  }

  PD_ASSIGN_OR_RETURN(std::optional<double> temperature,
                      GetNumber(body, "temperature"));
  if (temperature.has_value()) {
    if (*temperature < 0) return BadParam("temperature", "must be >= 0");
    sampling.set_temperature(static_cast<float>(*temperature));
  }
  PD_ASSIGN_OR_RETURN(std::optional<double> top_p, GetNumber(body, "top_p"));
  if (top_p.has_value()) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return BadParam("top_p", "must be in (0, 1]");
    }
    sampling.set_top_p(static_cast<float>(*top_p));
  }
  PD_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, GetInt(body, "top_k"));
  if (top_k.has_value()) {
    if (*top_k < -1 || *top_k > std::numeric_limits<uint32_t>::max()) {
      return BadParam("top_k",
                      "must be -1 (disabled) or a non-negative "
                      "integer");
    }
    // vLLM: -1 (and 0) disable top-k; the proto spells "disabled" as 0.
    sampling.set_top_k(*top_k < 0 ? 0 : static_cast<uint32_t>(*top_k));
  }
  PD_ASSIGN_OR_RETURN(std::optional<double> min_p, GetNumber(body, "min_p"));
  if (min_p.has_value()) {
    if (*min_p < 0 || *min_p > 1) return BadParam("min_p", "must be in [0, 1]");
    sampling.set_min_p(static_cast<float>(*min_p));
  }
  PD_ASSIGN_OR_RETURN(std::optional<double> repetition_penalty,
                      GetNumber(body, "repetition_penalty"));
  if (repetition_penalty.has_value()) {
    if (!(*repetition_penalty > 0)) {
      return BadParam("repetition_penalty", "must be > 0");
    }
    sampling.set_repetition_penalty(static_cast<float>(*repetition_penalty));
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    PD_ASSIGN_OR_RETURN(std::optional<double> penalty, GetNumber(body, key));
    if (!penalty.has_value()) continue;
    if (*penalty < -2 || *penalty > 2)
      return BadParam(key, "must be in [-2, 2]");
    if (absl::string_view(key) == "presence_penalty") {
      sampling.set_presence_penalty(static_cast<float>(*penalty));
    } else {
      sampling.set_frequency_penalty(static_cast<float>(*penalty));
    }
  }

  // Any 64-bit integer; negative seeds are reinterpreted as unsigned (the
  // seed only feeds the RNG).
  if (const json* seed = Find(body, "seed"); seed != nullptr) {
    if (seed->is_number_unsigned()) {
      sampling.set_seed(seed->get<uint64_t>());
    } else if (std::optional<int64_t> v = AsInt64(*seed); v.has_value()) {
      sampling.set_seed(static_cast<uint64_t>(*v));
    } else {
      return BadParam("seed", "must be an integer");
    }
  }

  PD_RETURN_IF_ERROR(ParseStop(body, &sampling));
  if (const json* ids = Find(body, "stop_token_ids"); ids != nullptr) {
    bool ok = ids->is_array();
    for (size_t i = 0; ok && i < ids->size(); ++i) {
      std::optional<uint32_t> id = AsTokenId((*ids)[i]);
      ok = id.has_value();
      if (ok) sampling.add_stop_token_ids(*id);
    }
    if (!ok) {
      return BadParam("stop_token_ids",
                      "must be an array of token ids (integers in [0, 2^32))");
    }
  }
  PD_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos,
                      GetBool(body, "ignore_eos"));
  sampling.set_ignore_eos(ignore_eos.value_or(false));
  PD_RETURN_IF_ERROR(ParseLogitBias(body, &sampling));

  PD_ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInt(body, "n"));
  if (n.has_value() && *n != 1) {
    return BadParam("n", "must be 1 (multiple choices are not supported)");
  }
  PD_ASSIGN_OR_RETURN(std::optional<int64_t> priority,
                      GetInt(body, "priority"));
  if (priority.has_value()) {
    if (*priority < kMinPriority || *priority > kMaxPriority) {
      return BadParam("priority", absl::StrCat("must be in [", kMinPriority,
                                               ", ", kMaxPriority, "]"));
    }
    request.set_priority(static_cast<int32_t>(*priority));
  }

  PD_ASSIGN_OR_RETURN(std::optional<bool> stream, GetBool(body, "stream"));
  out->stream = stream.value_or(false);
  if (const json* options = Find(body, "stream_options"); options != nullptr) {
    if (!options->is_object()) {
      return BadParam("stream_options", "must be an object");
    }
    auto include_usage = options->find("include_usage");
    if (include_usage != options->end() && !include_usage->is_null()) {
      if (!include_usage->is_boolean()) {
        return BadParam("stream_options.include_usage", "must be a boolean");
      }
      out->include_usage = include_usage->get<bool>();
    }
  }
  request.mutable_stream_options()->set_include_usage(
      out->stream ? out->include_usage : true);

  PD_ASSIGN_OR_RETURN(std::optional<double> timeout,
                      GetNumber(body, "timeout"));
  if (timeout.has_value()) {
    // Also bounds the value so absl::Seconds cannot overflow to infinity.
    if (!(*timeout > 0) || *timeout > 1e9) {
      return BadParam("timeout", "must be a positive number of seconds");
    }
    out->timeout = absl::Seconds(*timeout);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> GetTopLogprobs(const json& body, const char* key) {
  const json* value = Find(body, key);
  if (value == nullptr) return 0;
  std::optional<int64_t> v = AsInt64(*value);
  if (!v.has_value() || *v < 0 || *v > kMaxTopLogprobs) {
    return BadParam(key, absl::StrCat("must be an integer between 0 and ",
                                      kMaxTopLogprobs));
  }
  return static_cast<int>(*v);
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

absl::StatusOr<OpenAiRequest> ParseCompletionRequest(absl::string_view body) {
  PD_ASSIGN_OR_RETURN(json root, ParseBody(body));
  OpenAiRequest out;
  out.kind = OpenAiKind::kCompletion;
  PD_RETURN_IF_ERROR(ParseCompletionPrompt(root, &out.generate));
  PD_RETURN_IF_ERROR(ParseCommon(root, &out));

  PD_ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(root, "echo"));
  if (echo.value_or(false)) return BadParam("echo", "is not supported");
  if (Find(root, "suffix") != nullptr) {
    return BadParam("suffix", "is not supported");
  }
  PD_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, GetInt(root, "best_of"));
  if (best_of.has_value() && *best_of != 1) {
    return BadParam("best_of", "must be 1 (best-of sampling is not supported)");
  }
  // Completions: "logprobs" is the number of alternatives, 0..20.
  if (Find(root, "logprobs") != nullptr) {
    PD_ASSIGN_OR_RETURN(int top, GetTopLogprobs(root, "logprobs"));
    out.logprobs = true;
    out.generate.mutable_sampling()->set_logprobs(true);
    out.generate.mutable_sampling()->set_top_logprobs(top);
  }
  // OpenAI's legacy completions and vLLM default to 16 tokens; a client
  // written for either expects a short answer, not one that runs to the end
  // of the context (chat keeps "the rest of the context", as both do).
  if (!out.generate.sampling().has_max_tokens()) {
    out.generate.mutable_sampling()->set_max_tokens(
        kDefaultCompletionMaxTokens);
  }
  return out;
}

absl::StatusOr<OpenAiRequest> ParseChatCompletionRequest(
    absl::string_view body) {
  PD_ASSIGN_OR_RETURN(json root, ParseBody(body));
  OpenAiRequest out;
  out.kind = OpenAiKind::kChat;
  PD_RETURN_IF_ERROR(ParseMessages(root, out.generate.mutable_chat()));
  PD_RETURN_IF_ERROR(ParseCommon(root, &out));
  PD_RETURN_IF_ERROR(RefuseUnsupportedChatFields(root));

  // Chat: "logprobs" is a boolean, "top_logprobs" the number of
  // alternatives, which needs logprobs.
  PD_ASSIGN_OR_RETURN(std::optional<bool> logprobs, GetBool(root, "logprobs"));
  PD_ASSIGN_OR_RETURN(int top, GetTopLogprobs(root, "top_logprobs"));
  if (top > 0 && !logprobs.value_or(false)) {
    return BadParam("top_logprobs", "requires 'logprobs' to be true");
  }
  if (logprobs.value_or(false)) {
    out.logprobs = true;
    out.generate.mutable_sampling()->set_logprobs(true);
    out.generate.mutable_sampling()->set_top_logprobs(top);
  }
  return out;
}

absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(
    absl::string_view body) {
  PD_ASSIGN_OR_RETURN(json root, ParseBody(body));
  v1::TokenizeRequest request;
  PD_ASSIGN_OR_RETURN(std::optional<std::string> model,
                      GetString(root, "model"));
  if (model.has_value()) request.set_model(*model);
  bool has_prompt = Find(root, "prompt") != nullptr;
  bool has_messages = Find(root, "messages") != nullptr;
  if (has_prompt == has_messages) {
    return absl::InvalidArgumentError(
        "exactly one of 'prompt' and 'messages' is required");
  }
  if (has_prompt) {
    PD_ASSIGN_OR_RETURN(std::optional<std::string> prompt,
                        GetString(root, "prompt"));
    request.set_text(*prompt);
  } else {
    PD_RETURN_IF_ERROR(ParseMessages(root, request.mutable_chat()));
  }
  PD_ASSIGN_OR_RETURN(std::optional<bool> add_special_tokens,
                      GetBool(root, "add_special_tokens"));
  if (add_special_tokens.has_value()) {
    request.set_add_special_tokens(*add_special_tokens);
  }
  return request;
}

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
