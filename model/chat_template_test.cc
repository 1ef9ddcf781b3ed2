#include "model/chat_template.h"

#include <time.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "model/default_model.h"
#include "model/gguf.h"
#include "model/gguf_types.h"
#include "model/gguf_writer.h"
#include "model/testing/golden_json.h"
#include "model/unicode.h"

namespace pdserve::model {
namespace {

using golden::Json;

// ---------------------------------------------------------------------------
// Golden files.
// ---------------------------------------------------------------------------

std::string TestDataDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string relative = "model/testdata/chat_templates";
  if (srcdir != nullptr) return absl::StrCat(srcdir, "/pdserve/", relative);
  return relative;  // run from the repository root
}

absl::StatusOr<Json> ReadJson(const std::string& path) {
  std::optional<Json> json = golden::LoadGoldenJson(path);
  if (!json) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read or parse ", path));
  }
  return *std::move(json);
}

struct Golden {
  std::string file;
  Json json;
};

// Every <name>.json but unrecognized.json, by name.
const std::map<std::string, Golden>& Goldens() {
  static const std::map<std::string, Golden>* const goldens = [] {
    auto* result = new std::map<std::string, Golden>();
    std::error_code error;
    for (const auto& entry :
         std::filesystem::directory_iterator(TestDataDir(), error)) {
      const std::string path = entry.path().string();
      if (entry.path().extension() != ".json" ||
          entry.path().filename() == "unrecognized.json") {
        continue;
      }
      absl::StatusOr<Json> json = ReadJson(path);
      EXPECT_TRUE(json.ok()) << json.status();
      if (json.ok()) {
        (*result)[entry.path().stem().string()] = {path, *std::move(json)};
      }
    }
    EXPECT_FALSE(error) << TestDataDir() << ": " << error.message();
    return result;
  }();
  return *goldens;
}

const Json& GoldenOrDie(const std::string& name) {
  auto it = Goldens().find(name);
  if (it == Goldens().end()) {
    ADD_FAILURE() << "no golden " << name;
    static const Json* const kEmpty = new Json();
    return *kEmpty;
  }
  return it->second.json;
}

std::vector<ChatMessage> Messages(const Json& json) {
  std::vector<ChatMessage> messages;
  for (const Json& m : json.array) {
    messages.push_back({m["role"].string, m["content"].string});
  }
  return messages;
}

ChatRenderOptions Options(const Json& test_case) {
  ChatRenderOptions options;
  if (test_case.Has("date_string")) {
    options.date_string = test_case["date_string"].string;
  }
  return options;
}

// Renders every case of `golden` with `chat` and compares with Jinja's output
// (or the exception Jinja raised).
void ExpectRendersGolden(const ChatTemplate& chat, const Json& golden) {
  ASSERT_FALSE(golden["cases"].array.empty());
  for (const Json& test_case : golden["cases"].array) {
    SCOPED_TRACE(test_case["name"].string);
    absl::StatusOr<std::string> rendered = chat.Render(
        Messages(test_case["messages"]),
        test_case["add_generation_prompt"].boolean, Options(test_case));
    if (test_case.Has("error")) {
      EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument)
          << rendered.status();
      EXPECT_TRUE(absl::StrContains(rendered.status().message(),
                                    test_case["error"].string))
          << rendered.status();
    } else {
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(*rendered, test_case["expected"].string);
    }
  }
}

absl::StatusOr<ChatTemplate> FromGolden(const Json& golden) {
  return ChatTemplate::FromSource(golden["template"].string,
                                  golden["bos_token"].string,
                                  golden["eos_token"].string);
}

TEST(ChatTemplateGoldenTest, AllGoldenFilesArePresent) {
  std::set<std::string> names;
  for (const auto& [name, golden] : Goldens()) names.insert(name);
  const std::set<std::string> expected = {"chatml",
                                          "chatml-bos",
                                          "chatml-escaped",
                                          "codellama-instruct",
                                          "llama2",
                                          "llama3",
                                          "llama3.1",
                                          "llama3.1-2407",
                                          "llama3.2",
                                          "mistral-legacy",
                                          "mistral-legacy-v0.1",
                                          "mistral-v1",
                                          "mistral-v3",
                                          "qwen2",
                                          "qwen2.5",
                                          "smollm2"};
  EXPECT_EQ(names, expected) << "in " << TestDataDir();
}

// The heart of it: every real template is recognised as what it is, and
// renders every conversation exactly as Jinja2 did.
TEST(ChatTemplateGoldenTest, RecognisesAndRendersLikeJinja) {
  for (const auto& [name, golden] : Goldens()) {
    SCOPED_TRACE(golden.file);
    const Json& json = golden.json;
    absl::StatusOr<ChatTemplate> chat = FromGolden(json);
    ASSERT_TRUE(chat.ok()) << chat.status();
    const Json& expect = json["expect"];
    EXPECT_EQ(chat->family_name(), expect["family"].string);
    EXPECT_EQ(chat->variant_name(), expect["variant"].string);
    EXPECT_EQ(chat->renders_bos(), expect["renders_bos"].boolean);
    if (expect["default_system_prompt"].kind == Json::Kind::kNull) {
      EXPECT_FALSE(chat->default_system_prompt().has_value());
    } else {
      EXPECT_EQ(chat->default_system_prompt(),
                expect["default_system_prompt"].string);
    }
    EXPECT_EQ(chat->bos_token(), json["bos_token"].string);
    EXPECT_EQ(chat->eos_token(), json["eos_token"].string);
    ExpectRendersGolden(*chat, json);
  }
}

TEST(ChatTemplateGoldenTest, FamilyEnumMatchesName) {
  for (const auto& [name, golden] : Goldens()) {
    absl::StatusOr<ChatTemplate> chat = FromGolden(golden.json);
    ASSERT_TRUE(chat.ok()) << name << ": " << chat.status();
    EXPECT_EQ(ChatTemplateFamilyName(chat->family()), chat->family_name());
  }
  EXPECT_EQ(ChatTemplateFamilyName(ChatTemplateFamily::kChatMl), "chatml");
  EXPECT_EQ(ChatTemplateFamilyName(ChatTemplateFamily::kLlama3), "llama3");
  EXPECT_EQ(ChatTemplateFamilyName(ChatTemplateFamily::kLlama2), "llama2");
  EXPECT_EQ(ChatTemplateFamilyName(ChatTemplateFamily::kMistral), "mistral");
}

// Spellings Jinja reads the same way are recognised too, and render the
// golden text. (tools/gen_chat_template_goldens.py checks with Jinja that
// each of these spellings renders exactly like the original.)
TEST(ChatTemplateGoldenTest, EquivalentSpellingsRenderTheSame) {
  for (const auto& [name, golden] : Goldens()) {
    const std::string& source = golden.json["template"].string;
    const std::vector<std::pair<std::string, std::string>> spellings = {
        {"CRLF line ends", absl::StrReplaceAll(source, {{"\n", "\r\n"}})},
        {"one more final newline", source + "\n"},
        {"no spaces around +", absl::StrReplaceAll(source, {{" + ", "+"}})},
    };
    for (const auto& [what, spelling] : spellings) {
      SCOPED_TRACE(absl::StrCat(name, ", ", what));
      absl::StatusOr<ChatTemplate> chat =
          ChatTemplate::FromSource(spelling, golden.json["bos_token"].string,
                                   golden.json["eos_token"].string);
      ASSERT_TRUE(chat.ok()) << chat.status();
      EXPECT_EQ(chat->variant_name(), golden.json["expect"]["variant"].string);
      ExpectRendersGolden(*chat, golden.json);
    }
  }
}

// Edits that change what Jinja would render must make the template unknown.
TEST(ChatTemplateDetectionTest, RejectsNearMisses) {
  struct Edit {
    std::string golden;
    std::string from;
    std::string to;
    std::string becomes = "";  // another known variant, or "": unknown
  };
  const std::vector<Edit> edits = {
      // ChatML: the default system prompt on the last turn instead.
      {"smollm2", "loop.first", "loop.last"},
      {"smollm2", "messages[0]['role'] != 'system'",
       "messages[0]['role'] != 'user'"},
      // An extra EOS at the end.
      {"chatml", "{% endif %}", "{% endif %}{{ eos_token }}"},
      // Always the generation prompt.
      {"chatml", "{% if add_generation_prompt %}", "{% if true %}"},
      {"qwen2.5", "(message.role == \"system\" and not loop.first)",
       "(message.role == \"system\")"},
      // Llama 3: content no longer trimmed.
      {"llama3", "message['content'] | trim", "message['content']"},
      {"llama3.1", "message['content'] | trim", "message['content']"},
      // A whitespace-control sign dropped: the newline before it now shows.
      {"llama3.1", "{{- \"<|eot_id|>\" }}", "{{ \"<|eot_id|>\" }}"},
      {"llama3.1", "{{- system_message }}", "{{- system_message | upper }}"},
      // Another date format.
      {"llama3.2", "\"%d %b %Y\"", "\"%d %B %Y\""},
      {"llama2", "' [/INST]'", "' [/INST] '"},
      {"llama2", "bos_token + '[INST] '", "'[INST] '"},
      {"mistral-legacy", "eos_token}}", "eos_token + '\\n'}}"},
      // ...and this edit turns one known template into another.
      {"mistral-legacy", "eos_token}}", "eos_token + ' ' }}",
       "mistral-legacy-v0.1"},
      {"mistral-v1", "loop.first and system_message", "system_message"},
      {"mistral-v3", "\"[/INST]\" }}", "\"[/INST] \" }}"},
      {"mistral-v3", "message[\"content\"]|trim", "message[\"content\"]"},
      // Text after the last tag.
      {"llama3", "<|end_header_id|>\n\n' }}{% endif %}",
       "<|end_header_id|>\n\n' }}{% endif %}x"},
  };
  for (const Edit& edit : edits) {
    SCOPED_TRACE(absl::StrCat(edit.golden, ": ", edit.from, " -> ", edit.to));
    const Json& golden = GoldenOrDie(edit.golden);
    const std::string& source = golden["template"].string;
    ASSERT_TRUE(absl::StrContains(source, edit.from));
    const std::string edited =
        absl::StrReplaceAll(source, {{edit.from, edit.to}});
    absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromSource(
        edited, golden["bos_token"].string, golden["eos_token"].string);
    if (edit.becomes.empty()) {
      EXPECT_EQ(chat.status().code(), absl::StatusCode::kUnimplemented)
          << (chat.ok() ? std::string(chat->variant_name())
                        : chat.status().ToString());
    } else {
      ASSERT_TRUE(chat.ok()) << chat.status();
      EXPECT_EQ(chat->variant_name(), edit.becomes);
    }
  }
}

TEST(ChatTemplateDetectionTest, RejectsOtherRealTemplates) {
  absl::StatusOr<Json> json = ReadJson(TestDataDir() + "/unrecognized.json");
  ASSERT_TRUE(json.ok()) << json.status();
  ASSERT_GE(json->array.size(), 10u);
  // The family the error message names, by marker.
  const std::map<std::string, std::string> hints = {
      {"qwen3", "ChatML"},
      {"cat-llama3-chatml", "ChatML"},
      {"llama3.1-no-trim", "Llama 3"},
      {"llama3-no-generation-condition", "Llama 3"},
      {"vigogne2-llama2-default-system", "Llama 2"},
      {"mistral-nemo", "Mistral"},
  };
  for (const Json& entry : json->array) {
    SCOPED_TRACE(entry["name"].string);
    absl::StatusOr<ChatTemplate> chat =
        ChatTemplate::FromSource(entry["template"].string, "<s>", "</s>");
    ASSERT_EQ(chat.status().code(), absl::StatusCode::kUnimplemented)
        << (chat.ok() ? std::string(chat->variant_name())
                      : chat.status().ToString());
    EXPECT_TRUE(absl::StrContains(chat.status().message(), "FromFamilyName") ||
                absl::StrContains(chat.status().message(), "explicitly"));
    auto hint = hints.find(entry["name"].string);
    if (hint != hints.end()) {
      EXPECT_TRUE(absl::StrContains(
          chat.status().message(),
          absl::StrCat("suggest the ", hint->second, " family")))
          << chat.status();
    }
  }
}

TEST(ChatTemplateDetectionTest, RejectsEmptyAndMalformedSources) {
  for (const std::string& source :
       {std::string(), std::string("hello"), std::string("{{ 'open"),
        std::string("{% raw %}{{ x }}{% endraw %}"), std::string("{{ x ]}}"),
        std::string("{# open comment"), std::string("\xff\xfe{{ x }}"),
        std::string("{{ '\\N{BULLET}' }}")}) {
    SCOPED_TRACE(source);
    absl::StatusOr<ChatTemplate> chat =
        ChatTemplate::FromSource(source, "", "");
    EXPECT_EQ(chat.status().code(), absl::StatusCode::kUnimplemented)
        << chat.status();
  }
}

// A ChatML template with its own default system prompt: the prompt is read
// from the source and rendered.
TEST(ChatTemplateDetectionTest, ReadsDefaultSystemPromptFromTheTemplate) {
  const Json& smollm2 = GoldenOrDie("smollm2");
  const std::string source = absl::StrReplaceAll(
      smollm2["template"].string,
      {{"You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        "Tu es un assistant \\u00e9l\\u00e8ve \\\"SmolLM\\\"."}});
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromSource(source, "", "");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->variant_name(), "chatml-default-system");
  EXPECT_EQ(chat->default_system_prompt(),
            "Tu es un assistant \xc3\xa9l\xc3\xa8ve \"SmolLM\".");
  absl::StatusOr<std::string> rendered =
      chat->Render({{"user", "Salut"}}, true);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered,
            "<|im_start|>system\nTu es un assistant \xc3\xa9l\xc3\xa8ve "
            "\"SmolLM\".<|im_end|>\n<|im_start|>user\nSalut<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateDetectionTest, ReadsCutoffAndDefaultDateFromTheTemplate) {
  const Json& llama31 = GoldenOrDie("llama3.1");
  const std::string source = absl::StrReplaceAll(
      llama31["template"].string,
      {{"December 2023", "June 2024"}, {"\"26 Jul 2024\"", "\"01 Jan 2030\""}});
  absl::StatusOr<ChatTemplate> chat =
      ChatTemplate::FromSource(source, "<B>", "<E>");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->variant_name(), "llama3.1");
  absl::StatusOr<std::string> rendered = chat->Render({{"user", "hi"}}, false);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered,
            "<B><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: June 2024\nToday Date: 01 Jan 2030\n\n"
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi"
            "<|eot_id|>");
}

// ---------------------------------------------------------------------------
// Rendering rules that the goldens cannot pin down.
// ---------------------------------------------------------------------------

// strftime("%d %b %Y") in the C locale, for the local date now.
std::string LocalDateNow() {
  const time_t now = time(nullptr);
  struct tm local;
  localtime_r(&now, &local);
  char buffer[64];
  strftime(buffer, sizeof(buffer), "%d %b %Y", &local);
  return buffer;
}

TEST(ChatTemplateRenderTest, Llama32UsesTodaysLocalDateByDefault) {
  const Json& golden = GoldenOrDie("llama3.2");
  absl::StatusOr<ChatTemplate> chat = FromGolden(golden);
  ASSERT_TRUE(chat.ok()) << chat.status();
  const std::vector<ChatMessage> messages = {{"system", "S"}, {"user", "U"}};
  const std::string before = LocalDateNow();
  absl::StatusOr<std::string> rendered = chat->Render(messages, true);
  const std::string after = LocalDateNow();
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  ChatRenderOptions options;
  options.date_string = before;
  absl::StatusOr<std::string> with_before =
      chat->Render(messages, true, options);
  options.date_string = after;
  absl::StatusOr<std::string> with_after =
      chat->Render(messages, true, options);
  ASSERT_TRUE(with_before.ok() && with_after.ok());
  EXPECT_TRUE(*rendered == *with_before || *rendered == *with_after)
      << *rendered;
  EXPECT_TRUE(
      absl::StrContains(*rendered, "\nToday Date: " + before + "\n\n") ||
      absl::StrContains(*rendered, "\nToday Date: " + after + "\n\n"))
      << *rendered;
}

TEST(ChatTemplateRenderTest, Llama31UsesItsDefaultDateUnlessGivenOne) {
  absl::StatusOr<ChatTemplate> chat = FromGolden(GoldenOrDie("llama3.1"));
  ASSERT_TRUE(chat.ok()) << chat.status();
  absl::StatusOr<std::string> rendered = chat->Render({{"user", "U"}}, false);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_TRUE(absl::StrContains(*rendered, "Today Date: 26 Jul 2024\n\n"));
}

TEST(ChatTemplateRenderTest, RejectsBadConversations) {
  for (const auto& [name, golden] : Goldens()) {
    SCOPED_TRACE(name);
    absl::StatusOr<ChatTemplate> chat = FromGolden(golden.json);
    ASSERT_TRUE(chat.ok()) << chat.status();
    EXPECT_EQ(chat->Render({}, true).status().code(),
              absl::StatusCode::kInvalidArgument);
    for (const std::string& role :
         std::vector<std::string>{"tool", "User", "", "developer", "ipython",
                                  std::string("us\0er", 5)}) {
      absl::StatusOr<std::string> rendered =
          chat->Render({{"user", "hi"}, {role, "x"}}, true);
      EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument)
          << role;
      EXPECT_TRUE(absl::StrContains(rendered.status().message(), "role"));
    }
    absl::StatusOr<std::string> bad_utf8 =
        chat->Render({{"user", "caf\xc3"}}, true);
    EXPECT_EQ(bad_utf8.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(bad_utf8.status().message(), "UTF-8"));
  }
}

TEST(ChatTemplateRenderTest, AlternationErrorsCarryTheTemplatesMessage) {
  const std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  for (const auto& [name, message] :
       std::vector<std::pair<std::string, std::string>>{
           {"llama2",
            "Conversation roles must alternate "
            "user/assistant/user/assistant/..."},
           {"mistral-legacy",
            "Conversation roles must alternate "
            "user/assistant/user/assistant/..."},
           {"mistral-v3",
            "After the optional system message, conversation roles must "
            "alternate user/assistant/user/assistant/..."}}) {
    absl::StatusOr<ChatTemplate> chat = FromGolden(GoldenOrDie(name));
    ASSERT_TRUE(chat.ok()) << chat.status();
    absl::StatusOr<std::string> rendered = chat->Render(two_users, true);
    EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), message))
        << rendered.status();
  }
}

// ---------------------------------------------------------------------------
// Explicit overrides.
// ---------------------------------------------------------------------------

TEST(ChatTemplateOverrideTest, NamesRenderLikeTheirTemplates) {
  const std::vector<std::string> expected_names = {"chatml",
                                                   "chatml-bos",
                                                   "llama3",
                                                   "llama3.1",
                                                   "llama3.2",
                                                   "llama2",
                                                   "mistral-legacy-v0.1",
                                                   "mistral-legacy",
                                                   "mistral-v1",
                                                   "mistral-v3"};
  EXPECT_EQ(ChatTemplate::OverrideNames(), expected_names);
  for (const std::string& name : expected_names) {
    SCOPED_TRACE(name);
    const Json& golden = GoldenOrDie(name);
    absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromFamilyName(
        name, golden["bos_token"].string, golden["eos_token"].string);
    ASSERT_TRUE(chat.ok()) << chat.status();
    EXPECT_EQ(chat->variant_name(), name);
    EXPECT_EQ(chat->family_name(), golden["expect"]["family"].string);
    EXPECT_EQ(chat->renders_bos(), golden["expect"]["renders_bos"].boolean);
    EXPECT_FALSE(chat->default_system_prompt().has_value());
    ExpectRendersGolden(*chat, golden);
  }
}

TEST(ChatTemplateOverrideTest, RejectsOtherNames) {
  for (const std::string name :
       {"", "mistral", "chatml-default-system", "qwen2.5", "LLAMA3", "gemma"}) {
    absl::StatusOr<ChatTemplate> chat =
        ChatTemplate::FromFamilyName(name, "<s>", "</s>");
    EXPECT_EQ(chat.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(absl::StrContains(chat.status().message(), "mistral-v3"));
  }
}

// ---------------------------------------------------------------------------
// GGUF files.
// ---------------------------------------------------------------------------

absl::StatusOr<std::string> WriteGguf(
    const std::string& name,
    const std::vector<std::pair<std::string, GgufValue>>& metadata) {
  absl::StatusOr<std::unique_ptr<GgufWriter>> writer = GgufWriter::Create();
  if (!writer.ok()) return writer.status();
  for (const auto& [key, value] : metadata) {
    absl::Status status = (*writer)->AddMetadata(key, value);
    if (!status.ok()) return status;
  }
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  absl::Status status = (*writer)->WriteFile(path);
  if (!status.ok()) return status;
  return path;
}

TEST(ChatTemplateGgufTest, ReadsTemplateAndTokenTexts) {
  const Json& golden = GoldenOrDie("llama2");
  absl::StatusOr<std::string> path = WriteGguf(
      "chat_llama2.gguf",
      {{"general.architecture", std::string("llama")},
       {"tokenizer.ggml.tokens",
        GgufValue::ArrayOf(std::vector<std::string>{"<unk>", "<s>", "</s>"})},
       {"tokenizer.ggml.bos_token_id", uint32_t{1}},
       {"tokenizer.ggml.eos_token_id", uint32_t{2}},
       {"tokenizer.chat_template", golden["template"].string}});
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(*path);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromGguf(**file);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->variant_name(), "llama2");
  EXPECT_EQ(chat->bos_token(), "<s>");
  EXPECT_EQ(chat->eos_token(), "</s>");
  ExpectRendersGolden(*chat, golden);
}

TEST(ChatTemplateGgufTest, ErrorsForMissingPieces) {
  absl::StatusOr<std::string> no_template = WriteGguf(
      "chat_none.gguf", {{"general.architecture", std::string("llama")}});
  ASSERT_TRUE(no_template.ok()) << no_template.status();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(*no_template);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(ChatTemplate::FromGguf(**file).status().code(),
            absl::StatusCode::kNotFound);

  // Llama 2 needs BOS and EOS texts; this file has no token ids.
  absl::StatusOr<std::string> no_ids = WriteGguf(
      "chat_no_ids.gguf",
      {{"general.architecture", std::string("llama")},
       {"tokenizer.chat_template", GoldenOrDie("llama2")["template"].string}});
  ASSERT_TRUE(no_ids.ok()) << no_ids.status();
  file = GgufFile::Open(*no_ids);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(ChatTemplate::FromGguf(**file).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // ...which plain ChatML does not need.
  absl::StatusOr<std::string> chatml = WriteGguf(
      "chat_chatml.gguf",
      {{"general.architecture", std::string("llama")},
       {"tokenizer.chat_template", GoldenOrDie("chatml")["template"].string}});
  ASSERT_TRUE(chatml.ok()) << chatml.status();
  file = GgufFile::Open(*chatml);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromGguf(**file);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->variant_name(), "chatml");

  // A token id past the vocabulary.
  absl::StatusOr<std::string> bad_id = WriteGguf(
      "chat_bad_id.gguf",
      {{"general.architecture", std::string("llama")},
       {"tokenizer.ggml.tokens",
        GgufValue::ArrayOf(std::vector<std::string>{"<s>"})},
       {"tokenizer.ggml.bos_token_id", uint32_t{7}},
       {"tokenizer.chat_template", GoldenOrDie("llama3")["template"].string}});
  ASSERT_TRUE(bad_id.ok()) << bad_id.status();
  file = GgufFile::Open(*bad_id);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(ChatTemplate::FromGguf(**file).status().code(),
            absl::StatusCode::kInvalidArgument);

  // An unknown template: the error names the file.
  absl::StatusOr<std::string> unknown =
      WriteGguf("chat_unknown.gguf",
                {{"general.architecture", std::string("llama")},
                 {"tokenizer.chat_template", std::string("{{ messages }}")}});
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  file = GgufFile::Open(*unknown);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ChatTemplate> unknown_chat = ChatTemplate::FromGguf(**file);
  EXPECT_EQ(unknown_chat.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(unknown_chat.status().message(), *unknown));
}

// The default model's own template and token texts.
TEST(ChatTemplateGgufTest, DefaultModel) {
  const std::string path = FindDefaultModel();
  if (path.empty()) GTEST_SKIP() << kNoDefaultModel;
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromGguf(**file);
  ASSERT_TRUE(chat.ok()) << chat.status();
  const Json& golden = GoldenOrDie("smollm2");
  EXPECT_EQ(chat->variant_name(), "chatml-default-system");
  EXPECT_EQ(chat->default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face");
  EXPECT_FALSE(chat->renders_bos());
  EXPECT_EQ(chat->bos_token(), "<|im_start|>");
  EXPECT_EQ(chat->eos_token(), "<|im_end|>");
  absl::StatusOr<std::string> source =
      (*file)->GetString("tokenizer.chat_template");
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(*source, golden["template"].string);
  ExpectRendersGolden(*chat, golden);
}

}  // namespace
}  // namespace pdserve::model
