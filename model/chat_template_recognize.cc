// Recognition: which known template (chat_template_sources.cc) a model's
// template is, compared token by token as model/chat_template.h describes,
// and the explicit overrides by name.
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
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "model/chat_template.h"
#include "model/chat_template_variants.h"
#include "model/gguf.h"
#include "model/jinja_lexer.h"

namespace pdserve::model {
namespace {

using chat_template_internal::Info;
using chat_template_internal::KnownTemplate;
using chat_template_internal::KnownTemplates;
using chat_template_internal::kVariants;
using chat_template_internal::Variant;
using chat_template_internal::VariantInfo;

// Meta's values, for the llama3.1 / llama3.2 overrides.
constexpr absl::string_view kMetaKnowledgeCutoff = "December 2023";
constexpr absl::string_view kMetaDefaultDate = "26 Jul 2024";

struct Captures {
  std::optional<std::string> default_system;
  std::optional<std::string> cutoff;
  std::optional<std::string> default_date;
};

bool MatchTokens(const std::vector<JinjaToken>& pattern,
                 const std::vector<JinjaToken>& input, Captures* captures) {
  if (pattern.size() != input.size()) return false;
  Captures found;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const JinjaToken& p = pattern[i];
    const JinjaToken& t = input[i];
    if (p.kind != t.kind) return false;
    const size_t hole = p.kind == JinjaTokenKind::kString ? p.text.find("@@")
                                                          : std::string::npos;
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
  std::vector<JinjaToken> tokens;
};

// The known templates, lexed once. An error here is a bug in
// chat_template_sources.cc (the tests exercise every pattern).
const absl::StatusOr<std::vector<Pattern>>& Patterns() {
  static const absl::StatusOr<std::vector<Pattern>>* const patterns =
      []() -> absl::StatusOr<std::vector<Pattern>>* {
    std::vector<Pattern> result;
    for (const KnownTemplate& known : KnownTemplates()) {
      absl::StatusOr<std::vector<JinjaToken>> tokens =
          LexJinjaTemplate(known.source);
      if (!tokens.ok()) {
        return new absl::StatusOr<std::vector<Pattern>>(absl::InternalError(
            absl::StrCat("known template ", Info(known.variant).name,
                         " does not lex: ", tokens.status().message())));
      }
      result.push_back({known.variant, *std::move(tokens)});
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

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(absl::string_view source,
                                                      std::string bos_token,
                                                      std::string eos_token) {
  const absl::StatusOr<std::vector<Pattern>>& patterns = Patterns();
  if (!patterns.ok()) return patterns.status();
  const absl::StatusOr<std::vector<JinjaToken>> tokens =
      LexJinjaTemplate(source);
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

}  // namespace pdserve::model
