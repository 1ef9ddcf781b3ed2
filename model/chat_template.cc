#include "model/chat_template.h"

#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "model/gguf.h"
#include "model/unicode.h"

namespace pdserve::model {

enum class ChatTemplate::Variant : uint8_t {
  kChatMl,
  kChatMlBos,
  kChatMlDefaultSystem,
  kQwen25,
  kLlama3,
  kLlama31,
  kLlama32,
  kLlama2,
  kMistralLegacyV01,
  kMistralLegacy,
  kMistralV1,
  kMistralV3,
};

namespace {

using Variant = ChatTemplate::Variant;

// ---------------------------------------------------------------------------
// The known templates, verbatim except for holes: a string literal holding
// "@@NAME@@" matches a literal holding any text in its place, and that text is
// captured as NAME ("_": not kept). See the header for where each comes from;
// model/testdata/chat_templates/sources/ holds the originals.
// ---------------------------------------------------------------------------

constexpr char kChatMlSource[] =
    R"tmpl({% for message in messages %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})tmpl";

constexpr char kChatMlBosSource[] =
    R"tmpl({{bos_token}}{% for message in messages %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})tmpl";

constexpr char kChatMlDefaultSystemSource[] =
    R"tmpl({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
@@DEFAULT_SYSTEM@@<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})tmpl";

constexpr char kQwen25Source[] =
    R"tmpl({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '@@_@@' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\n@@DEFAULT_SYSTEM@@<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)tmpl";

constexpr char kLlama3Source[] =
    R"tmpl({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})tmpl";

constexpr char kLlama31Source[] =
    R"tmpl({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "@@DEFAULT_DATE@@" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: @@CUTOFF@@\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)tmpl";

constexpr char kLlama32Source[] =
    R"tmpl({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "@@DEFAULT_DATE@@" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: @@CUTOFF@@\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)tmpl";

constexpr char kLlama2Source[] =
    R"tmpl({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})tmpl";

constexpr char kLlama2TrimSource[] =
    R"tmpl({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content | trim + ' ' + eos_token }}{% endif %}{% endfor %})tmpl";

constexpr char kMistralLegacyV01Source[] =
    R"tmpl({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})tmpl";

constexpr char kMistralLegacySource[] =
    R"tmpl({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})tmpl";

constexpr char kMistralV1Source[] =
    R"tmpl({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)tmpl";

constexpr char kMistralV3Source[] =
    R"tmpl({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)tmpl";

// The July 2024 Llama 3.1 text is kLlama31Source without this block (with
// HF's tools=None both render alike).
constexpr absl::string_view kLlama31ToolsNoneBlock =
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n";

struct VariantInfo {
  Variant variant;
  absl::string_view name;
  ChatTemplateFamily family;
  bool renders_bos;  // the template outputs bos_token
  bool uses_eos;     // the template outputs eos_token
  bool overridable;  // FromFamilyName accepts the name
};

constexpr VariantInfo kVariants[] = {
    {Variant::kChatMl, "chatml", ChatTemplateFamily::kChatMl, false, false,
     true},
    {Variant::kChatMlBos, "chatml-bos", ChatTemplateFamily::kChatMl, true,
     false, true},
    // These two need their default system prompt from a template.
    {Variant::kChatMlDefaultSystem, "chatml-default-system",
     ChatTemplateFamily::kChatMl, false, false, false},
    {Variant::kQwen25, "qwen2.5", ChatTemplateFamily::kChatMl, false, false,
     false},
    {Variant::kLlama3, "llama3", ChatTemplateFamily::kLlama3, true, false,
     true},
    {Variant::kLlama31, "llama3.1", ChatTemplateFamily::kLlama3, true, false,
     true},
    {Variant::kLlama32, "llama3.2", ChatTemplateFamily::kLlama3, true, false,
     true},
    {Variant::kLlama2, "llama2", ChatTemplateFamily::kLlama2, true, true, true},
    {Variant::kMistralLegacyV01, "mistral-legacy-v0.1",
     ChatTemplateFamily::kMistral, true, true, true},
    {Variant::kMistralLegacy, "mistral-legacy", ChatTemplateFamily::kMistral,
     true, true, true},
    {Variant::kMistralV1, "mistral-v1", ChatTemplateFamily::kMistral, true,
     true, true},
    {Variant::kMistralV3, "mistral-v3", ChatTemplateFamily::kMistral, true,
     true, true},
};

const VariantInfo& Info(Variant variant) {
  for (const VariantInfo& info : kVariants) {
    if (info.variant == variant) return info;
  }
  return kVariants[0];  // unreachable: every variant is in the table
}

// Meta's values, for the llama3.1 / llama3.2 overrides.
constexpr absl::string_view kMetaKnowledgeCutoff = "December 2023";
constexpr absl::string_view kMetaDefaultDate = "26 Jul 2024";

// ---------------------------------------------------------------------------
// Text helpers: UTF-8, and whitespace as Python's str.isspace() sees it
// (Jinja's `trim`, Python's str.strip() and the lexer's \s all use it).
// ---------------------------------------------------------------------------

// Decodes the code point at s[i] into *cp; returns its length in bytes, or 0
// when s[i..] does not start with a valid UTF-8 sequence (overlong forms and
// surrogates included).
size_t DecodeUtf8(absl::string_view s, size_t i, char32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len;
  char32_t value;
  char32_t min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, value = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, value = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, value = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (len > s.size() - i) return 0;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    value = (value << 6) | (cc & 0x3F);
  }
  if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    return 0;
  }
  *cp = value;
  return len;
}

// Python's str.isspace(), which is also what its regex \s matches.
bool IsPyWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Length in bytes of the whitespace run starting at s[i].
size_t WhitespaceRunAt(absl::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size()) {
    char32_t cp;
    const size_t n = DecodeUtf8(s, j, &cp);
    if (n == 0 || !IsPyWhitespace(cp)) break;
    j += n;
  }
  return j - i;
}

// Where the whitespace run that ends `s` starts (s.size() when none).
size_t TrailingWhitespaceStart(absl::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    char32_t cp;
    if (DecodeUtf8(s, start, &cp) != end - start || !IsPyWhitespace(cp)) break;
    end = start;
  }
  return end;
}

// Python's str.strip() with no argument.
absl::string_view PyStrip(absl::string_view s) {
  s.remove_prefix(WhitespaceRunAt(s, 0));
  return s.substr(0, TrailingWhitespaceStart(s));
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// ---------------------------------------------------------------------------
// Lexing a template into the form the known templates are compared in.
// This follows jinja2/lexer.py (3.1) under HF's environment settings.
// Anything it does not handle is an error, which makes the template unknown:
// the lexer may refuse a valid template, but it must never make two
// templates that render differently look alike.
// ---------------------------------------------------------------------------

enum class TokKind : uint8_t {
  kText,    // template data, after whitespace control
  kBegin,   // "{{", "{%", with their sign ("{%-", "{{+", ...)
  kEnd,     // "}}", "-}}", "%}", "-%}", "+%}"
  kName,    // identifiers and keywords
  kNumber,  // as written
  kString,  // the decoded value of a string literal
  kOp,      // operators and brackets
};

struct Tok {
  TokKind kind;
  std::string text;
};

absl::Status LexError(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A string literal's body, decoded as Jinja does (Python's "unicode-escape"
// codec). \N{...}, escapes of non-ASCII characters and surrogates are
// refused.
absl::StatusOr<std::string> DecodeStringLiteral(absl::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\') {
      out.push_back(body[i]);
      continue;
    }
    if (++i == body.size()) return LexError("string ends in a backslash");
    const char e = body[i];
    switch (e) {
      case '\n':  // a line continuation: both are dropped
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(e);
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (body.size() - i - 1 < digits)
          return LexError("short \\x/\\u escape");
        char32_t cp = 0;
        for (size_t k = 1; k <= digits; ++k) {
          const int v = HexValue(body[i + k]);
          if (v < 0) return LexError("bad \\x/\\u escape");
          cp = cp * 16 + v;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
          return LexError("escape is not a Unicode scalar value");
        }
        AppendUtf8(cp, &out);
        i += digits;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' &&
                          body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + (body[++i] - '0');
          }
          AppendUtf8(cp, &out);
        } else if (static_cast<unsigned char>(e) >= 0x80 || e == 'N') {
          return LexError("unsupported escape in a string literal");
        } else {
          // Python keeps unknown escapes as they are.
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

absl::StatusOr<std::vector<Tok>> LexTemplate(absl::string_view raw) {
  if (!IsValidUtf8(raw)) return LexError("the template is not valid UTF-8");
  // Jinja reads "\r\n" and "\r" as "\n" and drops one final newline.
  std::string src;
  src.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      src.push_back(raw[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  const absl::string_view s = src;
  const size_t n = s.size();

  std::vector<Tok> out;
  const auto emit_text = [&out](absl::string_view text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == TokKind::kText) {
      out.back().text.append(text.data(), text.size());
    } else {
      out.push_back({TokKind::kText, std::string(text)});
    }
  };

  size_t pos = 0;
  // Whether the last token consumed ended a line (lstrip_blocks needs it).
  bool line_starting = true;
  while (pos < n) {
    size_t start = pos;
    char kind = 0;
    while ((start = s.find('{', start)) != absl::string_view::npos &&
           start + 1 < n) {
      const char c = s[start + 1];
      if (c == '{' || c == '%' || c == '#') {
        kind = c;
        break;
      }
      ++start;
    }
    if (kind == 0) {
      emit_text(s.substr(pos));
      break;
    }
    size_t body = start + 2;
    char sign = 0;
    if (body < n && (s[body] == '-' || s[body] == '+')) sign = s[body++];

    // Whitespace control of the text before the tag.
    absl::string_view text = s.substr(pos, start - pos);
    if (sign == '-') {
      text = text.substr(0, TrailingWhitespaceStart(text));
    } else if (sign != '+' && kind != '{') {
      // lstrip_blocks: blanks between a line start and a block or comment.
      const size_t newline = text.rfind('\n');
      const size_t l_pos = newline == absl::string_view::npos ? 0 : newline + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          WhitespaceRunAt(text, l_pos) == text.size() - l_pos) {
        text = text.substr(0, l_pos);
      }
    }
    emit_text(text);

    if (kind == '#') {
      const size_t close = s.find("#}", body);
      if (close == absl::string_view::npos) return LexError("open comment");
      const char end_sign =
          close > body && (s[close - 1] == '-' || s[close - 1] == '+')
              ? s[close - 1]
              : 0;
      size_t after = close + 2;
      if (end_sign == '-') {
        after += WhitespaceRunAt(s, after);
      } else if (end_sign != '+' && after < n && s[after] == '\n') {
        ++after;  // trim_blocks
      }
      line_starting = after > close + 2 && s[after - 1] == '\n';
      pos = after;
      continue;
    }

    out.push_back(
        {TokKind::kBegin, std::string(s.substr(start, body - start))});
    if (kind == '%') {
      const size_t k = body + WhitespaceRunAt(s, body);
      if (s.substr(k, 3) == "raw" && (k + 3 >= n || !IsNameChar(s[k + 3]))) {
        return LexError("{% raw %} blocks are not supported");
      }
    }
    std::vector<char> closers;  // brackets still open inside the tag
    size_t i = body;
    for (;;) {
      i += WhitespaceRunAt(s, i);
      if (i >= n) return LexError("open tag at the end of the template");
      if (closers.empty()) {
        const absl::string_view rest = s.substr(i);
        absl::string_view end;
        if (kind == '%') {
          for (absl::string_view e : {"-%}", "+%}", "%}"}) {
            if (absl::StartsWith(rest, e)) {
              end = e;
              break;
            }
          }
        } else {
          for (absl::string_view e : {"-}}", "}}"}) {
            if (absl::StartsWith(rest, e)) {
              end = e;
              break;
            }
          }
        }
        if (!end.empty()) {
          out.push_back({TokKind::kEnd, std::string(end)});
          size_t after = i + end.size();
          if (end[0] == '-') {
            after += WhitespaceRunAt(s, after);
          } else if (end == "%}" && after < n && s[after] == '\n') {
            ++after;  // trim_blocks
          }
          line_starting = after > i + end.size() && s[after - 1] == '\n';
          pos = after;
          break;
        }
      }
      const char c = s[i];
      if (IsDigit(c)) {
        size_t j = i;
        while (j < n && (IsDigit(s[j]) || s[j] == '_')) ++j;
        if (j + 1 < n && s[j] == '.' && IsDigit(s[j + 1])) {
          ++j;
          while (j < n && (IsDigit(s[j]) || s[j] == '_')) ++j;
        }
        if (j < n && (s[j] == 'e' || s[j] == 'E')) {
          size_t k = j + 1;
          if (k < n && (s[k] == '+' || s[k] == '-')) ++k;
          if (k < n && IsDigit(s[k])) {
            j = k;
            while (j < n && (IsDigit(s[j]) || s[j] == '_')) ++j;
          }
        }
        out.push_back({TokKind::kNumber, std::string(s.substr(i, j - i))});
        i = j;
      } else if (IsNameStart(c)) {
        size_t j = i + 1;
        while (j < n && IsNameChar(s[j])) ++j;
        out.push_back({TokKind::kName, std::string(s.substr(i, j - i))});
        i = j;
      } else if (c == '\'' || c == '"') {
        size_t j = i + 1;
        while (j < n && s[j] != c) j += s[j] == '\\' ? 2 : 1;
        if (j >= n) return LexError("open string literal");
        PD_ASSIGN_OR_RETURN(std::string value,
                            DecodeStringLiteral(s.substr(i + 1, j - i - 1)));
        out.push_back({TokKind::kString, std::move(value)});
        i = j + 1;
      } else {
        absl::string_view op;
        for (absl::string_view two : {"//", "**", "==", "!=", ">=", "<="}) {
          if (absl::StartsWith(s.substr(i), two)) {
            op = two;
            break;
          }
        }
        if (op.empty()) {
          if (absl::string_view("+-/*%~[](){}=.:|,;<>").find(c) ==
              absl::string_view::npos) {
            return LexError("unexpected character in a tag");
          }
          op = s.substr(i, 1);
        }
        if (op == "(" || op == "[" || op == "{") {
          closers.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (closers.empty() || closers.back() != op[0]) {
            return LexError("unbalanced brackets in a tag");
          }
          closers.pop_back();
        }
        out.push_back({TokKind::kOp, std::string(op)});
        i += op.size();
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Matching against the known templates.
// ---------------------------------------------------------------------------

struct Captures {
  std::optional<std::string> default_system;
  std::optional<std::string> cutoff;
  std::optional<std::string> default_date;
};

bool MatchTokens(const std::vector<Tok>& pattern, const std::vector<Tok>& input,
                 Captures* captures) {
  if (pattern.size() != input.size()) return false;
  Captures found;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const Tok& p = pattern[i];
    const Tok& t = input[i];
    if (p.kind != t.kind) return false;
    const size_t hole =
        p.kind == TokKind::kString ? p.text.find("@@") : std::string::npos;
    if (hole == std::string::npos) {
      if (p.text != t.text) return false;
      continue;
    }
    const size_t hole_end = p.text.find("@@", hole + 2);
    const absl::string_view name =
        absl::string_view(p.text).substr(hole + 2, hole_end - hole - 2);
    const absl::string_view prefix = absl::string_view(p.text).substr(0, hole);
    const absl::string_view suffix =
        absl::string_view(p.text).substr(hole_end + 2);
    if (t.text.size() < prefix.size() + suffix.size() ||
        !absl::StartsWith(t.text, prefix) || !absl::EndsWith(t.text, suffix)) {
      return false;
    }
    std::string value = t.text.substr(
        prefix.size(), t.text.size() - prefix.size() - suffix.size());
    if (name == "DEFAULT_SYSTEM") {
      found.default_system = std::move(value);
    } else if (name == "CUTOFF") {
      found.cutoff = std::move(value);
    } else if (name == "DEFAULT_DATE") {
      found.default_date = std::move(value);
    }
  }
  *captures = std::move(found);
  return true;
}

struct Pattern {
  Variant variant;
  std::vector<Tok> tokens;
};

// The known templates, lexed once. An error here is a bug in this file (the
// tests exercise every pattern).
const absl::StatusOr<std::vector<Pattern>>& Patterns() {
  static const absl::StatusOr<std::vector<Pattern>>* const patterns =
      []() -> absl::StatusOr<std::vector<Pattern>>* {
    std::string llama31_2407(kLlama31Source);
    const size_t block =
        absl::string_view(llama31_2407).find(kLlama31ToolsNoneBlock);
    if (block != std::string::npos) {
      llama31_2407.erase(block, kLlama31ToolsNoneBlock.size());
    }
    const std::pair<Variant, absl::string_view> sources[] = {
        {Variant::kChatMl, kChatMlSource},
        {Variant::kChatMlBos, kChatMlBosSource},
        {Variant::kChatMlDefaultSystem, kChatMlDefaultSystemSource},
        {Variant::kQwen25, kQwen25Source},
        {Variant::kLlama3, kLlama3Source},
        {Variant::kLlama31, kLlama31Source},
        {Variant::kLlama31, llama31_2407},
        {Variant::kLlama32, kLlama32Source},
        {Variant::kLlama2, kLlama2Source},
        {Variant::kLlama2, kLlama2TrimSource},
        {Variant::kMistralLegacyV01, kMistralLegacyV01Source},
        {Variant::kMistralLegacy, kMistralLegacySource},
        {Variant::kMistralV1, kMistralV1Source},
        {Variant::kMistralV3, kMistralV3Source},
    };
    std::vector<Pattern> result;
    for (const auto& [variant, source] : sources) {
      absl::StatusOr<std::vector<Tok>> tokens = LexTemplate(source);
      if (!tokens.ok()) {
        return new absl::StatusOr<std::vector<Pattern>>(absl::InternalError(
            absl::StrCat("known template ", Info(variant).name,
                         " does not lex: ", tokens.status().message())));
      }
      result.push_back({variant, *std::move(tokens)});
    }
    return new absl::StatusOr<std::vector<Pattern>>(std::move(result));
  }();
  return *patterns;
}

absl::string_view FamilyHint(absl::string_view source) {
  if (absl::StrContains(source, "<|im_start|>")) return "ChatML";
  if (absl::StrContains(source, "<|start_header_id|>")) return "Llama 3";
  if (absl::StrContains(source, "<<SYS>>")) return "Llama 2";
  if (absl::StrContains(source, "[INST]")) return "Mistral";
  return "";
}

std::string VariantNameList(bool overridable_only) {
  std::vector<absl::string_view> names;
  for (const VariantInfo& info : kVariants) {
    if (!overridable_only || info.overridable) names.push_back(info.name);
  }
  return absl::StrJoin(names, ", ");
}

// ---------------------------------------------------------------------------
// Rendering helpers.
// ---------------------------------------------------------------------------

// The templates' raise_exception(message).
absl::Status TemplateRaised(Variant variant, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("the ", Info(variant).name,
                   " chat template rejects this conversation: ", message));
}

constexpr absl::string_view kAlternateLegacy =
    "Conversation roles must alternate user/assistant/user/assistant/...";
constexpr absl::string_view kAlternateAfterSystem =
    "After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...";
constexpr absl::string_view kOnlyUserAssistant =
    "Only user and assistant roles are supported!";
constexpr absl::string_view kOnlyUserAssistantAfterSystem =
    "Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!";

// strftime_now("%d %b %Y") as Python computes it: local time, C-locale
// month names.
std::string TodayDateString() {
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr",
                                            "May", "Jun", "Jul", "Aug",
                                            "Sep", "Oct", "Nov", "Dec"};
  const time_t now = time(nullptr);
  struct tm local;
  localtime_r(&now, &local);
  return absl::StrFormat("%02d %s %d", local.tm_mday, kMonths[local.tm_mon],
                         local.tm_year + 1900);
}

}  // namespace

absl::string_view ChatTemplateFamilyName(ChatTemplateFamily family) {
  switch (family) {
    case ChatTemplateFamily::kChatMl:
      return "chatml";
    case ChatTemplateFamily::kLlama3:
      return "llama3";
    case ChatTemplateFamily::kLlama2:
      return "llama2";
    case ChatTemplateFamily::kMistral:
      return "mistral";
  }
  return "unknown";
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(absl::string_view source,
                                                      std::string bos_token,
                                                      std::string eos_token) {
  const absl::StatusOr<std::vector<Pattern>>& patterns = Patterns();
  if (!patterns.ok()) return patterns.status();
  const absl::StatusOr<std::vector<Tok>> tokens = LexTemplate(source);
  if (tokens.ok()) {
    for (const Pattern& pattern : *patterns) {
      Captures captures;
      if (!MatchTokens(pattern.tokens, *tokens, &captures)) continue;
      ChatTemplate result(pattern.variant, std::move(bos_token),
                          std::move(eos_token));
      result.default_system_ = std::move(captures.default_system);
      result.knowledge_cutoff_ = captures.cutoff.value_or("");
      result.default_date_ = captures.default_date.value_or("");
      return result;
    }
  }
  const absl::string_view hint = FamilyHint(source);
  return absl::UnimplementedError(absl::StrCat(
      "unrecognised chat template (", source.size(), " bytes",
      hint.empty() ? ""
                   : absl::StrCat("; its markers suggest the ", hint,
                                  " family, but it is not one of its known "
                                  "versions"),
      tokens.ok()
          ? ""
          : absl::StrCat("; it does not lex: ", tokens.status().message()),
      "). pdserve renders only templates it knows byte for byte (",
      VariantNameList(/*overridable_only=*/false),
      "); if the model's chat format is one of them, name it explicitly (",
      VariantNameList(/*overridable_only=*/true), ")"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromFamilyName(
    absl::string_view name, std::string bos_token, std::string eos_token) {
  for (const VariantInfo& info : kVariants) {
    if (!info.overridable || info.name != name) continue;
    ChatTemplate result(info.variant, std::move(bos_token),
                        std::move(eos_token));
    result.knowledge_cutoff_ = std::string(kMetaKnowledgeCutoff);
    result.default_date_ = std::string(kMetaDefaultDate);
    return result;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat template name \"", absl::CHexEscape(name),
                   "\"; known: ", VariantNameList(/*overridable_only=*/true)));
}

std::vector<std::string> ChatTemplate::OverrideNames() {
  std::vector<std::string> names;
  for (const VariantInfo& info : kVariants) {
    if (info.overridable) names.emplace_back(info.name);
  }
  return names;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& file) {
  constexpr absl::string_view kTemplateKey = "tokenizer.chat_template";
  if (!file.HasMetadata(kTemplateKey)) {
    return absl::NotFoundError(
        absl::StrCat(file.path(), " has no ", kTemplateKey,
                     "; name the chat format explicitly (",
                     VariantNameList(/*overridable_only=*/true), ")"));
  }
  PD_ASSIGN_OR_RETURN(const std::string source, file.GetString(kTemplateKey));
  // The text of the token whose id `id_key` holds; nullopt without the key.
  const auto token_text = [&file](absl::string_view id_key)
      -> absl::StatusOr<std::optional<std::string>> {
    if (!file.HasMetadata(id_key)) return std::optional<std::string>();
    PD_ASSIGN_OR_RETURN(const uint32_t id, file.GetU32(id_key));
    PD_ASSIGN_OR_RETURN(const GgufArray* tokens,
                        file.GetArray("tokenizer.ggml.tokens"));
    const std::vector<std::string>* texts = tokens->get_if<std::string>();
    if (texts == nullptr || id >= texts->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(id_key, " = ", id, " is not a token of ", file.path()));
    }
    return std::optional<std::string>((*texts)[id]);
  };
  PD_ASSIGN_OR_RETURN(const std::optional<std::string> bos,
                      token_text("tokenizer.ggml.bos_token_id"));
  PD_ASSIGN_OR_RETURN(const std::optional<std::string> eos,
                      token_text("tokenizer.ggml.eos_token_id"));
  absl::StatusOr<ChatTemplate> result =
      FromSource(source, bos.value_or(""), eos.value_or(""));
  if (!result.ok()) {
    return absl::Status(
        result.status().code(),
        absl::StrCat(file.path(), ": ", result.status().message()));
  }
  const VariantInfo& info = Info(result->variant_);
  if ((info.renders_bos && !bos.has_value()) ||
      (info.uses_eos && !eos.has_value())) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.path(), ": its ", info.name,
                     " chat template needs the BOS and EOS token texts, but "
                     "tokenizer.ggml.bos_token_id / eos_token_id is missing"));
  }
  return result;
}

ChatTemplateFamily ChatTemplate::family() const {
  return Info(variant_).family;
}

absl::string_view ChatTemplate::variant_name() const {
  return Info(variant_).name;
}

bool ChatTemplate::renders_bos() const { return Info(variant_).renders_bos; }

absl::StatusOr<std::string> ChatTemplate::Render(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt,
    const ChatRenderOptions& options) const {
  if (messages.empty()) {
    return absl::InvalidArgumentError("the conversation has no messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role != "system" && message.role != "user" &&
        message.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", i, " has role \"", absl::CHexEscape(message.role),
          "\"; the roles are \"system\", \"user\" and \"assistant\""));
    }
    if (!IsValidUtf8(message.content)) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " content is not valid UTF-8"));
    }
  }
  if (options.date_string.has_value() && !IsValidUtf8(*options.date_string)) {
    return absl::InvalidArgumentError("date_string is not valid UTF-8");
  }
  switch (variant_) {
    case Variant::kChatMl:
    case Variant::kChatMlBos:
    case Variant::kChatMlDefaultSystem:
    case Variant::kQwen25:
      return RenderChatMl(messages, add_generation_prompt);
    case Variant::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
    case Variant::kLlama31:
    case Variant::kLlama32:
      return RenderLlama31(messages, add_generation_prompt, options);
    case Variant::kLlama2:
      return RenderLlama2(messages);
    case Variant::kMistralLegacyV01:
    case Variant::kMistralLegacy:
      return RenderMistralLegacy(messages);
    case Variant::kMistralV1:
      return RenderMistralV1(messages);
    case Variant::kMistralV3:
      return RenderMistralV3(messages);
  }
  return absl::InternalError("unknown chat template variant");
}

std::string ChatTemplate::RenderChatMl(absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt) const {
  std::string out;
  if (variant_ == Variant::kChatMlBos) out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (i == 0 && default_system_.has_value() && message.role != "system") {
      absl::StrAppend(&out, "<|im_start|>system\n", *default_system_,
                      "<|im_end|>\n");
    }
    absl::StrAppend(&out, "<|im_start|>", message.role, "\n", message.content,
                    "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string ChatTemplate::RenderLlama3(absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt) const {
  std::string out = bos_token_;
  for (const ChatMessage& message : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", message.role,
                    "<|end_header_id|>\n\n", PyStrip(message.content),
                    "<|eot_id|>");
  }
  if (add_generation_prompt) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

std::string ChatTemplate::RenderLlama31(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt,
    const ChatRenderOptions& options) const {
  absl::string_view system;
  if (messages[0].role == "system") {
    system = PyStrip(messages[0].content);
    messages.remove_prefix(1);
  }
  const std::string date = options.date_string.has_value()
                               ? *options.date_string
                           : variant_ == Variant::kLlama32 ? TodayDateString()
                                                           : default_date_;
  std::string out = bos_token_;
  absl::StrAppend(&out, "<|start_header_id|>system<|end_header_id|>\n\n",
                  "Cutting Knowledge Date: ", knowledge_cutoff_, "\n",
                  "Today Date: ", date, "\n\n", system, "<|eot_id|>");
  for (const ChatMessage& message : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", message.role,
                    "<|end_header_id|>\n\n", PyStrip(message.content),
                    "<|eot_id|>");
  }
  if (add_generation_prompt) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderLlama2(
    absl::Span<const ChatMessage> messages) const {
  std::optional<absl::string_view> system;
  if (messages[0].role == "system") {
    system = messages[0].content;
    messages.remove_prefix(1);
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if ((message.role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateLegacy);
    }
    const std::string content =
        i == 0 && system.has_value()
            ? absl::StrCat("<<SYS>>\n", *system, "\n<</SYS>>\n\n",
                           message.content)
            : message.content;
    if (message.role == "user") {
      absl::StrAppend(&out, bos_token_, "[INST] ", PyStrip(content),
                      " [/INST]");
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, " ", PyStrip(content), " ", eos_token_);
    }
    // A system message in an assistant's place renders nothing.
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderMistralLegacy(
    absl::Span<const ChatMessage> messages) const {
  std::string out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if ((message.role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateLegacy);
    }
    if (message.role == "user") {
      absl::StrAppend(&out, "[INST] ", message.content, " [/INST]");
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, message.content, eos_token_,
                      variant_ == Variant::kMistralLegacyV01 ? " " : "");
    } else {
      return TemplateRaised(variant_, kOnlyUserAssistant);
    }
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderMistralV1(
    absl::Span<const ChatMessage> messages) const {
  std::optional<absl::string_view> system;
  if (messages[0].role == "system") {
    system = messages[0].content;
    messages.remove_prefix(1);
  }
  std::string out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if ((message.role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateAfterSystem);
    }
    if (message.role == "user") {
      if (i == 0 && system.has_value()) {
        absl::StrAppend(&out, " [INST] ", *system, "\n\n", message.content,
                        " [/INST]");
      } else {
        absl::StrAppend(&out, " [INST] ", message.content, " [/INST]");
      }
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, " ", message.content, eos_token_);
    } else {
      return TemplateRaised(variant_, kOnlyUserAssistantAfterSystem);
    }
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::RenderMistralV3(
    absl::Span<const ChatMessage> messages) const {
  std::optional<absl::string_view> system;
  if (messages[0].role == "system") {
    system = messages[0].content;
    messages.remove_prefix(1);
  }
  // The template checks the whole order before it renders anything.
  for (size_t i = 0; i < messages.size(); ++i) {
    if ((messages[i].role == "user") != (i % 2 == 0)) {
      return TemplateRaised(variant_, kAlternateAfterSystem);
    }
  }
  std::string out = bos_token_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "user") {
      if (i + 1 == messages.size() && system.has_value()) {
        absl::StrAppend(&out, "[INST] ", *system, "\n\n", message.content,
                        "[/INST]");
      } else {
        absl::StrAppend(&out, "[INST] ", message.content, "[/INST]");
      }
    } else if (message.role == "assistant") {
      absl::StrAppend(&out, " ", PyStrip(message.content), eos_token_);
    } else {
      return TemplateRaised(variant_, kOnlyUserAssistantAfterSystem);
    }
  }
  return out;
}

}  // namespace pdserve::model
