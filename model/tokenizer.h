// Text <-> token ids for the vocabulary stored in a GGUF file's metadata,
// agreeing token for token with llama.cpp (llama_tokenize,
// llama_token_to_piece, llama_detokenize).
//
// Supported `tokenizer.ggml.model` values:
//  - "gpt2": byte-level BPE. Merge ranks come from tokenizer.ggml.merges;
//    the text is first split by the pre-tokenizer named in
//    tokenizer.ggml.pre (PreTokenizerNames() lists the accepted names; an
//    absent key means "default"; any other name is refused, as llama.cpp
//    refuses it).
//  - "llama": SentencePiece BPE with scores (tokenizer.ggml.scores), byte
//    fallback through <0xXX> tokens, spaces escaped as U+2581 and the
//    add_space_prefix rule.
// Token types (tokenizer.ggml.token_type) are llama.cpp's: 1 normal,
// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; absent means all
// normal. Special ids and the add_bos / add_eos / add_space_prefix flags
// default as in llama.cpp and are overridden by the metadata keys. Like
// llama.cpp, some tokens are recognised by their text (e.g. "<|im_end|>",
// "<|eot_id|>", "<end_of_turn>", "<|endoftext|>" end generation and are
// treated as control tokens); where llama.cpp picks one of several such
// tokens in hash-table order, this class picks the lowest id. The token
// attributes llama.cpp sets by model name (Phi-3: special tokens swallow the
// whitespace after them; jina / modern-bert: the mask token swallows the
// whitespace before it) are set too.
//
// The other tokenizer models (bert, t5, rwkv, ...) and the pre-tokenizers
// not listed in PreTokenizerNames() are refused at load time.
//
// Ownership: a Tokenizer copies what it needs out of the GgufFile, which may
// be closed afterwards. An IncrementalDetokenizer borrows its Tokenizer,
// which must outlive it.
// Thread-safety: a Tokenizer is immutable after FromGguf; all const methods
// are safe to call concurrently. An IncrementalDetokenizer is a small
// per-stream state machine: use each from one thread at a time.
#ifndef PDSERVE_MODEL_TOKENIZER_H_
#define PDSERVE_MODEL_TOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/gguf.h"
#include "model/unicode.h"

namespace pdserve::model {

using TokenId = int32_t;
// "No such token" (llama.cpp's LLAMA_TOKEN_NULL).
inline constexpr TokenId kNoToken = -1;

class Tokenizer {
 public:
  enum class Type { kBpe, kSpm };

  // Loads the tokenizer from `file`'s tokenizer.ggml.* metadata. Errors
  // name the key and the file: NotFound for a missing required key
  // (tokenizer.ggml.model, .tokens, .merges for gpt2); InvalidArgument for
  // a key of the wrong type or length, an unsupported model or pre-tokenizer
  // name, duplicate token texts, or a merge that is not "A B" with A and B
  // both in the vocabulary.
  // Special token ids out of the vocabulary's range are ignored in favour of
  // the default, as llama.cpp does.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(
      const GgufFile& file);

  // The tokenizer.ggml.pre names accepted for "gpt2" vocabularies.
  static std::vector<std::string> PreTokenizerNames();

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // llama_tokenize(text, add_special, parse_special). With `add_special`,
  // BOS / EOS are added when add_bos() / add_eos() (and the id exists).
  // With `parse_special`, control and unknown tokens written in the text
  // become their ids; user-defined tokens always do (as in llama.cpp and
  // Hugging Face tokenizers). Invalid UTF-8 is tokenized as U+FFFD by BPE
  // vocabularies and byte by byte (byte fallback) by SentencePiece ones; a
  // byte without a <0xXX> token becomes UNK (llama.cpp throws).
  std::vector<TokenId> Encode(absl::string_view text, bool add_special,
                              bool parse_special) const;

  // The bytes token `id` stands for (llama_token_to_piece with lstrip 0):
  // byte-level BPE undone, U+2581 turned back into spaces, <0xXX> tokens as
  // their byte. Control and unknown tokens give "" unless `render_special`,
  // then their text; user-defined tokens always give their text; unused
  // and undefined-type tokens give "". InvalidArgument for an id outside
  // [0, vocab_size()). A piece may be an incomplete UTF-8 sequence.
  absl::StatusOr<std::string> TokenToPiece(TokenId id,
                                           bool render_special) const;

  // llama_detokenize(ids, remove_special, unparse_special): the pieces
  // concatenated, where `remove_special` drops a leading BOS / trailing EOS
  // when add_bos() / add_eos(), `unparse_special` renders control tokens,
  // the first token's piece loses one leading space when add_space_prefix()
  // (so after a BOS, rendered or dropped, the next piece keeps its space, as
  // in llama.cpp), and vocabularies that ask for it get llama.cpp's
  // space clean-up (" ." -> ".", " 's" -> "'s", ...). Ids outside the
  // vocabulary contribute nothing (llama.cpp would throw). The result is
  // raw bytes, possibly not valid UTF-8.
  std::string Detokenize(absl::Span<const TokenId> ids, bool remove_special,
                         bool unparse_special) const;

  Type type() const { return type_; }
  // The pre-tokenizer name in effect ("default" when the key is absent;
  // empty for SentencePiece vocabularies).
  const std::string& pre() const { return pre_; }
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }

  // Special ids; kNoToken when absent.
  TokenId bos_id() const { return bos_id_; }
  TokenId eos_id() const { return eos_id_; }
  TokenId eot_id() const { return eot_id_; }
  TokenId eom_id() const { return eom_id_; }
  TokenId unk_id() const { return unk_id_; }
  TokenId pad_id() const { return pad_id_; }

  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }

  // Whether generating `id` ends generation (llama_vocab_is_eog): EOS, EOT,
  // EOM and the tokens llama.cpp recognises by text. False for bad ids.
  bool IsEndOfGeneration(TokenId id) const;
  // The end-of-generation ids, ascending.
  const std::vector<TokenId>& end_of_generation_ids() const { return eog_ids_; }
  // Whether `id` is a control token (llama_vocab_is_control). False for bad
  // ids.
  bool IsControl(TokenId id) const;

  // The raw vocabulary entry (as stored in the file, or "[EMPTY_<id>]" for
  // an empty one, as llama.cpp names them); "" for bad ids.
  const std::string& token_text(TokenId id) const;
  // The id whose raw vocabulary entry is exactly `raw_text`; NotFound
  // otherwise.
  absl::StatusOr<TokenId> TokenIdOf(absl::string_view raw_text) const;

 private:
  friend class IncrementalDetokenizer;

  struct Token {
    std::string text;
    float score = 0.0f;
    uint32_t attr = 0;  // kAttr* bits
    // TokenToPiece(id, /*render_special=*/true), computed once.
    std::string piece;
  };

  // A byte-level BPE merge of two tokens.
  struct Merge {
    int32_t rank;
    TokenId result;  // kNoToken when the merged text is not a token
  };

  // A stretch of the input: text to tokenize, or an already found special
  // token.
  struct Fragment {
    TokenId token;  // kNoToken for text
    size_t offset;
    size_t length;
  };

  Tokenizer() = default;

  // Loading steps of FromGguf, in order.
  absl::Status LoadVocab(const GgufFile& file);
  absl::Status LoadMerges(const GgufFile& file);
  absl::Status LoadSpecialIds(const GgufFile& file);
  void DetectSpecialTokensByText();
  absl::Status ApplyModelSpecificAttributes(const GgufFile& file);
  void BuildCaches();

  TokenId Find(absl::string_view text) const;
  std::vector<Fragment> PartitionSpecial(absl::string_view text,
                                         bool parse_special) const;
  void EncodeBpe(absl::string_view text, std::vector<TokenId>* out) const;
  void EncodeBpeWord(absl::string_view word, std::vector<TokenId>* out) const;
  void EncodeSpm(absl::string_view text, std::vector<TokenId>* out) const;
  // The piece as Detokenize renders it (out-of-range ids: "").
  absl::string_view PieceForDetokenize(TokenId id, bool unparse_special) const;

  Type type_ = Type::kBpe;
  std::string pre_;
  std::vector<PreTokenizerRule> pre_rules_;
  bool clean_spaces_ = false;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;

  TokenId bos_id_ = kNoToken;
  TokenId eos_id_ = kNoToken;
  TokenId eot_id_ = kNoToken;
  TokenId eom_id_ = kNoToken;
  TokenId unk_id_ = kNoToken;
  TokenId pad_id_ = kNoToken;
  // Fill-in-the-middle tokens, only used to find end-of-generation tokens.
  TokenId fim_pre_id_ = kNoToken;
  TokenId fim_suf_id_ = kNoToken;
  TokenId fim_mid_id_ = kNoToken;
  TokenId fim_pad_id_ = kNoToken;
  TokenId fim_rep_id_ = kNoToken;
  TokenId fim_sep_id_ = kNoToken;

  std::vector<Token> tokens_;
  // Views into tokens_[i].text; tokens_ never changes after loading.
  absl::flat_hash_map<absl::string_view, TokenId> token_ids_;
  // Keyed by (left id << 32) | right id.
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // BPE: the token of each byte's byte-level character. SPM: the <0xXX>
  // token of each byte (or the byte's own one-character token).
  TokenId byte_tokens_[256];
  // Control, unknown and user-defined tokens, longest text first.
  std::vector<TokenId> special_tokens_;
  std::vector<bool> eog_;
  std::vector<TokenId> eog_ids_;
};

// Turns a stream of token ids into text as it is generated, never handing
// out part of a UTF-8 character: a multi-byte character split over tokens
// is held back until complete. The concatenation of everything Add and
// Finish return equals SanitizeUtf8(tokenizer.Detokenize(all ids,
// remove_special, unparse_special)), i.e. exactly Detokenize's text when
// that is valid UTF-8; ill-formed bytes come out as U+FFFD, and bytes still
// incomplete at Finish become one U+FFFD. The few bytes that the space
// clean-up may still change are held back until the following tokens
// settle them.
class IncrementalDetokenizer {
 public:
  // continues_text: the stream continues text that is already there (a
  // model's output after its prompt), so the leading space of the first
  // piece is kept; Detokenize's rule of dropping it (SentencePiece
  // vocabularies with add_space_prefix) is for text that starts at the
  // first token. llama.cpp's streaming output keeps it likewise.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool remove_special,
                         bool unparse_special, bool continues_text = false);

  // Feeds one token; returns the text it completes (often empty).
  std::string Add(TokenId id);
  // Ends the stream: returns everything held back. The object is then
  // ready for a new stream.
  std::string Finish();

 private:
  void Append(TokenId id);
  // Moves settled bytes of raw_ through the space clean-up into utf8_ and
  // returns the complete UTF-8 prefix of utf8_.
  std::string Drain(bool final);

  const Tokenizer& tokenizer_;
  const bool remove_special_;
  const bool unparse_special_;
  const bool continues_text_;

  size_t tokens_seen_ = 0;
  bool strip_next_space_ = false;
  bool first_piece_done_ = false;
  bool eos_held_ = false;
  std::string raw_;   // pieces not yet through the space clean-up
  std::string utf8_;  // cleaned bytes not yet handed out
};

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_TOKENIZER_H_
