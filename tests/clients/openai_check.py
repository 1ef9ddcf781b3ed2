#!/usr/bin/env python3
"""Checks a live pdserve router's OpenAI-compatible HTTP API.

What it checks, against --base_url http://HOST:PORT/v1, with the official
`openai` Python client (api_key "none", no retries):
  * GET /v1/models lists at least one model (the one used is --model, or
    the first listed);
  * for each --prompt, with temperature 0 and max_tokens=--max_tokens:
    a streaming and a non-streaming /v1/completions request, and a streaming
    and a non-streaming /v1/chat/completions request (one user message).
    Streaming requests ask for stream_options.include_usage. Each response
    must have one choice with finish_reason "stop" or "length" ("length"
    means exactly max_tokens completion tokens), non-empty text, and usage
    (streaming: only on the final chunk, which has no choices) with
    total_tokens = prompt_tokens + completion_tokens; one id across a
    stream's chunks. The streamed text, finish_reason and usage must equal
    the non-streamed ones for the same request;
  * raw HTTP (urllib): a streaming /v1/completions response is
    text/event-stream, every event a `data: {json}` line, the last one
    `data: [DONE]`; malformed JSON -> 400 with {"error": {"message": ...}};
    temperature -1 -> 400 whose error names temperature; an unknown model ->
    404; GET /health -> 200.

Output: one JSON object per generation request on stdout, e.g.
  {"api": "openai-chat", "stream": true, "prompt": "...", "text": "...",
   "finish_reason": "length", "usage": {...}, ...}
Exit status 0 when every check passed; 1 otherwise, with one "FAIL: ..."
line per failed check on stderr; 2 for bad arguments.

The C++ multi-process tests start a router and workers, then run this script
with the venv interpreter from scripts/python_env.sh ($PDSERVE_PYTHON, made
by scripts/setup.sh; it has openai from PyPI) and parse its stdout:
  $PDSERVE_PYTHON tests/clients/openai_check.py \
      --base_url http://127.0.0.1:PORT/v1 --prompt "The capital of France is"
Every call has a timeout (--timeout seconds), so the script never hangs.
Needs only the openai package and the standard library.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

try:
    import openai
except ImportError as e:  # run with the wrong interpreter
    sys.exit("%s: %s; run it with $PDSERVE_PYTHON (the venv made by "
             "scripts/setup.sh), which has openai" % (sys.argv[0], e))


class Checker:
    """Collects failures; every check goes on after a failure."""

    def __init__(self):
        self.failures = []

    def fail(self, msg):
        self.failures.append(msg)
        print("FAIL: " + msg, file=sys.stderr, flush=True)

    def expect(self, cond, msg):
        if not cond:
            self.fail(msg)
        return cond


def usage_dict(usage):
    if usage is None:
        return None
    return usage.model_dump(exclude_none=True)


def check_usage(ck, where, usage, max_tokens, finish_reason):
    if not ck.expect(usage is not None, "%s: no usage (streaming: no final "
                     "usage chunk for stream_options.include_usage)"
                     % where):
        return
    p, c, t = usage.prompt_tokens, usage.completion_tokens, usage.total_tokens
    ck.expect(p is not None and p > 0, "%s: usage.prompt_tokens %r"
              % (where, p))
    ck.expect(c is not None and 1 <= c <= max_tokens,
              "%s: usage.completion_tokens %r not in [1, %d]"
              % (where, c, max_tokens))
    if p is not None and c is not None:
        ck.expect(t == p + c, "%s: usage.total_tokens %r != %d + %d"
                  % (where, t, p, c))
    if finish_reason == "length":
        ck.expect(c == max_tokens, "%s: finish_reason length after %r "
                  "tokens, max_tokens %d" % (where, c, max_tokens))


def collect_stream(ck, where, stream, chat):
    """Reads a stream of chunks; returns (text, finish_reason, usage, n)."""
    text = ""
    finish = []
    usage = None
    ids = set()
    n = 0
    expected_object = "chat.completion.chunk" if chat else "text_completion"
    for chunk in stream:
        n += 1
        ids.add(chunk.id)
        ck.expect(chunk.object == expected_object,
                  "%s: chunk %d object %r, expected %r"
                  % (where, n, chunk.object, expected_object))
        if usage is not None:
            ck.fail("%s: chunk %d after the usage chunk" % (where, n))
        if chunk.usage is not None:
            usage = chunk.usage
            ck.expect(len(chunk.choices) == 0,
                      "%s: the usage chunk has %d choices, expected none"
                      % (where, len(chunk.choices)))
        for choice in chunk.choices:
            ck.expect(choice.index == 0, "%s: choice index %d"
                      % (where, choice.index))
            if chat:
                delta = choice.delta
                if delta.role is not None:
                    ck.expect(delta.role == "assistant",
                              "%s: delta role %r" % (where, delta.role))
                text += delta.content or ""
            else:
                text += choice.text or ""
            if choice.finish_reason is not None:
                finish.append(choice.finish_reason)
    ck.expect(n > 0, "%s: no chunk" % where)
    ck.expect(len(ids) <= 1, "%s: chunk ids differ: %s" % (where, ids))
    ck.expect(len(finish) == 1, "%s: %d chunks with a finish_reason %s, "
              "expected 1" % (where, len(finish), finish))
    return text, (finish[-1] if finish else None), usage, n


def run_request(ck, client, args, model, prompt, chat, stream):
    api = "openai-chat" if chat else "openai-completions"
    where = "%s(stream=%s, %r)" % (api, stream, prompt)
    common = dict(model=model, max_tokens=args.max_tokens, temperature=0,
                  stream=stream)
    if stream:
        common["stream_options"] = {"include_usage": True}
    try:
        if chat:
            resp = client.chat.completions.create(
                messages=[{"role": "user", "content": prompt}], **common)
        else:
            resp = client.completions.create(prompt=prompt, **common)
        if stream:
            text, finish, usage, chunks = collect_stream(ck, where, resp,
                                                         chat)
        else:
            chunks = None
            usage = resp.usage
            ck.expect(resp.object == ("chat.completion" if chat
                                      else "text_completion"),
                      "%s: object %r" % (where, resp.object))
            if not ck.expect(len(resp.choices) == 1, "%s: %d choices"
                             % (where, len(resp.choices))):
                return None
            choice = resp.choices[0]
            finish = choice.finish_reason
            if chat:
                ck.expect(choice.message.role == "assistant",
                          "%s: message role %r" % (where,
                                                   choice.message.role))
                text = choice.message.content or ""
            else:
                text = choice.text or ""
    except openai.APIError as e:
        ck.fail("%s: %s: %s" % (where, type(e).__name__, e))
        return None
    ck.expect(finish in ("stop", "length"), "%s: finish_reason %r"
              % (where, finish))
    ck.expect(text != "", "%s: empty text" % where)
    check_usage(ck, where, usage, args.max_tokens, finish)
    record = {
        "api": api,
        "stream": stream,
        "prompt": prompt,
        "model": model,
        "text": text,
        "finish_reason": finish,
        "usage": usage_dict(usage),
    }
    if chunks is not None:
        record["chunks"] = chunks
    return record


def compare(ck, streamed, plain):
    if streamed is None or plain is None:
        return
    where = "%s(%r)" % (plain["api"], plain["prompt"])
    ck.expect(streamed["text"] == plain["text"],
              "%s: streamed text %r != non-streamed text %r"
              % (where, streamed["text"], plain["text"]))
    ck.expect(streamed["finish_reason"] == plain["finish_reason"],
              "%s: streamed finish_reason %r != non-streamed %r"
              % (where, streamed["finish_reason"], plain["finish_reason"]))
    su, pu = streamed["usage"] or {}, plain["usage"] or {}
    for key in ("prompt_tokens", "completion_tokens"):
        ck.expect(su.get(key) == pu.get(key),
                  "%s: streamed usage.%s %r != non-streamed %r"
                  % (where, key, su.get(key), pu.get(key)))


def http(method, url, body, timeout):
    """Returns (status, headers, body bytes); HTTP errors are results."""
    data = None
    headers = {}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers,
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def error_message(ck, where, body):
    """Checks an OpenAI-style error body; returns (message, param)."""
    try:
        err = json.loads(body)["error"]
        message = err["message"]
        ok = isinstance(message, str) and message != ""
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ck.expect(ok, "%s: body is not {\"error\": {\"message\": ...}}: "
                     "%r" % (where, body[:300])):
        return "", None
    return message, err.get("param")


def expect_error(ck, args, path, body, status, names=None):
    url = args.base_url + path
    where = "POST %s %s" % (path, body if isinstance(body, bytes)
                            else json.dumps(body))
    try:
        code, _, data = http("POST", url, body, args.timeout)
    except (OSError, urllib.error.URLError) as e:
        ck.fail("%s: %s" % (where, e))
        return
    if not ck.expect(code == status, "%s: HTTP %d, expected %d (body %r)"
                     % (where, code, status, data[:300])):
        return
    message, param = error_message(ck, where, data)
    if names:
        ck.expect(names in message or param == names,
                  "%s: error does not name %r: message %r, param %r"
                  % (where, names, message, param))


def check_sse(ck, args, model, prompt):
    """Raw streaming /v1/completions: SSE framing ending in [DONE]."""
    where = "raw SSE /v1/completions"
    body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    try:
        code, headers, data = http("POST", args.base_url + "/completions",
                                   body, args.timeout)
    except (OSError, urllib.error.URLError) as e:
        ck.fail("%s: %s" % (where, e))
        return
    if not ck.expect(code == 200, "%s: HTTP %d (body %r)"
                     % (where, code, data[:300])):
        return
    ctype = headers.get("Content-Type", "")
    ck.expect(ctype.startswith("text/event-stream"),
              "%s: Content-Type %r" % (where, ctype))
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    events = [e for e in text.split("\n\n") if e.strip()]
    payloads = []
    for event in events:
        lines = [ln for ln in event.split("\n") if not ln.startswith(":")]
        if not lines:
            continue  # Only SSE comments (the router's keep-alives).
        if not ck.expect(len(lines) == 1 and lines[0].startswith("data: "),
                         "%s: event is not one `data: ` line: %r"
                         % (where, event[:200])):
            return
        payloads.append(lines[0][len("data: "):])
    if not ck.expect(payloads and payloads[-1] == "[DONE]",
                     "%s: the stream does not end with `data: [DONE]` "
                     "(last event %r)"
                     % (where, payloads[-1][:200] if payloads else None)):
        return
    ck.expect(payloads.count("[DONE]") == 1, "%s: [DONE] sent %d times"
              % (where, payloads.count("[DONE]")))
    for p in payloads[:-1]:
        try:
            json.loads(p)
        except ValueError:
            ck.fail("%s: event data is not JSON: %r" % (where, p[:200]))
            return


def run_checks(args, ck):
    client = openai.OpenAI(base_url=args.base_url, api_key="none",
                           timeout=args.timeout, max_retries=0)
    try:
        models = [m.id for m in client.models.list()]
    except openai.APIError as e:
        ck.fail("GET /v1/models: %s: %s" % (type(e).__name__, e))
        return
    if not ck.expect(len(models) >= 1, "GET /v1/models listed no model"):
        return
    model = args.model or models[0]
    ck.expect(model in models, "--model %r not among listed models %s"
              % (model, models))
    print("models: %s; using %r" % (models, model), file=sys.stderr)

    for prompt in args.prompt:
        for chat in (False, True):
            streamed = run_request(ck, client, args, model, prompt, chat,
                                   True)
            plain = run_request(ck, client, args, model, prompt, chat, False)
            for record in (streamed, plain):
                if record is not None:
                    print(json.dumps(record), flush=True)
            compare(ck, streamed, plain)

    check_sse(ck, args, model, args.prompt[0])
    for path in ("/completions", "/chat/completions"):
        expect_error(ck, args, path, b'{"model": "x", "prompt": ', 400)
    expect_error(ck, args, "/completions",
                 {"model": model, "prompt": args.prompt[0], "max_tokens": 4,
                  "temperature": -1}, 400, names="temperature")
    expect_error(ck, args, "/chat/completions",
                 {"model": model, "max_tokens": 4, "temperature": -1,
                  "messages": [{"role": "user", "content": args.prompt[0]}]},
                 400, names="temperature")
    expect_error(ck, args, "/completions",
                 {"model": "pdserve-no-such-model", "prompt": args.prompt[0],
                  "max_tokens": 4}, 404)
    health = args.base_url[:-len("/v1")] + "/health"
    try:
        code, _, data = http("GET", health, None, args.timeout)
        ck.expect(code == 200, "GET /health: HTTP %d (body %r)"
                  % (code, data[:300]))
    except (OSError, urllib.error.URLError) as e:
        ck.fail("GET /health: %s" % e)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base_url", required=True,
                        metavar="http://HOST:PORT/v1",
                        help="the router's OpenAI API base URL")
    parser.add_argument("--prompt", action="append", default=None,
                        help="a prompt (repeatable; default one built-in "
                        "prompt)")
    parser.add_argument("--max_tokens", type=int, default=16,
                        help="max_tokens of every generation (default 16)")
    parser.add_argument("--model", default="",
                        help="model id (default: the first /v1/models lists)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="timeout of every call, seconds (default 120)")
    args = parser.parse_args(argv)
    args.base_url = args.base_url.rstrip("/")
    if not args.base_url.startswith(("http://", "https://")) or \
            not args.base_url.endswith("/v1"):
        parser.error("--base_url must look like http://HOST:PORT/v1")
    if args.max_tokens < 1:
        parser.error("--max_tokens must be >= 1")
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")
    if not args.prompt:
        args.prompt = ["The capital of France is"]
    if any(p == "" for p in args.prompt):
        parser.error("--prompt must not be empty")
    return args


def main(argv=None):
    args = parse_args(argv)
    ck = Checker()
    try:
        run_checks(args, ck)
    except Exception as e:  # a bug here is a failure, not a hang
        ck.fail("unexpected %s: %s" % (type(e).__name__, e))
    if ck.failures:
        print("openai_check: %d check(s) failed" % len(ck.failures),
              file=sys.stderr)
        return 1
    print("openai_check: all checks passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
