#!/usr/bin/env python3
"""The client side of //deploy:podman_run_test, with the official `openai`
client against the router's OpenAI HTTP API (--base_url .../v1).

  first   --since EPOCH --deadline S: retries a streamed completion until one
          answers (the cluster is starting), then prints one JSON line
          {"first_answer_s": seconds from EPOCH to the first streamed text,
           "text": ...}. Exit 1 when nothing answered by the deadline.
  streams --n N --max_tokens T --ready_file F: N concurrent streamed
          completions (ignore_eos, so each runs exactly T tokens; usage on
          the last chunk). Once every stream has received --ready_chunks
          chunks it creates F (the test then stops a decode pod), and waits
          for all of them. Prints one JSON line per stream and exits 0 only
          when every stream ended with finish_reason "length", T completion
          tokens in its usage, and no error: no stream was dropped.
"""

import argparse
import json
import sys
import threading
import time

import openai


def client(args):
    return openai.OpenAI(base_url=args.base_url, api_key="none",
                         max_retries=0, timeout=args.timeout)


def first(args):
    c = client(args)
    last_error = None
    while time.time() < args.since + args.deadline:
        try:
            stream = c.completions.create(
                model=args.model, prompt="The capital of France is",
                max_tokens=8, temperature=0, stream=True)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    print(json.dumps({"first_answer_s": round(time.time() - args.since, 3),
                                      "text": chunk.choices[0].text}), flush=True)
                    for _ in stream:
                        pass
                    return 0
        except Exception as e:  # not up yet: connection refused, 503, ...
            last_error = e
        time.sleep(0.2)
    print("FAIL: no answer within %s s; last error: %r" % (args.deadline, last_error),
          file=sys.stderr)
    return 1


def streams(args):
    c = client(args)
    results = [None] * args.n
    counts = [0] * args.n
    lock = threading.Lock()
    ready = threading.Event()

    def run(i):
        r = {"stream": i, "chunks": 0, "text": "", "finish_reason": None,
             "completion_tokens": None, "error": None}
        try:
            stream = c.completions.create(
                model=args.model, prompt="Stream %d: once upon a time" % i,
                max_tokens=args.max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True})
            for chunk in stream:
                if chunk.choices:
                    r["chunks"] += 1
                    r["text"] += chunk.choices[0].text or ""
                    if chunk.choices[0].finish_reason:
                        r["finish_reason"] = chunk.choices[0].finish_reason
                    with lock:
                        counts[i] = r["chunks"]
                        if min(counts) >= args.ready_chunks:
                            ready.set()
                if chunk.usage:
                    r["completion_tokens"] = chunk.usage.completion_tokens
        except Exception as e:
            r["error"] = repr(e)
        results[i] = r

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.n)]
    for t in threads:
        t.start()
    if ready.wait(args.timeout):
        open(args.ready_file, "w").close()
    for t in threads:
        t.join()
    ok = True
    for r in results:
        good = (r["error"] is None and r["finish_reason"] == "length" and
                r["completion_tokens"] == args.max_tokens)
        ok = ok and good
        r["ok"] = good
        r["text"] = r["text"][:40]
        print(json.dumps(r), flush=True)
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["first", "streams"])
    p.add_argument("--base_url", required=True)
    p.add_argument("--model", default="model")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--since", type=float, default=time.time())
    p.add_argument("--deadline", type=float, default=120)
    p.add_argument("--n", type=int, default=6)
    p.add_argument("--max_tokens", type=int, default=96)
    p.add_argument("--ready_chunks", type=int, default=4)
    p.add_argument("--ready_file", default="")
    args = p.parse_args()
    return first(args) if args.mode == "first" else streams(args)


if __name__ == "__main__":
    sys.exit(main())
