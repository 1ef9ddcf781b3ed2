#!/usr/bin/env python3
"""Compares pd-generate with llama.cpp on prompts that are not in the test
goldens: prompt token ids (raw and chat-templated) and 64-token greedy
continuations, one process per prompt on our side.

Usage (repository root, after `bazel build //engine:pd-generate`; llama-cpp-
python in a scratch virtualenv, built without AMX, see
tools/gen_engine_goldens.py):
  /tmp/llamacpp/venv/bin/python tools/compare_with_llamacpp.py MODEL.gguf
"""
import json, subprocess, sys
import jinja2.sandbox
from llama_cpp import Llama
M = sys.argv[1]
llm = Llama(model_path=M, n_ctx=2048, n_threads=2, verbose=False)
raw = ["The quick brown fox", "In 1969, astronauts", "import numpy as np\n", "My grandmother used to say that",
       "La tour Eiffel est", "The three primary colors are", "Water boils at", "Once there was a robot who"]
chat = ["How do I make a cup of tea?", "Name three planets.", "What is 12 times 12?", "Tell me a joke about cats."]
tmpl = llm.metadata["tokenizer.chat_template"]
env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
same = 0; total = 0; tok_same = 0
for kind, items in (("raw", raw), ("chat", chat)):
    for text in items:
        if kind == "raw":
            ids = llm.tokenize(text.encode(), add_bos=True, special=False)
            args = ["--prompt", text]
        else:
            r = env.from_string(tmpl).render(
                messages=[{"role": "user", "content": text}],
                add_generation_prompt=True,
                bos_token=llm.detokenize([llm.token_bos()], special=True).decode(),
                eos_token=llm.detokenize([llm.token_eos()], special=True).decode())
            ids = llm.tokenize(r.encode(), add_bos=True, special=True)
            args = ["--chat", "--prompt", text]
        ref = []
        llm.reset()
        for t in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            ref.append(t)
            if t == llm.token_eos() or len(ref) >= 64: break
        out = json.loads(subprocess.run(["bazel-bin/engine/pd-generate", "--model", M, "--max_tokens", "64", "--json"] + args, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        total += 1; same += out["token_ids"] == ref; tok_same += out["prompt_token_ids"] == ids
        print(kind, repr(text[:30]), "prompt ids equal:", out["prompt_token_ids"] == ids, "greedy equal:", out["token_ids"] == ref, len(ref))
print(f"{same}/{total} continuations identical, {tok_same}/{total} prompt tokenizations identical")
