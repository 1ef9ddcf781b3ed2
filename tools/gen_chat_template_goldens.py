#!/usr/bin/env python3
"""Renders real chat templates with Jinja2 the way Hugging Face's
`tokenizer.apply_chat_template` does, and writes the results as golden files
for model/chat_template_test.cc.

Inputs:  model/testdata/chat_templates/sources/*.jinja, the template sources
         (provenance of each in TEMPLATES below), and
         sources/unrecognized/*.jinja, templates that pdserve must refuse.
Outputs: model/testdata/chat_templates/<name>.json, one per template:
           {"name", "provenance", "template", "bos_token", "eos_token",
            "expect": {"family", "variant", "renders_bos",
                       "default_system_prompt" (null when none)},
            "cases": [{"name", "messages": [{"role", "content"}],
                       "add_generation_prompt", "date_string" (optional),
                       "expected" (the rendering) | "error" (the message the
                       template raised)}]}
         and model/testdata/chat_templates/unrecognized.json:
           [{"name", "template"}].
The "expect" block is written by hand below (what the template is, read off
its source), not computed by the code under test.

This script installs nothing. It needs Python 3 with `jinja2` (>= 3.1), and
`gguf` only for --smollm2-gguf:
    python3 -m venv /tmp/chat_venv
    /tmp/chat_venv/bin/pip install jinja2 gguf
    /tmp/chat_venv/bin/python tools/gen_chat_template_goldens.py \
        [--smollm2-gguf /root/.cache/pdserve/models/SmolLM2-135M-Instruct.Q4_1.gguf]
With --smollm2-gguf the SmolLM2 source is first re-read from the model's
`tokenizer.chat_template` (and must equal the committed copy).

Rendering follows transformers' render_jinja_template: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
loopcontrols extension, `tojson` without ASCII escaping, globals
`raise_exception` (raises TemplateError) and `strftime_now` (local time), and
the variables messages, tools=None, documents=None, add_generation_prompt,
bos_token, eos_token. Templates whose date comes from `strftime_now` are
rendered with `date_string` fixed (the template honours a caller's
date_string), so the goldens do not depend on the day they were made.
"""

import argparse
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO, "model", "testdata", "chat_templates")
SRC_DIR = os.path.join(OUT_DIR, "sources")

SMOLLM2_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# name, source file, bos_token, eos_token, expect, provenance.
TEMPLATES = [
    ("smollm2", "smollm2.jinja", "<|im_start|>", "<|im_end|>",
     dict(family="chatml", variant="chatml-default-system", renders_bos=False,
          default_system_prompt=SMOLLM2_DEFAULT),
     "tokenizer.chat_template of the default model, "
     "SmolLM2-135M-Instruct.Q4_1.gguf (HuggingFaceTB/SmolLM2-135M-Instruct)"),
    ("qwen2", "qwen2.jinja", "", "<|im_end|>",
     dict(family="chatml", variant="chatml-default-system", renders_bos=False,
          default_system_prompt="You are a helpful assistant."),
     "Qwen/Qwen2-7B-Instruct tokenizer_config.json, as quoted in "
     "openvinotoolkit/openvino.genai tests/python_tests/tokenizer_configs.py"),
    ("qwen2.5", "qwen2.5.jinja", "", "<|im_end|>",
     dict(family="chatml", variant="qwen2.5", renders_bos=False,
          default_system_prompt="You are Qwen, created by Alibaba Cloud. "
                                "You are a helpful assistant."),
     "Qwen/Qwen2.5-7B-Instruct, llama.cpp models/templates/"
     "Qwen-Qwen2.5-7B-Instruct.jinja (fetched from the Hub by "
     "scripts/get_chat_template.py; vendored in llama-cpp-python 0.3.36)"),
    ("chatml", "chatml.jinja", "<s>", "<|im_end|>",
     dict(family="chatml", variant="chatml", renders_bos=False,
          default_system_prompt=None),
     "plain ChatML (teknium/OpenHermes-2.5-Mistral-7B), llama-cpp-python "
     "0.3.36 llama_chat_format.CHATML_CHAT_TEMPLATE"),
    ("chatml-escaped", "chatml-escaped.jinja", "<s>", "<|im_end|>",
     dict(family="chatml", variant="chatml", renders_bos=False,
          default_system_prompt=None),
     "the same ChatML template spelled with \\n escapes, as in llama.cpp "
     "tests/test-chat-template.cpp (teknium/OpenHermes-2.5-Mistral-7B)"),
    ("chatml-bos", "chatml-bos.jinja", "<s>", "<|im_end|>",
     dict(family="chatml", variant="chatml-bos", renders_bos=True,
          default_system_prompt=None),
     "NousResearch/Nous-Hermes-2-Mixtral-8x7B-DPO tokenizer_config.json, as "
     "quoted in openvino.genai tests/python_tests/tokenizer_configs.py"),
    ("llama3", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>",
     dict(family="llama3", variant="llama3", renders_bos=True,
          default_system_prompt=None),
     "meta-llama/Meta-Llama-3-8B-Instruct, llama-cpp-python 0.3.36 "
     "llama_chat_format.LLAMA3_INSTRUCT_CHAT_TEMPLATE (same text in "
     "openvino.genai tokenizer_configs.py)"),
    ("llama3.1", "llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>",
     dict(family="llama3", variant="llama3.1", renders_bos=True,
          default_system_prompt=None),
     "meta-llama/Llama-3.1-8B-Instruct (identical for Llama-3.3-70B-Instruct), "
     "llama.cpp models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"),
    ("llama3.1-2407", "llama3.1-2407.jinja", "<|begin_of_text|>", "<|eot_id|>",
     dict(family="llama3", variant="llama3.1", renders_bos=True,
          default_system_prompt=None),
     "the July 2024 Llama 3.1 template (without the `tools = none` default), "
     "as in ochafik/llama.cpp templates/Meta-Llama-3.1-8B-Instruct.jinja; "
     "made from llama3.1.jinja by removing that block (same length as "
     "that copy, 4542 bytes plus its trailing newline)"),
    ("llama3.2", "llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>",
     dict(family="llama3", variant="llama3.2", renders_bos=True,
          default_system_prompt=None),
     "meta-llama/Llama-3.2-3B-Instruct (1B the same), llama.cpp "
     "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"),
    ("llama2", "llama2.jinja", "<s>", "</s>",
     dict(family="llama2", variant="llama2", renders_bos=True,
          default_system_prompt=None),
     "meta-llama/Llama-2-7b-chat-hf tokenizer_config.json, as quoted in "
     "openvino.genai tests/python_tests/tokenizer_configs.py"),
    ("codellama-instruct", "codellama-instruct.jinja", "<s>", "</s>",
     dict(family="llama2", variant="llama2", renders_bos=True,
          default_system_prompt=None),
     "codellama/CodeLlama-34b-Instruct-hf (Llama 2 layout spelled with "
     "| trim), as quoted in openvino.genai tokenizer_configs.py"),
    ("mistral-legacy-v0.1", "mistral-legacy-v0.1.jinja", "<s>", "</s>",
     dict(family="mistral", variant="mistral-legacy-v0.1", renders_bos=True,
          default_system_prompt=None),
     "mistralai/Mistral-7B-Instruct-v0.1, original template, llama-cpp-python "
     "0.3.36 llama_chat_format.MISTRAL_INSTRUCT_CHAT_TEMPLATE"),
    ("mistral-legacy", "mistral-legacy.jinja", "<s>", "</s>",
     dict(family="mistral", variant="mistral-legacy", renders_bos=True,
          default_system_prompt=None),
     "mistralai/Mistral-7B-Instruct-v0.2 original template (also "
     "Mixtral-8x7B-Instruct-v0.1), llama-cpp-python 0.3.36 "
     "MIXTRAL_INSTRUCT_CHAT_TEMPLATE = llama.cpp tests/test-chat-template.cpp"),
    ("mistral-v1", "mistral-v1.jinja", "<s>", "</s>",
     dict(family="mistral", variant="mistral-v1", renders_bos=True,
          default_system_prompt=None),
     "mistralai/Mistral-7B-Instruct-v0.1/v0.2, 2024 template with a system "
     "message, llama.cpp tests/test-chat-template.cpp"),
    ("mistral-v3", "mistral-v3.jinja", "<s>", "</s>",
     dict(family="mistral", variant="mistral-v3", renders_bos=True,
          default_system_prompt=None),
     "mistralai/Mistral-7B-Instruct-v0.3 (also Mistral-Large-Instruct-2407), "
     "llama.cpp tests/test-chat-template.cpp"),
]

# Templates whose header date comes from strftime_now get this date_string.
FIXED_DATE = "05 Mar 2025"
STRFTIME_TEMPLATES = {"llama3.2"}
# Templates with a literal default date: one extra case overrides it.
DATE_DEFAULT_TEMPLATES = {"llama3.1", "llama3.1-2407"}


def S(content):
    return {"role": "system", "content": content}


def U(content):
    return {"role": "user", "content": content}


def A(content):
    return {"role": "assistant", "content": content}


# name, messages, add_generation_prompt.
CONVERSATIONS = [
    ("user_only", [U("Hello!")], True),
    ("user_only_no_generation_prompt", [U("Hello!")], False),
    ("system_user", [S("You are a terse assistant."), U("What is 2+2?")], True),
    ("multi_turn", [S("Answer in French."), U("Hi"), A("Bonjour !"),
                    U("How are you?")], True),
    ("multi_turn_no_system", [U("First question"), A("First answer"),
                              U("Second question"), A("Second answer")], False),
    ("unicode", [U("Привет, 世界! Ça va? 🚀 naïve café"),
                 A("¡Hola! 😀 — “quotes” ‘single’"), U("日本語で答えて。")], True),
    ("whitespace_and_newlines",
     [S("  Be careful.\n\n"), U("  line one\n\n  line two  \n"),
      A("\n  indented answer\t \n"), U("\ttrailing tab\t")], True),
    # Python's str.strip() (Jinja's trim) drops these; C isspace() does not.
    ("unicode_whitespace",
     [U("\u3000ideographic space\u00a0and nbsp\u2028"),
      A("\x1cfile separator\x85"), U("\u2003em\u202f")], True),
    ("empty_content", [U(""), A(""), U("")], True),
    ("template_syntax_in_content",
     [U("<|im_start|>[INST] <<SYS>> {{ not jinja }} {% raw %} \\n")], True),
    ("ends_with_assistant_after_system",
     [S("System says hi."), U("Question"), A("Answer")], False),
    # Role orders some templates reject (they raise) and others accept.
    ("system_only", [S("Only a system message.")], True),
    ("two_users", [U("first"), U("second")], True),
    ("assistant_first", [A("I start."), U("ok")], True),
    ("system_in_middle", [U("q1"), S("late system"), U("q2")], True),
    ("system_at_odd_position", [U("q1"), S("late system"), A("a1")], True),
    ("two_systems", [S("s1"), S("s2"), U("u")], True),
    ("empty_system", [S(""), U("u")], True),
]


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None,
           sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, bos, eos, messages, add_generation_prompt,
           date_string=None):
    template = env.from_string(source)
    variables = dict(messages=messages, tools=None, documents=None,
                     add_generation_prompt=add_generation_prompt,
                     bos_token=bos, eos_token=eos)
    if date_string is not None:
        variables["date_string"] = date_string
    return template.render(**variables)


def render_case(env, source, bos, eos, messages, agp, date):
    """{"expected": text} or {"error": the message the template raised}."""
    try:
        return {"expected": render(env, source, bos, eos, messages, agp, date)}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is not jinja2.exceptions.TemplateError:
            raise  # a syntax or undefined-variable error is a bug here
        return {"error": str(e)}


def equivalent_spellings(source):
    """Respellings that model/chat_template_test.cc expects to be recognised
    as the same template: CRLF line ends, one more final newline, and no
    spaces around `+`."""
    return [source.replace("\n", "\r\n"), source + "\n",
            source.replace(" + ", "+")]


def read_source(path):
    # newline="" keeps the bytes exactly as committed.
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def check_smollm2(gguf_path):
    import gguf  # only needed here
    reader = gguf.GGUFReader(gguf_path)
    source = reader.fields["tokenizer.chat_template"].contents()
    committed = read_source(os.path.join(SRC_DIR, "smollm2.jinja"))
    if source != committed:
        sys.exit("sources/smollm2.jinja differs from the GGUF's template")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    bos = tokens[reader.fields["tokenizer.ggml.bos_token_id"].contents()]
    eos = tokens[reader.fields["tokenizer.ggml.eos_token_id"].contents()]
    if (bos, eos) != ("<|im_start|>", "<|im_end|>"):
        sys.exit(f"unexpected SmolLM2 bos/eos {bos!r} {eos!r}")


def write_json(path, value):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smollm2-gguf", help="re-check the SmolLM2 source "
                        "against this GGUF's tokenizer.chat_template")
    args = parser.parse_args()
    if args.smollm2_gguf:
        check_smollm2(args.smollm2_gguf)

    env = make_env()
    for name, filename, bos, eos, expect, provenance in TEMPLATES:
        source = read_source(os.path.join(SRC_DIR, filename))
        cases = []
        conversations = list(CONVERSATIONS)
        for conv_name, messages, agp in conversations:
            date = FIXED_DATE if name in STRFTIME_TEMPLATES else None
            cases.append((conv_name, messages, agp, date))
        if name in DATE_DEFAULT_TEMPLATES or name in STRFTIME_TEMPLATES:
            cases.append(("date_override", [S("Sys"), U("What day is it?")],
                          True, "31 Dec 1999"))
        out_cases = []
        for conv_name, messages, agp, date in cases:
            case = {"name": conv_name, "messages": messages,
                    "add_generation_prompt": agp}
            if date is not None:
                case["date_string"] = date
            case.update(render_case(env, source, bos, eos, messages, agp, date))
            # The C++ test also feeds these spellings of the template and
            # expects the same results; check here that Jinja agrees.
            for spelling in equivalent_spellings(source):
                if render_case(env, spelling, bos, eos, messages, agp,
                               date) != render_case(env, source, bos, eos,
                                                    messages, agp, date):
                    sys.exit(f"{name}/{conv_name}: a respelling renders "
                             "differently")
            out_cases.append(case)
        write_json(os.path.join(OUT_DIR, name + ".json"), {
            "name": name,
            "provenance": provenance,
            "template": source,
            "bos_token": bos,
            "eos_token": eos,
            "expect": expect,
            "cases": out_cases,
        })
        print(f"{name}: {len(out_cases)} cases, "
              f"{sum('error' in c for c in out_cases)} errors")

    unrecognized = []
    udir = os.path.join(SRC_DIR, "unrecognized")
    for filename in sorted(os.listdir(udir)):
        if filename.endswith(".jinja"):
            source = read_source(os.path.join(udir, filename))
            env.from_string(source)  # must at least be valid Jinja
            unrecognized.append({"name": filename[:-len(".jinja")],
                                 "template": source})
    write_json(os.path.join(OUT_DIR, "unrecognized.json"), unrecognized)
    print(f"unrecognized: {len(unrecognized)} templates")


if __name__ == "__main__":
    main()
