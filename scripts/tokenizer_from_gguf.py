#!/usr/bin/env python3
"""Write a HuggingFace tokenizer directory for a GGUF model.

Third-party load generators (vllm bench serve, aiperf, guidellm) need a local
HuggingFace tokenizer to build prompts of a given token length and to count
output tokens. pdserve serves GGUF files, which carry their tokenizer inside;
this script pulls it out with `transformers` (which reads GGUF through the
`gguf` package) and saves it as a plain tokenizer directory
(tokenizer.json, tokenizer_config.json, special_tokens_map.json,
chat_template.jinja, and the model's config.json), loadable offline with
AutoTokenizer.from_pretrained(OUT_DIR) by transformers 4.x and 5.x.

Usage:
    python3 scripts/tokenizer_from_gguf.py MODEL.gguf OUT_DIR [--server URL]
                                           [--check TEXT ...] [--no-config]

Needs: pip install transformers gguf sentencepiece torch
(transformers imports torch to read any GGUF, even for the tokenizer alone;
guidellm's or vllm's venv already has it). The written directory itself
needs no torch: aiperf, guidellm and vllm bench serve load it as is.

Example:
    python3 scripts/tokenizer_from_gguf.py \\
        /root/.cache/pdserve/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        /root/.cache/pdserve/tokenizers/SmolLM2-135M-Instruct

With --server http://127.0.0.1:8000 the written tokenizer is compared with
the running pdserve's own (POST /tokenize) on a few strings (or the --check
strings); a mismatch exits with status 3.

The check covers plain text (/tokenize "prompt", no special tokens added,
as pdserve does for text prompts) and the chat template (/tokenize
"messages" vs apply_chat_template(add_generation_prompt=True)).

Exit status: 0 ok, 1 bad arguments / missing file / --server unreachable,
2 missing Python packages or the GGUF could not be converted, 3 token ids
differ from the server's.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_CHECKS = [
    "Hello world, this is a test.",
    "The quick brown fox jumps over the lazy dog 1234567890.",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Unicode: café, naïve, 東京, emoji 🚀!",
    "def f(x):\n    return x ** 2  # code",
]


def die(code, message):
    print(f"tokenizer_from_gguf: error: {message}", file=sys.stderr)
    sys.exit(code)


def server_tokenize(server, text=None, messages=None):
    payload = {"prompt": text} if messages is None else {"messages": messages}
    body = json.dumps(payload).encode()
    req = urllib.request.Request(
        server.rstrip("/") + "/tokenize",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["tokens"]


def gguf_context_length(gguf_path):
    """The model's context length from the GGUF metadata, or None."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(gguf_path)
        field = reader.fields.get("general.architecture")
        arch = bytes(field.parts[field.data[0]]).decode()
        field = reader.fields.get(f"{arch}.context_length")
        return int(field.parts[field.data[0]][0]) if field else None
    except Exception:  # metadata is a nicety here
        return None


def make_portable(out_dir, tokenizer, context_length):
    """Makes the directory load with transformers 4.x as well as 5.x.

    transformers 5 names the class "TokenizersBackend", which 4.x (pinned by
    several load generators) does not know; "PreTrainedTokenizerFast" means
    the same tokenizer.json-backed class in both. The chat template also goes
    into tokenizer_config.json for readers that ignore chat_template.jinja,
    the special tokens into special_tokens_map.json, and model_max_length
    becomes the GGUF's context length instead of "unbounded".
    """
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only", "backend"):
        config.pop(key, None)
    if tokenizer.chat_template and "chat_template" not in config:
        config["chat_template"] = tokenizer.chat_template
    if context_length:
        config["model_max_length"] = context_length
    with open(path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    special = {
        name: config[name]
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if config.get(name) is not None
    }
    special_path = os.path.join(out_dir, "special_tokens_map.json")
    with open(special_path, "w") as f:
        json.dump(special, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return [special_path]


def save_config(gguf_dir, gguf_name, out_dir):
    """Writes config.json (architecture, context length) when it can.

    vllm bench serve reads config.json from the tokenizer directory and logs
    an error (harmless) without it. Best effort: a failure only warns.
    """
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf_name)
        config.save_pretrained(out_dir)
        return [os.path.join(out_dir, "config.json")]
    except Exception as e:
        print(f"tokenizer_from_gguf: warning: no config.json written: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return []


def main():
    parser = argparse.ArgumentParser(
        description="Write a HuggingFace tokenizer directory for a GGUF file.",
        epilog="See the module docstring for details.",
    )
    parser.add_argument("gguf", help="path to the .gguf model file")
    parser.add_argument("out_dir", help="directory to write the tokenizer to")
    parser.add_argument(
        "--server",
        help="pdserve base URL (e.g. http://127.0.0.1:8000): compare token "
        "ids with its POST /tokenize",
    )
    parser.add_argument(
        "--check",
        action="append",
        help="a string to compare with --server (repeatable; default: a few "
        "built-in strings)",
    )
    parser.add_argument(
        "--no-config",
        action="store_true",
        help="do not write config.json (the model config from the GGUF)",
    )
    args = parser.parse_args()

    gguf_path = os.path.abspath(args.gguf)
    if not os.path.isfile(gguf_path):
        die(1, f"no such file: {args.gguf}")
    if not gguf_path.endswith(".gguf"):
        die(1, f"not a .gguf file: {args.gguf}")

    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF)
        from transformers import AutoTokenizer
    except ImportError as e:
        die(
            2,
            f"{e}. Install the needed packages first: "
            "pip install transformers gguf sentencepiece torch",
        )

    gguf_dir, gguf_name = os.path.split(gguf_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    except Exception as e:  # transformers raises many kinds here
        if "torch" in str(e).lower() or getattr(e, "name", None) == "torch":
            # transformers 4.x and 5.x both import torch to read a GGUF, even
            # for the tokenizer alone. Only this step needs it: the written
            # directory loads without torch.
            die(
                2,
                f"transformers needs PyTorch to read GGUF files ({e}). Run "
                "this script where torch is installed (pip install torch; "
                "guidellm's and vllm's venvs have it), then point other "
                "tools at the written directory, which needs no torch.",
            )
        die(
            2,
            f"transformers could not build a tokenizer from {gguf_path}: "
            f"{type(e).__name__}: {e}",
        )

    os.makedirs(args.out_dir, exist_ok=True)
    written = list(tokenizer.save_pretrained(args.out_dir))
    written += make_portable(args.out_dir, tokenizer,
                             gguf_context_length(gguf_path))
    if not args.no_config:
        written += save_config(gguf_dir, gguf_name, args.out_dir)
    print(f"wrote tokenizer ({type(tokenizer).__name__}, "
          f"vocab {len(tokenizer)}) to {args.out_dir}:")
    for path in sorted(set(written)):
        if os.path.exists(path):
            print(f"  {os.path.basename(path)}")
    if not os.path.exists(os.path.join(args.out_dir, "tokenizer.json")):
        die(2, "no tokenizer.json was written (not a fast tokenizer?)")

    # Reload from the directory, as the load generators will.
    saved = AutoTokenizer.from_pretrained(args.out_dir)
    print(f"  bos={saved.bos_token!r} eos={saved.eos_token!r} "
          f"model_max_length={saved.model_max_length} "
          f"chat_template={'yes' if saved.chat_template else 'no'}")

    if not args.server:
        return 0
    checks = args.check or DEFAULT_CHECKS
    mismatches = 0
    for text in checks:
        ours = saved.encode(text, add_special_tokens=False)
        try:
            theirs = server_tokenize(args.server, text)
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            die(1, f"POST {args.server}/tokenize failed: {e}")
        same = ours == theirs
        mismatches += not same
        print(f"  {'same' if same else 'DIFFERENT'} ({len(ours)} vs "
              f"{len(theirs)} tokens): {text!r}")
        if not same:
            print(f"    hf:      {ours}\n    pdserve: {theirs}")
    if saved.chat_template:
        # The chat template too: pdserve renders it itself for
        # /v1/chat/completions, the load generators count tokens with ours.
        messages = [{"role": "user", "content": checks[0]}]
        ours = saved.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ours, "keys"):  # transformers 5 returns a BatchEncoding
            ours = ours["input_ids"]
        ours = list(ours)
        try:
            theirs = server_tokenize(args.server, messages=messages)
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            die(1, f"POST {args.server}/tokenize failed: {e}")
        same = ours == theirs
        mismatches += not same
        checks = checks + ["chat"]
        print(f"  {'same' if same else 'DIFFERENT'} ({len(ours)} vs "
              f"{len(theirs)} tokens): chat template on {messages!r}")
        if not same:
            print(f"    hf:      {ours}\n    pdserve: {theirs}")
    if mismatches:
        die(3, f"{mismatches} of {len(checks)} strings tokenize differently")
    print(f"all {len(checks)} strings tokenize the same as {args.server}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
