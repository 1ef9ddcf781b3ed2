// What the files of the :tokenizer library share (internal to it): the
// token attribute bits, the SentencePiece space and the merge-table key.
#ifndef PDSERVE_MODEL_TOKENIZER_INTERNAL_H_
#define PDSERVE_MODEL_TOKENIZER_INTERNAL_H_

#include <cstdint>

#include "model/tokenizer.h"

namespace pdserve::model::tokenizer_internal {

// llama.cpp's token attributes (llama_token_attr), as bits.
inline constexpr uint32_t kAttrUnknown = 1u << 0;
inline constexpr uint32_t kAttrUnused = 1u << 1;
inline constexpr uint32_t kAttrNormal = 1u << 2;
inline constexpr uint32_t kAttrControl = 1u << 3;
inline constexpr uint32_t kAttrUserDefined = 1u << 4;
inline constexpr uint32_t kAttrByte = 1u << 5;
inline constexpr uint32_t kAttrLstrip = 1u << 7;
inline constexpr uint32_t kAttrRstrip = 1u << 8;

// Attributes that Detokenize / TokenToPiece hide unless asked to render
// special tokens.
inline constexpr uint32_t kAttrHidden = kAttrUnknown | kAttrControl;

// SentencePiece's escaped space, U+2581.
inline constexpr char kSpmSpace[] = "\xE2\x96\x81";

// The key of Tokenizer::merges_: (left id << 32) | right id.
inline uint64_t MergeKey(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

}  // namespace pdserve::model::tokenizer_internal

#endif  // PDSERVE_MODEL_TOKENIZER_INTERNAL_H_
