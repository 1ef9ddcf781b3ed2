#include "router/openai_request.h"

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

// Sampling's numbers: the length limit, temperature, the top-k/top-p/min-p
// cut-offs and the penalties.
absl::Status ParseSamplingNumbers(const json& body, v1::SamplingParams* out) {
  v1::SamplingParams& sampling = *out;
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
  return absl::OkStatus();
}

// Sampling's other controls: the seed, stop strings and ids, ignore_eos,
// disable_speculation and logit_bias.
absl::Status ParseSamplingControls(const json& body, v1::SamplingParams* out) {
  v1::SamplingParams& sampling = *out;
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
  PD_ASSIGN_OR_RETURN(std::optional<bool> disable_speculation,
                      GetBool(body, "disable_speculation"));
  sampling.set_disable_speculation(disable_speculation.value_or(false));
  PD_RETURN_IF_ERROR(ParseLogitBias(body, &sampling));
  return absl::OkStatus();
}

// "stream" and "stream_options"; usage is always reported when not
// streaming (the body carries it).
absl::Status ParseStreaming(const json& body, OpenAiRequest* out) {
  v1::GenerateRequest& request = out->generate;
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
  return absl::OkStatus();
}

// Fields shared by completions and chat completions, checked in this order
// (the first bad one is the one the 400 names).
absl::Status ParseCommon(const json& body, OpenAiRequest* out) {
  v1::GenerateRequest& request = out->generate;
  v1::SamplingParams& sampling = *request.mutable_sampling();

  PD_ASSIGN_OR_RETURN(std::optional<std::string> model,
                      GetString(body, "model"));
  if (model.has_value()) request.set_model(*model);
  PD_ASSIGN_OR_RETURN(std::optional<std::string> request_id,
                      GetString(body, "request_id"));
  if (request_id.has_value()) request.set_request_id(*request_id);

  PD_RETURN_IF_ERROR(ParseSamplingNumbers(body, &sampling));
  PD_RETURN_IF_ERROR(ParseSamplingControls(body, &sampling));

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

  PD_RETURN_IF_ERROR(ParseStreaming(body, out));

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

}  // namespace pdserve::router
