#!/usr/bin/env python3
"""Generates the tokenizer goldens in model/testdata/ from llama.cpp.

The reference is llama.cpp's own tokenizer, reached through llama-cpp-python
(llama_tokenize, llama_detokenize, llama_token_to_piece and the vocabulary
queries of its C API). model/tokenizer_test.cc checks pdserve's Tokenizer
against the files written here:

  smollm2_tokenizer_golden.json
      The default model (SmolLM2-135M-Instruct: byte-level BPE, pre-tokenizer
      "smollm") as it is.
  bpe_pretokenizers_golden.json
      The same vocabulary and merges with another tokenizer.ggml.pre
      ("llama-bpe", "qwen2", "default", ...). Each entry says how its GGUF is
      derived from the default model (the pre name set, keys dropped); the
      test derives the same file with GgufWriter at run time, so no model data
      is committed.
  spm_tokenizer_golden.json
      A small SentencePiece ("llama") vocabulary built here (pieces with
      scores, byte tokens <0x00>..<0xFF>, control, user-defined and unused
      tokens), stored whole in the file together with the metadata of each
      variant, so that the test needs no model at all.

Texts, and pieces, are stored as hex (exact bytes, including invalid UTF-8);
"text" fields are only for reading.

Usage (needs llama-cpp-python and gguf from PyPI):
  python tools/gen_tokenizer_goldens.py --model PATH/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import ctypes
import json
import math
import os
import sys
import tempfile

import gguf
import llama_cpp

# ---------------------------------------------------------------------------
# Texts.

TEXTS = [
    b"Hello world",
    b"Hello, world! How are you doing today?",
    b"The quick brown fox jumps over the lazy dog.",
    b"",
    b" ",
    b"   leading and trailing spaces   ",
    b"multiple    spaces\tand\ttabs\n\nand newlines\r\n  mixed \t \n",
    b"\n\n\n",
    "it's I'm you'll they've we'd she'S HE'LL WE'VE don't 'tis".encode(),
    b"Digits: 0 12 345 6789 12345678901234567890",
    b"3.14159, 1,000,000 and 2024-11-29; 1st 2nd 3rd",
    "Numbers in other scripts: \u0663\u0664\u0665 \u00b2\u00b3 \u216b \u00bd \u2460\u2461".encode(),
    "日本語のテキストです。中文字符测试，한국어 텍스트".encode(),
    "مرحبا بالعالم! هذه جملة عربية.".encode(),
    "नमस्ते दुनिया, यह हिंदी है।".encode(),
    "Ça va? naïve café résumé São Paulo Zürich œuvre".encode(),
    "cafe\u0301 e\u0301\u0301".encode(),
    "Привет, мир! Съешь же ещё этих мягких французских булок.".encode(),
    "Γειά σου Κόσμε".encode(),
    "I love 🍕 and 🎉! 😀😃😄".encode(),
    "Family: 👨‍👩‍👧‍👦, flag: 🏳️‍🌈, skin: 👍🏽, heart: ❤️".encode(),
    b"def fib(n):\n    if n < 2:\n        return n\n"
    b"    return fib(n - 1) + fib(n - 2)\n",
    b"#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; "
    b"return v[0] != 1 ? -1 : 0; }",
    b"{\"key\": [1, 2.5, null], \"html\": \"<div class='x'>&amp;</div>\"}",
    b"<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    b"<|im_start <|im_end|x <|endoftext|><|endoftext|>",
    b"text<|endoftext|>more text<repo_name>x",
    b"Wait... what?! (really) [yes] {no} <maybe> \"quoted\" 'single' `code` "
    b"~tilde~ ^caret^ |pipe| $100 +plus+ @user #tag %pct *star* _under_ "
    b"\\back/slash",
    b"Hello , world . Is it ? Yes ! He said ' hi ' and it 's fine , "
    b"we 're ok 've 'll 'd 'm",
    "a\u00a0b\u3000c\u2009d\u0085e\u200bf\u2028g".encode(),
    b"Pneumonoultramicroscopicsilicovolcanoconiosis "
    b"supercalifragilisticexpialidocious",
    b"https://example.com/path?query=1&x=y#frag user@example.org",
    "abc日本def123ghiПривет456".encode(),
    "∑_{i=1}^{n} x_i² ≤ ∞ ± √2 ≠ π ≈ 3.14".encode(),
    b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!!!!!??????",
    b"     indented text\n\t\ttabbed text",
    b"!!!",
    "\u2581 underscores \u2581\u2581 and U+2581".encode(),
    b"bad \xff\xfe bytes \xc3 and \xe2\x82 end",
    b"\x80\xbf \xed\xa0\x80 overlong \xc0\xaf",
    "It’s the ‘best’ “quote”".encode(),
    b"line1\r\nline2\rline3\n",
    b"Hello<|im_end|>",
]

# Texts for the SentencePiece vocabulary (its special tokens differ).
SPM_EXTRA_TEXTS = [
    b"<s>the fox</s> <|im_start|>hello<|im_end|> <|user|>x",
    b"the quick brown fox",
    b"  two leading spaces and a trailing one ",
    b"zebra quiz",
    b"hello<unused0>world",
]

SPM_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world hello there how are you",
    "tokenizers split text into pieces and pieces into bytes",
    "the cat sat on the mat with the hat",
    "naïve café résumé über straße",
    "привет мир",
    "日本語 テキスト",
    "numbers 123 456 7890",
    "it's don't we're they've",
]
# Specials: control (the second one ends generation by its text),
# user-defined (split off even without parse_special; the second is a plain
# word), unused, undefined.
SPM_SPECIAL_TOKENS = [("<|im_start|>", 3), ("<|im_end|>", 3), ("<|user|>", 4),
                      ("fox", 4), ("<unused0>", 5), ("[UNDEFINED]", 0)]
SPM_SPECIAL_TEXTS = {text for text, _ in SPM_SPECIAL_TOKENS}
# Characters left out of the SPM vocabulary, so byte fallback is exercised.
SPM_MISSING_CHARS = set("zqé語")

# ---------------------------------------------------------------------------
# llama.cpp through its C API.


class Vocab:
    def __init__(self, path):
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True,
                                   verbose=False)
        self.v = self.llm._model.vocab
        self.n = llama_cpp.llama_vocab_n_tokens(self.v)

    def tokenize(self, text, add_special, parse_special):
        cap = len(text) * 4 + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.v, text, len(text), buf, cap,
                                     add_special, parse_special)
        assert n >= 0, n
        return list(buf[:n])

    def detokenize(self, ids, remove_special, unparse_special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        out = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self.v, arr, len(ids), out, cap,
                                       remove_special, unparse_special)
        assert n >= 0, n
        return out.raw[:n]

    def piece(self, token, special):
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.v, token, buf, 256, 0,
                                           special)
        assert n >= 0, n
        return buf.raw[:n]

    def facts(self):
        def opt(x):
            return None if x < 0 else x
        return {
            "vocab_size": self.n,
            "bos": opt(llama_cpp.llama_vocab_bos(self.v)),
            "eos": opt(llama_cpp.llama_vocab_eos(self.v)),
            "eot": opt(llama_cpp.llama_vocab_eot(self.v)),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(self.v)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(self.v)),
            "eog": [i for i in range(self.n)
                    if llama_cpp.llama_vocab_is_eog(self.v, i)],
            "control": [i for i in range(self.n)
                        if llama_cpp.llama_vocab_is_control(self.v, i)],
        }


def text_fields(text):
    """A text as "text" when it is valid UTF-8, else as "hex"."""
    try:
        return {"text": text.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": text.hex()}


def cases(vocab, texts, combos):
    """Expected ids and detokenized text for each text and (add_special,
    parse_special) combination. detok_ff / detok_tt (hex) are
    Detokenize(ids, remove_special, unparse_special) with both flags false /
    true, written only when they differ from the text."""
    out = []
    for text in texts:
        for add_special, parse_special in combos:
            ids = vocab.tokenize(text, add_special, parse_special)
            case = {**text_fields(text),
                    "add_special": add_special,
                    "parse_special": parse_special,
                    "ids": ids}
            for name, flag in (("detok_ff", False), ("detok_tt", True)):
                detok = vocab.detokenize(ids, flag, flag)
                if detok != text:
                    case[name] = detok.hex()
            out.append(case)
    return out


def pieces(vocab, ids):
    """TokenToPiece(id, false) as "piece" (hex), and TokenToPiece(id, true)
    as "special_piece" when it differs."""
    out = []
    for i in sorted(set(ids)):
        entry = {"id": i, "piece": vocab.piece(i, False).hex()}
        special = vocab.piece(i, True).hex()
        if special != entry["piece"]:
            entry["special_piece"] = special
        out.append(entry)
    return out


def sampled_ids(case_list, count):
    """About `count` of the distinct ids in `case_list`, spread evenly."""
    ids = sorted({i for c in case_list for i in c["ids"]})
    step = max(1, len(ids) // count)
    return ids[::step]


# ---------------------------------------------------------------------------
# GGUF files.


def copy_with_pre(src, dst, pre, drop_keys):
    """`src`'s metadata (no tensors) with tokenizer.ggml.pre = `pre`."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture",
                                                 "general.alignment"):
            continue
        if name in drop_keys or name == "tokenizer.ggml.pre":
            continue
        types = field.types
        sub = types[1] if types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), types[0], sub)
    writer.add_key_value("tokenizer.ggml.pre", pre, gguf.GGUFValueType.STRING)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def build_spm_vocab():
    """A small SentencePiece vocabulary: tokens, scores, token types."""
    counts = {}
    for line in SPM_CORPUS:
        for word in line.split(" "):
            word = "\u2581" + word
            for i in range(len(word)):
                for j in range(i + 1, min(len(word), i + 6) + 1):
                    counts[word[i:j]] = counts.get(word[i:j], 0) + 1
    chars = sorted(c for c in counts if len(c) == 1
                   and c not in SPM_MISSING_CHARS)
    multi = sorted((c for c in counts if len(c) > 1
                    and not set(c) & SPM_MISSING_CHARS
                    and c not in SPM_SPECIAL_TEXTS),
                   key=lambda s: (-counts[s], -len(s), s))[:260]
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append("<0x%02X>" % b)
        types.append(6)
        scores.append(0.0)
    for text, kind in SPM_SPECIAL_TOKENS:
        tokens.append(text)
        types.append(kind)
        scores.append(0.0)
    for c in chars:
        tokens.append(c)
        types.append(1)
        scores.append(-20.0)
    for s in multi:
        tokens.append(s)
        types.append(1)
        # Rounded, so that equal scores (and the left-first tie-break) occur.
        scores.append(round(math.log(counts[s]) + 0.5 * len(s), 1) - 10.0)
    return tokens, scores, types


def write_spm(path, vocab, metadata):
    tokens, scores, types = vocab
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_key_value("tokenizer.ggml.model", "llama",
                         gguf.GGUFValueType.STRING)
    writer.add_key_value("tokenizer.ggml.tokens", tokens,
                         gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    writer.add_key_value("tokenizer.ggml.scores", scores,
                         gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
    writer.add_key_value("tokenizer.ggml.token_type", types,
                         gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_key_value(key, value, gguf.GGUFValueType.BOOL)
        else:
            writer.add_key_value(key, value, gguf.GGUFValueType.UINT32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------------------


BOTH = [(False, False), (True, True)]

# (name, pre, keys dropped, texts): the BPE pre-tokenizer variants.
PRE_VARIANTS = [
    ("llama3", "llama-bpe", ["tokenizer.ggml.add_bos_token"]),
    ("qwen2", "qwen2", []),
    ("qwen35", "qwen35", []),
    ("default", "default", []),
    ("gpt2", "gpt-2", []),
    ("falcon", "falcon", []),
    ("stablelm2", "stablelm2", []),
    ("laguna", "laguna", []),
]

# The texts used with the SentencePiece vocabulary, and the ids whose pieces
# are checked (the specials, some byte tokens, plus ids seen in the cases).
SPM_TEXT_INDEXES = [0, 1, 3, 4, 5, 6, 7, 8, 9, 13, 15, 16, 19, 21, 24, 25,
                    28, 29, 35, 36, 37, 38, 41, 42]
SPM_PIECE_IDS = (list(range(0, 12)) + list(range(12, 259, 9)) +
                 list(range(259, 266)))

# The texts whose splitting differs most between pre-tokenizers.
PRE_TEXT_INDEXES = [6, 8, 9, 11, 16, 20, 27, 28, 29, 32, 35, 38, 40]


def write_json(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=os.environ.get(
        "PDSERVE_DEFAULT_MODEL",
        os.path.expanduser(
            "~/.cache/pdserve/models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    parser.add_argument("--out_dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "model",
        "testdata"))
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    header = {
        "generator": "tools/gen_tokenizer_goldens.py",
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
    }

    # The default model as it is.
    vocab = Vocab(args.model)
    smol_cases = cases(vocab, TEXTS, BOTH)
    write_json(os.path.join(args.out_dir, "smollm2_tokenizer_golden.json"), {
        **header,
        "model": os.path.basename(args.model),
        "facts": vocab.facts(),
        "cases": smol_cases,
        "pieces": pieces(vocab, list(range(40)) +
                          sampled_ids(smol_cases, 150)),
    })

    with tempfile.TemporaryDirectory() as tmp:
        variants = []
        for name, pre, drop in PRE_VARIANTS:
            path = os.path.join(tmp, name + ".gguf")
            copy_with_pre(args.model, path, pre, drop)
            v = Vocab(path)
            texts = [TEXTS[i] for i in PRE_TEXT_INDEXES]
            facts = v.facts()
            del facts["control"]
            variants.append({
                "name": name,
                "pre": pre,
                "drop_keys": drop,
                "facts": facts,
                "cases": cases(v, texts, [(True, True)]),
            })
        write_json(os.path.join(args.out_dir, "bpe_pretokenizers_golden.json"),
                   {**header, "base_model": os.path.basename(args.model),
                    "variants": variants})

        spm_vocab = build_spm_vocab()
        spm_variants = []
        for name, metadata, texts, combos in [
            ("spm", {"tokenizer.ggml.bos_token_id": 1,
                     "tokenizer.ggml.eos_token_id": 2,
                     "tokenizer.ggml.unknown_token_id": 0},
             [TEXTS[i] for i in SPM_TEXT_INDEXES] + SPM_EXTRA_TEXTS, BOTH),
            ("spm_no_space_prefix",
             {"tokenizer.ggml.add_space_prefix": False,
              "tokenizer.ggml.add_bos_token": False,
              "tokenizer.ggml.add_eos_token": True,
              "tokenizer.ggml.padding_token_id": 0},
             [TEXTS[i] for i in (0, 4, 5, 24, 28)] + SPM_EXTRA_TEXTS,
             [(True, True), (True, False)]),
        ]:
            path = os.path.join(tmp, name + ".gguf")
            write_spm(path, spm_vocab, metadata)
            v = Vocab(path)
            variant_cases = cases(v, texts, combos)
            spm_variants.append({
                "name": name,
                "metadata": metadata,
                "facts": v.facts(),
                "cases": variant_cases,
                "pieces": pieces(v, SPM_PIECE_IDS + sampled_ids(
                    variant_cases, 60)) if name == "spm" else [],
            })
        tokens, scores, types = spm_vocab
        write_json(os.path.join(args.out_dir, "spm_tokenizer_golden.json"), {
            **header,
            "vocab": {"tokens": tokens, "scores": scores,
                      "token_types": types},
            "variants": spm_variants,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
