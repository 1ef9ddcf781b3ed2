#!/usr/bin/env python3
"""llama.cpp's speed on this machine, measured as llama-bench measures it.

Loads a GGUF model through llama-cpp-python (llama.cpp built from source
for this CPU) and times, each as the median of --runs runs
on an empty context:
  pp128, pp512  one prompt of 128 / 512 tokens in a single batch;
  tg128         128 single-token steps (after one token).
Prints the figures and writes JSON, so that `scripts/pd-bench engine` can be
put next to llama.cpp on the same machine in the same hour (these VMs are
noisy). Not part of the test suite: building llama-cpp-python takes about
10 minutes on 2 cores.

Build it with `scripts/pd-bench llamacpp` (or engine-vs-llamacpp), which
makes a venv in ~/.cache/pdserve/venv-llamacpp with llama.cpp built for the
instruction sets this CPU lists (never AMX: these VMs report it in CPUID
without enabling it, and a native build's AMX path dies with SIGILL on the
first prompt; AVX-VNNI only where listed, which Zen 4 is not), then:

  ~/.cache/pdserve/venv-llamacpp/bin/python tools/llamacpp_speed.py \\
      --model "$PDSERVE_DEFAULT_MODEL" --json_out bench/results/llamacpp.json
"""
import argparse
import json
import os
import random
import statistics
import time

import llama_cpp


def tokens(n, seed, vocab):
    rng = random.Random(seed)
    # Valid ids away from the special tokens at the start of the vocabulary.
    return [rng.randrange(100, vocab) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("PDSERVE_DEFAULT_MODEL"))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json_out")
    args = ap.parse_args()
    if not args.model:
        ap.error("--model (or PDSERVE_DEFAULT_MODEL) is required")

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=1024, n_batch=512,
                          n_ubatch=512, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    vocab = llm.n_vocab()
    # llama_decode itself, as llama-bench calls it (Llama.eval adds Python
    # bookkeeping per call): logits for the last token of each batch only.
    ctx = llm._ctx.ctx
    memory = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(ids, first_pos):
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i] = t
            batch.pos[i] = first_pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(ids) - 1
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        llama_cpp.llama_synchronize(ctx)

    result = {"model": os.path.basename(args.model), "threads": args.threads,
              "runs": args.runs, "llama_cpp_python": llama_cpp.__version__,
              "system_info": llama_cpp.llama_print_system_info().decode()}
    for n in (128, 512):
        rates = []
        for run in range(args.runs):
            llama_cpp.llama_memory_clear(memory, True)
            prompt = tokens(n, run, vocab)
            start = time.perf_counter()
            decode(prompt, 0)
            rates.append(n / (time.perf_counter() - start))
        result[f"pp{n}"] = statistics.median(rates)
    rates = []
    for run in range(args.runs):
        llama_cpp.llama_memory_clear(memory, True)
        steps = tokens(129, 1000 + run, vocab)
        decode(steps[:1], 0)
        start = time.perf_counter()
        for pos, t in enumerate(steps[1:], start=1):
            decode([t], pos)
        rates.append(128 / (time.perf_counter() - start))
    result["tg128"] = statistics.median(rates)
    llama_cpp.llama_batch_free(batch)
    print(f"llama.cpp ({result['llama_cpp_python']}), {args.threads} threads, "
          f"median of {args.runs} runs: pp128 {result['pp128']:.1f}, "
          f"pp512 {result['pp512']:.1f}, tg128 {result['tg128']:.1f} tokens/s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
