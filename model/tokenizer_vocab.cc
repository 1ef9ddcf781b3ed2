// Loading a Tokenizer from a GGUF file's tokenizer.ggml.* metadata, as
// llama.cpp's llama_vocab::load does (defaults, pre-tokenizer flags, special
// tokens recognised by their text, per-model token attributes), and the
// lookups over the loaded vocabulary.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace pdserve::model {
namespace {

using tokenizer_internal::kAttrByte;
using tokenizer_internal::kAttrControl;
using tokenizer_internal::kAttrHidden;
using tokenizer_internal::kAttrLstrip;
using tokenizer_internal::kAttrNormal;
using tokenizer_internal::kAttrRstrip;
using tokenizer_internal::kAttrUnknown;
using tokenizer_internal::kAttrUnused;
using tokenizer_internal::kAttrUserDefined;
using tokenizer_internal::kSpmSpace;
using tokenizer_internal::MergeKey;

// tokenizer.ggml.token_type values -> attributes.
uint32_t AttrFromTokenType(int32_t type) {
  switch (type) {
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return 0;  // undefined
  }
}

constexpr char kKeyModel[] = "tokenizer.ggml.model";
constexpr char kKeyPre[] = "tokenizer.ggml.pre";
constexpr char kKeyTokens[] = "tokenizer.ggml.tokens";
constexpr char kKeyScores[] = "tokenizer.ggml.scores";
constexpr char kKeyTokenType[] = "tokenizer.ggml.token_type";
constexpr char kKeyMerges[] = "tokenizer.ggml.merges";
constexpr char kKeyAddBos[] = "tokenizer.ggml.add_bos_token";
constexpr char kKeyAddEos[] = "tokenizer.ggml.add_eos_token";
constexpr char kKeyAddSpacePrefix[] = "tokenizer.ggml.add_space_prefix";

// ---- Pre-tokenizers --------------------------------------------------------

using Rule = PreTokenizerRule;

struct PreTokenizerConfig {
  const char* name;
  std::vector<Rule> rules;
  bool clean_spaces;
  bool ignore_merges;
  bool add_bos;
  // chatglm: no BOS unless the file names one.
  bool no_default_bos;
};

// The llama.cpp pre-tokenizer names whose regexes PreTokenize reproduces,
// with the vocabulary flags llama.cpp sets for each (llama_vocab::load).
const std::vector<PreTokenizerConfig>& PreTokenizerConfigs() {
  static const auto* configs = [] {
    const std::vector<Rule> kDefault = {Rule::kPunctuationRuns, Rule::kGpt2,
                                        Rule::kNumberRuns,
                                        Rule::kAsciiDigitTriples};
    const std::vector<Rule> kGpt2 = {Rule::kGpt2};
    const std::vector<Rule> kStarcoder = {Rule::kIsolateNumbers, Rule::kGpt2};
    const std::vector<Rule> kFalcon = {Rule::kPunctuationRunsWithBacktick,
                                       Rule::kGpt2, Rule::kAsciiDigitTriples};
    const std::vector<Rule> kLlama3 = {Rule::kLlama3};
    const std::vector<Rule> kQwen2 = {Rule::kQwen2};
    const std::vector<Rule> kQwen35 = {Rule::kQwen35};
    const std::vector<Rule> kLaguna = {Rule::kNewlineRuns, Rule::kQwen2};
    auto* v = new std::vector<PreTokenizerConfig>;
    auto add = [v](const char* name, const std::vector<Rule>& rules,
                   bool clean_spaces, bool ignore_merges = false,
                   bool add_bos = false, bool no_default_bos = false) {
      v->push_back(
          {name, rules, clean_spaces, ignore_merges, add_bos, no_default_bos});
    };
    add("default", kDefault, true);
    for (const char* name :
         {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
          "midm-2.0", "lfm2", "jina-v5-nano"}) {
      add(name, kLlama3, true, /*ignore_merges=*/true, /*add_bos=*/true);
    }
    add("dbrx", kLlama3, true);
    add("smaug-bpe", kLlama3, true);
    add("chatglm-bpe", kLlama3, true, false, false, /*no_default_bos=*/true);
    add("glm4", kLlama3, true, /*ignore_merges=*/true, false, true);
    add("glm5", kLlama3, true, /*ignore_merges=*/true, false, true);
    add("falcon", kFalcon, true);
    for (const char* name :
         {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
          "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "jina-v1-en",
          "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4"}) {
      add(name, kGpt2, true);
    }
    add("trillion", kGpt2, false);
    add("granite-docling", kGpt2, false);
    for (const char* name : {"starcoder", "refact", "codeshell", "exaone",
                             "minerva-7b", "mellum2"}) {
      add(name, kStarcoder, true);
    }
    add("command-r", kStarcoder, false);
    add("smollm", kStarcoder, false);
    for (const char* name : {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2",
                             "hunyuan", "solar-open", "grok-2"}) {
      add(name, kQwen2, false);
    }
    add("stablelm2", kQwen2, true);
    add("megrez", kQwen2, true);
    add("qwen35", kQwen35, false);
    add("laguna", kLaguna, false);
    return v;
  }();
  return *configs;
}

// ---- Texts llama.cpp recognises (llama_vocab::impl::load) ----------------

const std::vector<absl::string_view>& EotTexts() {
  static const auto* v = new std::vector<absl::string_view>{
      "<|eot_id|>",
      "<|im_end|>",
      "<|end|>",
      "<end_of_turn>",
      "<|endoftext|>",
      "<|end_of_text|>",
      "<EOT>",
      "_<EOT>",
      "[EOT]",
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
      "<end_of_utterance>"};
  return *v;
}

const std::vector<absl::string_view>& EogTexts() {
  static const auto* v = new std::vector<absl::string_view>{
      "<|eot_id|>",
      "<|im_end|>",
      "<|end|>",
      "<|return|>",
      "<|call|>",
      "<|flush|>",
      "<|calls|>",
      "<end_of_turn>",
      "<|endoftext|>",
      "</s>",
      "<|eom_id|>",
      "<EOT>",
      "_<EOT>",
      "[EOT]",
      "[EOS]",
      "<|end_of_text|>",
      "<end_of_utterance>",
      "<eos>",
      "<turn|>",
      "<|tool_response>",
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
      "[e~["};
  return *v;
}

}  // namespace

// ---- Loading ---------------------------------------------------------------

std::vector<std::string> Tokenizer::PreTokenizerNames() {
  std::vector<std::string> names;
  for (const PreTokenizerConfig& c : PreTokenizerConfigs()) {
    names.push_back(c.name);
  }
  return names;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(
    const GgufFile& file) {
  std::unique_ptr<Tokenizer> t(new Tokenizer);
  PD_ASSIGN_OR_RETURN(const std::string model, file.GetString(kKeyModel));
  std::string pre;
  if (file.HasMetadata(kKeyPre)) {
    PD_ASSIGN_OR_RETURN(pre, file.GetString(kKeyPre));
  }
  if (model == "llama") {
    t->type_ = Type::kSpm;
    t->bos_id_ = 1;
    t->eos_id_ = 2;
    t->unk_id_ = 0;
    t->add_space_prefix_ = true;
    t->clean_spaces_ = false;
    t->add_bos_ = true;
  } else if (model == "gpt2") {
    t->type_ = Type::kBpe;
    t->bos_id_ = 11;
    t->eos_id_ = 11;
    t->add_space_prefix_ = false;
    if (pre.empty()) pre = "default";
    const PreTokenizerConfig* config = nullptr;
    for (const PreTokenizerConfig& c : PreTokenizerConfigs()) {
      if (pre == c.name) config = &c;
    }
    if (config == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown pre-tokenizer '", pre, "' (", kKeyPre, ") in ", file.path(),
          "; supported: ", absl::StrJoin(PreTokenizerNames(), ", ")));
    }
    t->pre_ = pre;
    t->pre_rules_ = config->rules;
    t->clean_spaces_ = config->clean_spaces;
    t->ignore_merges_ = config->ignore_merges;
    t->add_bos_ = config->add_bos;
    if (config->no_default_bos) t->bos_id_ = kNoToken;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tokenizer model '", model, "' (", kKeyModel,
                     ") in ", file.path(), "; supported: gpt2, llama"));
  }
  if (file.HasMetadata(kKeyAddSpacePrefix)) {
    PD_ASSIGN_OR_RETURN(t->add_space_prefix_, file.GetBool(kKeyAddSpacePrefix));
  }
  PD_RETURN_IF_ERROR(t->LoadVocab(file));
  if (t->type_ == Type::kBpe) PD_RETURN_IF_ERROR(t->LoadMerges(file));
  PD_RETURN_IF_ERROR(t->LoadSpecialIds(file));
  t->DetectSpecialTokensByText();
  t->BuildCaches();
  PD_RETURN_IF_ERROR(t->ApplyModelSpecificAttributes(file));
  return t;
}

absl::Status Tokenizer::LoadVocab(const GgufFile& file) {
  PD_ASSIGN_OR_RETURN(const GgufArray* texts, file.GetArray(kKeyTokens));
  const std::vector<std::string>* words = texts->get_if<std::string>();
  if (words == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", kKeyTokens, " has type array[",
                     GgufValueTypeName(texts->element_type()),
                     "], expected array[string] in ", file.path()));
  }
  const size_t n = words->size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key ", kKeyTokens, " holds ", n, " tokens in ", file.path()));
  }

  std::vector<float> scores;
  if (file.HasMetadata(kKeyScores)) {
    PD_ASSIGN_OR_RETURN(const GgufArray* array, file.GetArray(kKeyScores));
    if (const auto* ints = array->get_if<int32_t>()) {
      scores.assign(ints->begin(), ints->end());
    } else if (array->get_if<float>() != nullptr ||
               array->get_if<double>() != nullptr) {
      PD_ASSIGN_OR_RETURN(scores, file.GetF32Array(kKeyScores));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "key ", kKeyScores, " has type array[",
          GgufValueTypeName(array->element_type()),
          "], expected array[float32] or array[int32] in ", file.path()));
    }
    if (scores.size() < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", kKeyScores, " holds ", scores.size(),
                       " scores for ", n, " tokens in ", file.path()));
    }
  }
  std::vector<int32_t> types;
  if (file.HasMetadata(kKeyTokenType)) {
    PD_ASSIGN_OR_RETURN(types, file.GetI32Array(kKeyTokenType));
    if (types.size() < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", kKeyTokenType, " holds ", types.size(),
                       " types for ", n, " tokens in ", file.path()));
    }
  }

  tokens_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Token& token = tokens_[i];
    token.text =
        (*words)[i].empty() ? absl::StrCat("[EMPTY_", i, "]") : (*words)[i];
    token.score = scores.empty() ? 0.0f : scores[i];
    token.attr = types.empty() ? kAttrNormal : AttrFromTokenType(types[i]);
  }
  token_ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] =
        token_ids_.emplace(tokens_[i].text, static_cast<TokenId>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate token text '",
                       absl::CHexEscape(tokens_[i].text), "' (ids ", it->second,
                       " and ", i, ") in ", kKeyTokens, " of ", file.path()));
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (type_ == Type::kBpe) {
      byte_tokens_[b] = Find(ByteToUnicodeUtf8(static_cast<uint8_t>(b)));
    } else {
      byte_tokens_[b] = Find(absl::StrFormat("<0x%02X>", b));
      if (byte_tokens_[b] == kNoToken) {
        byte_tokens_[b] = Find(std::string(1, static_cast<char>(b)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::LoadMerges(const GgufFile& file) {
  PD_ASSIGN_OR_RETURN(const GgufArray* array, file.GetArray(kKeyMerges));
  const std::vector<std::string>* merges = array->get_if<std::string>();
  if (merges == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", kKeyMerges, " has type array[",
                     GgufValueTypeName(array->element_type()),
                     "], expected array[string] in ", file.path()));
  }
  merges_.reserve(merges->size());
  std::string joined;
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& merge = (*merges)[i];
    // The first space after the first byte separates the two parts, as in
    // llama.cpp.
    const size_t space = merge.find(' ', 1);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", i, " '", absl::CHexEscape(merge), "' of ",
                       kKeyMerges, " in ", file.path(), " ", why));
    };
    if (space == std::string::npos) return bad("is not of the form 'A B'");
    const absl::string_view left(merge.data(), space);
    const absl::string_view right = absl::string_view(merge).substr(space + 1);
    const TokenId left_id = Find(left);
    const TokenId right_id = Find(right);
    if (left_id == kNoToken) {
      return bad(
          absl::StrCat("names unknown token '", absl::CHexEscape(left), "'"));
    }
    if (right_id == kNoToken) {
      return bad(
          absl::StrCat("names unknown token '", absl::CHexEscape(right), "'"));
    }
    joined.assign(left.data(), left.size());
    joined.append(right.data(), right.size());
    // The first of duplicate merges keeps its rank, as in llama.cpp.
    merges_.try_emplace(MergeKey(left_id, right_id),
                        Merge{static_cast<int32_t>(i), Find(joined)});
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::LoadSpecialIds(const GgufFile& file) {
  const TokenId n = vocab_size();
  struct Key {
    const char* name;
    TokenId* id;
  };
  const Key keys[] = {
      {"tokenizer.ggml.bos_token_id", &bos_id_},
      {"tokenizer.ggml.eos_token_id", &eos_id_},
      {"tokenizer.ggml.eot_token_id", &eot_id_},
      {"tokenizer.ggml.eom_token_id", &eom_id_},
      {"tokenizer.ggml.unknown_token_id", &unk_id_},
      {"tokenizer.ggml.padding_token_id", &pad_id_},
      {"tokenizer.ggml.fim_pre_token_id", &fim_pre_id_},
      {"tokenizer.ggml.fim_suf_token_id", &fim_suf_id_},
      {"tokenizer.ggml.fim_mid_token_id", &fim_mid_id_},
      {"tokenizer.ggml.fim_pad_token_id", &fim_pad_id_},
      {"tokenizer.ggml.fim_rep_token_id", &fim_rep_id_},
      {"tokenizer.ggml.fim_sep_token_id", &fim_sep_id_},
      // Deprecated names, read last so that they win, as in llama.cpp.
      {"tokenizer.ggml.prefix_token_id", &fim_pre_id_},
      {"tokenizer.ggml.suffix_token_id", &fim_suf_id_},
      {"tokenizer.ggml.middle_token_id", &fim_mid_id_},
  };
  for (const Key& key : keys) {
    if (*key.id >= n) *key.id = kNoToken;  // default out of range
    if (!file.HasMetadata(key.name)) continue;
    PD_ASSIGN_OR_RETURN(const uint32_t id, file.GetU32(key.name));
    // llama.cpp ignores an out-of-range id and keeps the default.
    if (id < static_cast<uint32_t>(n)) *key.id = static_cast<TokenId>(id);
  }
  if (file.HasMetadata(kKeyAddBos)) {
    PD_ASSIGN_OR_RETURN(add_bos_, file.GetBool(kKeyAddBos));
  }
  if (file.HasMetadata(kKeyAddEos)) {
    PD_ASSIGN_OR_RETURN(add_eos_, file.GetBool(kKeyAddEos));
  }
  return absl::OkStatus();
}

void Tokenizer::DetectSpecialTokensByText() {
  // The lowest id among the tokens with one of `texts`, or kNoToken.
  auto lowest = [&](absl::Span<const absl::string_view> texts) {
    TokenId best = kNoToken;
    for (absl::string_view text : texts) {
      const TokenId id = Find(text);
      if (id != kNoToken && (best == kNoToken || id < best)) best = id;
    }
    return best;
  };
  auto detect = [&](TokenId* id, std::vector<absl::string_view> texts) {
    if (*id != kNoToken) return;
    *id = lowest(texts);
    if (*id != kNoToken) tokens_[*id].attr |= kAttrControl;
  };
  detect(&eot_id_, EotTexts());
  detect(&eom_id_, {"<|eom_id|>"});
  detect(&fim_pre_id_,
         {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
          "<\xEF\xBD\x9C"
          "fim\xE2\x96\x81"
          "begin\xEF\xBD\x9C>",
          "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect(&fim_suf_id_,
         {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
          "<\xEF\xBD\x9C"
          "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
          "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect(&fim_mid_id_,
         {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
          "<\xEF\xBD\x9C"
          "fim\xE2\x96\x81"
          "end\xEF\xBD\x9C>",
          "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
  detect(&fim_pad_id_,
         {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(&fim_rep_id_, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                        "<reponame>"});
  detect(&fim_sep_id_, {"<|file_sep|>"});

  std::vector<bool> eog(tokens_.size(), false);
  for (TokenId id : {fim_pad_id_, fim_rep_id_, fim_sep_id_}) {
    if (id != kNoToken) eog[id] = true;
  }
  for (absl::string_view text : EogTexts()) {
    const TokenId id = Find(text);
    if (id == kNoToken) continue;
    eog[id] = true;
    tokens_[id].attr |= kAttrControl;
  }
  // gpt-oss: rendered even when special tokens are not.
  for (absl::string_view text :
       {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    const TokenId id = Find(text);
    if (id != kNoToken) tokens_[id].attr = kAttrUserDefined;
  }
  for (TokenId id : {eos_id_, eot_id_, eom_id_}) {
    if (id != kNoToken) eog[id] = true;
  }
  auto in_eog = [&](absl::string_view text) {
    const TokenId id = Find(text);
    return id != kNoToken && eog[id];
  };
  // o200k_harmony and solar-open: "<|end|>" ends a message, not generation.
  const bool has_call = in_eog("<|call|>") || in_eog("<|calls|>");
  if (in_eog("<|end|>") && ((in_eog("<|return|>") && has_call) ||
                            (has_call && in_eog("<|flush|>")))) {
    const TokenId end = Find("<|end|>");
    eog[end] = false;
    tokens_[end].attr = kAttrUserDefined;
  }
  // gemma4 and plamo: "</s>" is a normal token there.
  if (in_eog("</s>") &&
      (in_eog("<|tool_response>") || in_eog("<|plamo:eos|>"))) {
    const TokenId s = Find("</s>");
    eog[s] = false;
    tokens_[s].attr = kAttrNormal;
  }
  eog_ = std::move(eog);
  for (size_t i = 0; i < eog_.size(); ++i) {
    if (eog_[i]) eog_ids_.push_back(static_cast<TokenId>(i));
  }
}

void Tokenizer::BuildCaches() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special_tokens_.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(),
                   [&](TokenId a, TokenId b) {
                     return tokens_[a].text.size() > tokens_[b].text.size();
                   });

  for (Token& token : tokens_) {
    const std::string& text = token.text;
    std::string& piece = token.piece;
    if (token.attr & (kAttrHidden | kAttrUserDefined)) {
      piece = text;
    } else if (token.attr & kAttrNormal) {
      if (type_ == Type::kSpm) {
        piece = absl::StrReplaceAll(text, {{kSpmSpace, " "}});
      } else {
        // Undo the byte-level mapping; a character outside it is spelled
        // out the way llama.cpp does (llama_decode_text).
        for (uint32_t cp : DecodeUtf8Lenient(text)) {
          const int byte = UnicodeToByte(cp);
          if (byte >= 0) {
            piece.push_back(static_cast<char>(byte));
            continue;
          }
          std::string utf8;
          AppendUtf8(cp, &utf8);
          absl::StrAppend(&piece, "[UNK_BYTE_0x");
          for (char c : utf8) {
            absl::StrAppendFormat(&piece, "%02x", static_cast<uint8_t>(c));
          }
          absl::StrAppend(&piece, text, "]");
        }
      }
    } else if (token.attr & kAttrByte) {
      // "<0xXX>": the two characters after "<0x", read as strtol does.
      if (text.size() >= 3) {
        const std::string hex = text.substr(3, 2);
        piece.assign(1,
                     static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
      }
    }
  }
}

absl::Status Tokenizer::ApplyModelSpecificAttributes(const GgufFile& file) {
  std::string name;
  if (file.HasMetadata("general.name")) {
    PD_ASSIGN_OR_RETURN(name, file.GetString("general.name"));
  }
  std::string arch;
  if (file.HasMetadata("general.architecture")) {
    PD_ASSIGN_OR_RETURN(arch, file.GetString("general.architecture"));
  }
  absl::AsciiStrToLower(&name);
  auto set = [&](absl::string_view text, uint32_t attr, bool on) {
    const TokenId id = Find(text);
    if (id == kNoToken) return;
    if (on) {
      tokens_[id].attr |= attr;
    } else {
      tokens_[id].attr &= ~attr;
    }
  };
  // Token attributes llama.cpp sets by model name, affecting how the text
  // around special tokens is split (llama_vocab::impl::load).
  auto contains_any = [](absl::string_view s,
                         std::initializer_list<absl::string_view> parts) {
    for (absl::string_view part : parts) {
      if (absl::StrContains(s, part)) return true;
    }
    return false;
  };
  if (contains_any(pre_, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains_any(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
    set("<mask>", kAttrLstrip, true);
  } else if (contains_any(name, {"phi-3", "phi3"})) {
    for (TokenId id : special_tokens_) tokens_[id].attr |= kAttrRstrip;
    set("</s>", kAttrRstrip, true);
    for (absl::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
      set(text, kAttrRstrip, false);
    }
  } else if (contains_any(name, {"modern-bert"})) {
    set("[MASK]", kAttrLstrip, true);
  }
  return absl::OkStatus();
}

// ---- Lookups ---------------------------------------------------------------

TokenId Tokenizer::Find(absl::string_view text) const {
  auto it = token_ids_.find(text);
  return it == token_ids_.end() ? kNoToken : it->second;
}

bool Tokenizer::IsEndOfGeneration(TokenId id) const {
  return id >= 0 && id < vocab_size() && eog_[id];
}

bool Tokenizer::IsControl(TokenId id) const {
  return id >= 0 && id < vocab_size() && (tokens_[id].attr & kAttrControl);
}

const std::string& Tokenizer::token_text(TokenId id) const {
  static const std::string* const kEmpty = new std::string;
  return id >= 0 && id < vocab_size() ? tokens_[id].text : *kEmpty;
}

absl::StatusOr<TokenId> Tokenizer::TokenIdOf(absl::string_view raw_text) const {
  const TokenId id = Find(raw_text);
  if (id == kNoToken) {
    return absl::NotFoundError(absl::StrCat(
        "no token '", absl::CHexEscape(raw_text), "' in the vocabulary"));
  }
  return id;
}

}  // namespace pdserve::model
