#!/usr/bin/env python3
"""Checks a live pdserve router's gRPC client API (pdserve.v1.Generation).

What it checks, against --grpc HOST:PORT:
  * ListModels lists at least one model (the one used is --model, or the
    first listed);
  * Tokenize of the first prompt returns token ids, one piece per id and a
    context length;
  * for each --prompt, a streaming Generate with greedy sampling
    (temperature 0, max_tokens=--max_tokens, include_usage + include_timing)
    and, with --seed N, the same prompt sampled at temperature 0.8,
    top_p 0.95, seed N, twice (the two runs must agree token for token).
    Every stream must follow proto/client.proto: one request_id throughout,
    generated_offset contiguous from 0, finish_reason only and exactly on the
    last chunk (STOP or LENGTH; LENGTH means exactly max_tokens tokens),
    Usage on the last chunk only, with completion_tokens = tokens streamed
    and prompt_tokens = the Tokenize count for the same text, Timing on the
    first and last chunks, and non-empty text overall;
  * Generate with an empty prompt text ends with INVALID_ARGUMENT.

Python stubs are generated at start from proto/common.proto and
proto/client.proto (found from this file's location, or --proto_root) into a
temporary folder, with /usr/bin/protoc and /usr/bin/grpc_python_plugin
(Debian's protobuf-compiler and protobuf-compiler-grpc), or with a
grpc_tools module new enough for proto3 `optional` fields.

Output: one JSON object per generation request on stdout, e.g.
  {"api": "grpc", "prompt": "...", "mode": "greedy", "text": "...",
   "token_ids": [...], "finish_reason": "length", "usage": {...},
   "ttft_ms": 12.3, "chunks": 16, ...}
so a caller can compare text and token ids with other front ends or with the
offline engine. Exit status 0 when every check passed; 1 otherwise, with one
"FAIL: ..." line per failed check on stderr; 2 for bad arguments.

The C++ multi-process tests start a router and workers, then run this script
with the venv interpreter from scripts/python_env.sh ($PDSERVE_PYTHON, made
by scripts/setup.sh) and parse its stdout:
  $PDSERVE_PYTHON tests/clients/grpc_generate_check.py --grpc 127.0.0.1:PORT \
      --prompt "The capital of France is" --max_tokens 16 --seed 7
Every call has a deadline (--timeout seconds), so the script never hangs.
Needs only grpcio, protobuf (>= 3.20) and the standard library.
"""

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import grpc
except ImportError as e:  # run with the wrong interpreter
    sys.exit("%s: %s; run it with $PDSERVE_PYTHON (the venv made by "
             "scripts/setup.sh), which has grpcio and protobuf"
             % (sys.argv[0], e))

PROTOS = ("proto/common.proto", "proto/client.proto")


def default_proto_root():
    """The repository root: two levels above this file (not resolving
    symlinks first, so bazel runfiles trees work; resolving as a fallback)."""
    for path in (os.path.abspath(__file__), os.path.realpath(__file__)):
        root = os.path.dirname(os.path.dirname(os.path.dirname(path)))
        if all(os.path.isfile(os.path.join(root, p)) for p in PROTOS):
            return root
    return os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))


def find_tool(explicit, name):
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    fallback = os.path.join("/usr/bin", name)
    return fallback if os.access(fallback, os.X_OK) else None


def generate_stubs(proto_root, out_dir, protoc=None, plugin=None):
    """Compiles PROTOS into out_dir/proto/*_pb2{,_grpc}.py and imports them.

    Returns (common_pb2, client_pb2, client_pb2_grpc). Raises RuntimeError
    with the compiler's message when no working compiler is found.
    """
    for p in PROTOS:
        if not os.path.isfile(os.path.join(proto_root, p)):
            raise RuntimeError("%s not found under %s (use --proto_root)"
                               % (p, proto_root))
    errors = []
    commands = []
    protoc_path = find_tool(protoc, "protoc")
    plugin_path = find_tool(plugin, "grpc_python_plugin")
    if protoc_path and plugin_path:
        commands.append([protoc_path,
                         "--plugin=protoc-gen-grpc_python=" + plugin_path])
    else:
        errors.append("protoc (%s) or grpc_python_plugin (%s) not found"
                      % (protoc_path, plugin_path))
    # grpc_tools bundles its own protoc; Debian's 1.14 is too old for proto3
    # `optional`, a PyPI grpcio-tools works.
    commands.append([sys.executable, "-m", "grpc_tools.protoc"])
    for base in commands:
        cmd = base + ["-I" + proto_root, "--python_out=" + out_dir,
                      "--grpc_python_out=" + out_dir] + list(PROTOS)
        try:
            res = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            errors.append("%s: %s" % (" ".join(base), e))
            continue
        if res.returncode == 0:
            break
        errors.append("%s: exit %d: %s" % (" ".join(base), res.returncode,
                                           res.stderr.strip()[:2000]))
    else:
        raise RuntimeError("could not compile the protos:\n  "
                           + "\n  ".join(errors))
    # A regular package (with __init__.py) first on sys.path, so no other
    # package named `proto` (e.g. proto-plus) can shadow the stubs.
    open(os.path.join(out_dir, "proto", "__init__.py"), "w").close()
    sys.path.insert(0, out_dir)
    for name in list(sys.modules):
        if name == "proto" or name.startswith("proto."):
            del sys.modules[name]
    try:
        common_pb2 = importlib.import_module("proto.common_pb2")
        client_pb2 = importlib.import_module("proto.client_pb2")
        client_pb2_grpc = importlib.import_module("proto.client_pb2_grpc")
    except Exception as e:  # e.g. a protobuf runtime older than protoc
        raise RuntimeError("generated stubs do not import (protobuf runtime "
                           "too old for this protoc?): %r" % (e,))
    return common_pb2, client_pb2, client_pb2_grpc


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


def rpc_error_text(e):
    return "%s: %s" % (e.code().name, e.details())


def usage_dict(usage):
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_prompt_tokens": usage.cached_prompt_tokens,
    }


def timing_dict(timing):
    return {
        "queue_ms": timing.queue_ms,
        "ttft_ms": timing.ttft_ms,
        "tpot_ms": timing.tpot_ms,
        "e2e_ms": timing.e2e_ms,
        "prefill_worker_id": timing.prefill_worker_id,
        "decode_worker_id": timing.decode_worker_id,
        "kv_transfer_ms": timing.kv_transfer_ms,
        "migrations": timing.migrations,
        "prefill_attempts": timing.prefill_attempts,
    }


def run_generate(ck, stub, pb, common, args, model, prompt, mode,
                 prompt_tokens, repeat=False):
    """One streaming Generate; checks the stream; returns the JSON record
    (None when the call failed)."""
    sampling = common.SamplingParams(max_tokens=args.max_tokens)
    if mode == "greedy":
        sampling.temperature = 0.0
    else:
        sampling.temperature = 0.8
        sampling.top_p = 0.95
        sampling.seed = args.seed
    request = pb.GenerateRequest(
        model=model, text=prompt, sampling=sampling,
        stream_options=pb.StreamOptions(include_usage=True,
                                        include_timing=True))
    where = "Generate(%s%s, %r)" % (mode, ", repeat" if repeat else "",
                                    prompt)
    chunks = []
    start = time.monotonic()
    ttft_ms = None
    try:
        for chunk in stub.Generate(request, timeout=args.timeout):
            if ttft_ms is None and len(chunk.token_ids) > 0:
                ttft_ms = (time.monotonic() - start) * 1000.0
            chunks.append(chunk)
    except grpc.RpcError as e:
        ck.fail("%s ended with %s after %d chunks"
                % (where, rpc_error_text(e), len(chunks)))
        return None
    e2e_ms = (time.monotonic() - start) * 1000.0
    if not ck.expect(chunks, "%s: the stream had no chunk" % where):
        return None

    unspecified = common.FINISH_REASON_UNSPECIFIED
    request_id = chunks[0].request_id
    ck.expect(request_id, "%s: empty request_id" % where)
    token_ids = []
    text = ""
    for i, c in enumerate(chunks):
        last = i == len(chunks) - 1
        ck.expect(c.request_id == request_id,
                  "%s: chunk %d request_id %r != %r"
                  % (where, i, c.request_id, request_id))
        ck.expect(c.generated_offset == len(token_ids),
                  "%s: chunk %d generated_offset %d, expected %d (gap or "
                  "repeat)" % (where, i, c.generated_offset, len(token_ids)))
        ck.expect(len(c.logprobs) == 0,
                  "%s: chunk %d has logprobs that were not asked for"
                  % (where, i))
        if not last:
            ck.expect(c.finish_reason == unspecified,
                      "%s: chunk %d of %d (not the last) has finish_reason %s"
                      % (where, i, len(chunks),
                         common.FinishReason.Name(c.finish_reason)))
            ck.expect(not c.HasField("usage"),
                      "%s: chunk %d (not the last) carries usage"
                      % (where, i))
        token_ids.extend(c.token_ids)
        text += c.text

    final = chunks[-1]
    n = len(token_ids)
    reasons = {common.FINISH_REASON_STOP: "stop",
               common.FINISH_REASON_LENGTH: "length"}
    finish = reasons.get(final.finish_reason)
    ck.expect(finish is not None,
              "%s: last chunk finish_reason is %s, expected STOP or LENGTH"
              % (where, common.FinishReason.Name(final.finish_reason)))
    ck.expect(n >= 1, "%s: no token generated" % where)
    ck.expect(n <= args.max_tokens, "%s: %d tokens > max_tokens %d"
              % (where, n, args.max_tokens))
    if finish == "length":
        ck.expect(n == args.max_tokens,
                  "%s: finish_reason LENGTH after %d tokens, max_tokens %d"
                  % (where, n, args.max_tokens))
    if final.WhichOneof("matched_stop") == "stop_token_id":
        ck.expect(n > 0 and token_ids[-1] == final.stop_token_id,
                  "%s: matched stop_token_id %d is not the last token"
                  % (where, final.stop_token_id))
    ck.expect(text != "", "%s: empty text overall (token ids %s)"
              % (where, token_ids))

    usage = None
    if ck.expect(final.HasField("usage"),
                 "%s: last chunk has no usage (include_usage)" % where):
        usage = usage_dict(final.usage)
        ck.expect(final.usage.completion_tokens == n,
                  "%s: usage.completion_tokens %d != %d tokens streamed"
                  % (where, final.usage.completion_tokens, n))
        ck.expect(final.usage.prompt_tokens > 0,
                  "%s: usage.prompt_tokens is 0" % where)
        if prompt_tokens is not None:
            ck.expect(final.usage.prompt_tokens == prompt_tokens,
                      "%s: usage.prompt_tokens %d != Tokenize count %d"
                      % (where, final.usage.prompt_tokens, prompt_tokens))
        ck.expect(final.usage.cached_prompt_tokens
                  <= final.usage.prompt_tokens,
                  "%s: cached_prompt_tokens %d > prompt_tokens %d"
                  % (where, final.usage.cached_prompt_tokens,
                     final.usage.prompt_tokens))
    ck.expect(chunks[0].HasField("timing")
              and chunks[0].timing.ttft_ms > 0,
              "%s: first chunk lacks timing.ttft_ms (include_timing)"
              % where)
    timing = None
    if ck.expect(final.HasField("timing"),
                 "%s: last chunk has no timing (include_timing)" % where):
        timing = timing_dict(final.timing)
        ck.expect(final.timing.e2e_ms >= final.timing.ttft_ms > 0,
                  "%s: timing ttft_ms %.3f, e2e_ms %.3f inconsistent"
                  % (where, final.timing.ttft_ms, final.timing.e2e_ms))
        ck.expect(final.timing.decode_worker_id != "",
                  "%s: timing.decode_worker_id empty" % where)

    record = {
        "api": "grpc",
        "prompt": prompt,
        "mode": mode,
        "model": model,
        "request_id": request_id,
        "text": text,
        "token_ids": token_ids,
        "finish_reason": finish,
        "usage": usage,
        "ttft_ms": ttft_ms,
        "e2e_ms": e2e_ms,
        "chunks": len(chunks),
        "timing": timing,
    }
    if mode == "seeded":
        record["seed"] = args.seed
    return record


def check_invalid_argument(ck, stub, pb, common, args, model):
    request = pb.GenerateRequest(
        model=model, text="",
        sampling=common.SamplingParams(temperature=0.0,
                                       max_tokens=args.max_tokens))
    chunks = 0
    try:
        for _ in stub.Generate(request, timeout=args.timeout):
            chunks += 1
    except grpc.RpcError as e:
        ck.expect(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                  "Generate with empty prompt text: expected "
                  "INVALID_ARGUMENT, got %s" % rpc_error_text(e))
        ck.expect(chunks == 0, "Generate with empty prompt text: %d chunks "
                  "before the error" % chunks)
        return
    ck.fail("Generate with empty prompt text succeeded (%d chunks); expected "
            "INVALID_ARGUMENT" % chunks)


def run_checks(args, ck, common, pb, pb_grpc):
    channel = grpc.insecure_channel(args.grpc)
    try:
        grpc.channel_ready_future(channel).result(timeout=args.timeout)
    except grpc.FutureTimeoutError:
        ck.fail("could not connect to %s within %gs"
                % (args.grpc, args.timeout))
        return
    stub = pb_grpc.GenerationStub(channel)

    try:
        models = stub.ListModels(pb.ListModelsRequest(),
                                 timeout=args.timeout).models
    except grpc.RpcError as e:
        ck.fail("ListModels: %s" % rpc_error_text(e))
        return
    if not ck.expect(len(models) >= 1, "ListModels listed no model"):
        return
    ids = [m.id for m in models]
    ck.expect(all(ids), "ListModels: a model has an empty id: %s" % ids)
    model = args.model or ids[0]
    ck.expect(model in ids, "--model %r not among listed models %s"
              % (model, ids))
    print("models: %s; using %r" % (ids, model), file=sys.stderr)

    prompt_tokens = {}
    for prompt in args.prompt:
        try:
            tok = stub.Tokenize(pb.TokenizeRequest(model=model, text=prompt),
                                timeout=args.timeout)
        except grpc.RpcError as e:
            ck.fail("Tokenize(%r): %s" % (prompt, rpc_error_text(e)))
            continue
        ok = ck.expect(len(tok.token_ids) > 0,
                       "Tokenize(%r): no token ids" % prompt)
        ok &= ck.expect(len(tok.pieces) == len(tok.token_ids),
                        "Tokenize(%r): %d pieces for %d ids"
                        % (prompt, len(tok.pieces), len(tok.token_ids)))
        ok &= ck.expect(tok.context_length > 0,
                        "Tokenize(%r): context_length 0" % prompt)
        ok &= ck.expect(tok.rendered_prompt == "",
                        "Tokenize(%r): rendered_prompt set for text input"
                        % prompt)
        if ok:
            prompt_tokens[prompt] = len(tok.token_ids)

    for prompt in args.prompt:
        modes = ["greedy"] + (["seeded"] if args.seed is not None else [])
        for mode in modes:
            record = run_generate(ck, stub, pb, common, args, model, prompt,
                                  mode, prompt_tokens.get(prompt))
            if record is None:
                continue
            if mode == "seeded":
                again = run_generate(ck, stub, pb, common, args, model,
                                     prompt, mode, prompt_tokens.get(prompt),
                                     repeat=True)
                if again is not None:
                    same = again["token_ids"] == record["token_ids"]
                    record["repeat_identical"] = same
                    ck.expect(same, "Generate(seeded, %r): two runs with "
                              "seed %d differ: %s vs %s"
                              % (prompt, args.seed, record["token_ids"],
                                 again["token_ids"]))
            print(json.dumps(record), flush=True)

    check_invalid_argument(ck, stub, pb, common, args, model)
    channel.close()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", metavar="HOST:PORT",
                        help="the router's gRPC address (required unless "
                        "--stubs_only)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="a prompt to generate from (repeatable; default "
                        "one built-in prompt)")
    parser.add_argument("--max_tokens", type=int, default=16,
                        help="max_tokens of every generation (default 16)")
    parser.add_argument("--seed", type=int, default=None,
                        help="also run a seeded request (temperature 0.8, "
                        "top_p 0.95) twice per prompt")
    parser.add_argument("--model", default="",
                        help="model id (default: the first ListModels lists)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="deadline of every call, seconds (default 120)")
    parser.add_argument("--proto_root", default=None,
                        help="folder holding proto/*.proto (default: the "
                        "repository this script is in)")
    parser.add_argument("--protoc", default=None, help="protoc binary")
    parser.add_argument("--grpc_python_plugin", default=None,
                        help="grpc_python_plugin binary")
    parser.add_argument("--stubs_only", action="store_true",
                        help="only generate and import the stubs, then exit")
    args = parser.parse_args(argv)
    if not args.stubs_only and not args.grpc:
        parser.error("--grpc HOST:PORT is required")
    if args.max_tokens < 1:
        parser.error("--max_tokens must be >= 1")
    if args.seed is not None and args.seed < 0:
        parser.error("--seed must be >= 0")
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
    with tempfile.TemporaryDirectory(prefix="pdserve_stubs_") as out_dir:
        try:
            common, pb, pb_grpc = generate_stubs(
                args.proto_root or default_proto_root(), out_dir,
                args.protoc, args.grpc_python_plugin)
        except RuntimeError as e:
            ck.fail(str(e))
            return 1
        if args.stubs_only:
            print("stubs: ok (%s)" % ", ".join(
                sorted(pb.DESCRIPTOR.services_by_name)), file=sys.stderr)
            return 0
        try:
            run_checks(args, ck, common, pb, pb_grpc)
        except Exception as e:  # a bug here is a failure, not a hang
            ck.fail("unexpected %s: %s" % (type(e).__name__, e))
    if ck.failures:
        print("grpc_generate_check: %d check(s) failed" % len(ck.failures),
              file=sys.stderr)
        return 1
    print("grpc_generate_check: all checks passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
