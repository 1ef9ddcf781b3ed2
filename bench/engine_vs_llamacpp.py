#!/usr/bin/env python3
"""pdserve's engine and llama.cpp on the same models, alternating, same run.

For each round and each model (NAME=GGUF), runs in turn:
  tools/llamacpp_speed.py --threads=2 (llama.cpp's pp128, pp512, tg128);
  and for each of the engine's arithmetics (--arithmetics: ggml, llama.cpp's
  order and the default, and block_sums, kernels::PackedArithmetic):
    engine_bench --threads=2 (prefill 128/512, single-stream decode against
        the roofline measured in the same run, batched decode at
        1/8/32/64);
    engine_bench --threads=1 --only=sweep (batch 1, 2, 4, 8, 16: what a
        serving worker with one forward-pass thread sees).
Each (model, arithmetic) is a row of its own ("NAME" for ggml's order,
"NAME, block sums"), compared with the same llama.cpp runs.
Each batching goal is printed with its bound in the same invocation: the
products' compute ceiling engine_bench measures (a token's multiply-adds at
the multiply pipes' limit for the arithmetic's instruction mix, on every
thread; bench/pipe_ceiling.h) over the batch-1 speed. No batch can beat
it, so a goal above it is out of this CPU's reach in that arithmetic.
Every ratio is taken within a round (the machines are noisy; drift hits the
parts of one round alike) and the median over rounds is reported, next to
the goals of issue 20:
  one thread: batch 8 >= 4x and batch 16 >= 6x a single stream;
  two threads: batch 32 >= 5x a single stream on the default model, >= 8x
      on the 1B shape (decode there is memory-bound);
  Q8_0: prefill >= 2x llama.cpp, decode >= 0.9 of the memory roofline.
Writes <out>/engine_vs_llamacpp.json (every round's raw figures too), .txt
(the table printed) and .png.

  scripts/pd-bench engine-vs-llamacpp   (builds, makes the models, plots)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

GOALS = {
    "sweep_8x": 4.0,
    "sweep_16x": 6.0,
    "batch32x_default": 5.0,
    "batch32x_1b": 8.0,
    "q8_0_prefill_vs_llamacpp": 2.0,
    "q8_0_decode_roofline": 0.9,
}


def run_json(cmd, what):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        print(f"  {what}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        subprocess.run(cmd + [f"--json_out={path}"], check=True,
                       stdout=sys.stderr)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def row_name(name, arithmetic):
    if arithmetic == "ggml":
        return name
    return f"{name}, {arithmetic.replace('_', ' ')}"


def one_round(args, name, model):
    """{row name: that row's figures} for one model, every arithmetic."""
    llama = run_json([args.llamacpp_python, args.llamacpp_speed,
                      f"--model={model}", "--threads=2",
                      f"--runs={args.runs}"], f"{name}: llama.cpp, 2 threads")
    rows = {}
    for arithmetic in args.arithmetics:
        row = row_name(name, arithmetic)
        flag = f"--matmul_arithmetic={arithmetic}"
        two = run_json([args.engine_bench, f"--model={model}", "--threads=2",
                        f"--runs={args.runs}", flag,
                        "--only=prefill,decode,batched"],
                       f"{row}: pdserve, 2 threads")
        sweep = run_json([args.engine_bench, f"--model={model}",
                          "--threads=1", f"--runs={args.runs}", flag,
                          "--only=sweep"],
                         f"{row}: pdserve, 1 thread, batch sweep")
        rows[row] = row_figures(two, sweep, llama)
    return rows


def row_figures(two, sweep, llama):
    b = two["batched_decode_tps"]
    s = sweep["sweep_tps"]
    c1, c2 = sweep["products_ceiling_tps"], two["products_ceiling_tps"]
    # The products' compute ceiling over batch 1 (no batch can pass it) and
    # the batches' share of it; none where engine_bench measured no ceiling
    # (a format without a VNNI kernel, a CPU without AVX-512 VNNI).
    ceiling_ratios = {} if c1 <= 0 or c2 <= 0 else {
        "ceiling_sweep_x": c1 / s["1"], "ceiling_batch32x": c2 / b["1"],
        "sweep_16_of_ceiling": s["16"] / c1,
        "batch32_of_ceiling": b["32"] / c2}
    ceiling_figures = {} if not ceiling_ratios else {
        "ceiling_1t": c1, "ceiling_2t": c2}
    return {
        "pdserve_2t": two, "pdserve_1t_sweep": sweep, "llamacpp_2t": llama,
        "ratios": {
            "prefill_128_vs_llamacpp": two["prefill_128_tps"] / llama["pp128"],
            "prefill_512_vs_llamacpp": two["prefill_512_tps"] / llama["pp512"],
            "decode_vs_llamacpp": two["decode_single_tps"] / llama["tg128"],
            "decode_roofline": two["decode_roofline_ratio"],
            "batch32x": b["32"] / b["1"],
            "sweep_2x": s["2"] / s["1"], "sweep_4x": s["4"] / s["1"],
            "sweep_8x": s["8"] / s["1"], "sweep_16x": s["16"] / s["1"],
            **ceiling_ratios,
        },
        "figures": {
            "pdserve_prefill_512": two["prefill_512_tps"],
            "llamacpp_prefill_512": llama["pp512"],
            "pdserve_decode": two["decode_single_tps"],
            "llamacpp_decode": llama["tg128"],
            "roofline": two["decode_roofline_tps"],
            "pdserve_batch32": b["32"],
            **{f"sweep_{k}": v for k, v in s.items()},
            **ceiling_figures,
        },
    }


def medians(rounds, key):
    names = rounds[0][key].keys()
    return {n: statistics.median(r[key][n] for r in rounds) for n in names}


def goal_lines(name, m):
    """(goal, figure, met, bound) for the goals that apply to model `name`;
    bound: a batching goal's ratio at the products' compute ceiling, capped
    at the batch (None for the other goals, and for results that predate
    it)."""
    r = m["ratios"]

    def bound(key, batch):
        return min(batch, r[key]) if key in r else None

    out = [(">= 4x at batch 8, one thread", r["sweep_8x"],
            r["sweep_8x"] >= GOALS["sweep_8x"], bound("ceiling_sweep_x", 8)),
           (">= 6x at batch 16, one thread", r["sweep_16x"],
            r["sweep_16x"] >= GOALS["sweep_16x"],
            bound("ceiling_sweep_x", 16))]
    want = GOALS["batch32x_1b"] if "1b" in name else GOALS["batch32x_default"]
    out.append((f">= {want:g}x at batch 32, two threads", r["batch32x"],
                r["batch32x"] >= want, bound("ceiling_batch32x", 32)))
    if "q8_0" in name:
        out.append((">= 2x llama.cpp's prefill (512)",
                    r["prefill_512_vs_llamacpp"],
                    r["prefill_512_vs_llamacpp"] >=
                    GOALS["q8_0_prefill_vs_llamacpp"], None))
        out.append((">= 0.9 of the roofline, decode", r["decode_roofline"],
                    r["decode_roofline"] >= GOALS["q8_0_decode_roofline"],
                    None))
    return out


def table(result):
    lines = [f"pdserve engine vs llama.cpp "
             f"({result['llama_cpp_python']}), medians of "
             f"{result['rounds']} alternating rounds, ratios within a round",
             ""]
    for name, m in result["models"].items():
        f, r = m["figures"], m["ratios"]
        lines += [
            f"{name} ({m['file']})",
            f"  prefill 512, 2 threads   {f['pdserve_prefill_512']:8.1f} vs "
            f"llama.cpp {f['llamacpp_prefill_512']:7.1f} tokens/s  "
            f"({r['prefill_512_vs_llamacpp']:.2f}x; 128 tokens: "
            f"{r['prefill_128_vs_llamacpp']:.2f}x)",
            f"  decode, 2 threads        {f['pdserve_decode']:8.1f} vs "
            f"llama.cpp {f['llamacpp_decode']:7.1f} tokens/s  "
            f"({r['decode_vs_llamacpp']:.2f}x; {r['decode_roofline']:.2f} "
            f"of the roofline, {f['roofline']:.1f})",
            f"  batch 32, 2 threads      {f['pdserve_batch32']:8.1f} tokens/s "
            f"aggregate ({r['batch32x']:.2f}x batch 1)",
            "  one thread, batch 1/2/4/8/16: " + " / ".join(
                f"{f[f'sweep_{b}']:.1f}" for b in (1, 2, 4, 8, 16)) +
            " tokens/s (" + " / ".join(
                f"{r[f'sweep_{b}x']:.2f}x" for b in (2, 4, 8, 16)) + ")",
        ]
        # Old result files predate the hand-off figures.
        if "pool_handoff_first_ns" in m["rounds"][0]["pdserve_2t"]:
            lines.append(
                "  pool hand-off, 2 threads, first/last per round: " +
                ", ".join(f"{rd['pdserve_2t']['pool_handoff_first_ns']:.0f}/"
                          f"{rd['pdserve_2t']['pool_handoff_last_ns']:.0f}"
                          for rd in m["rounds"]) +
                " ns (several hundred: the host put the vCPUs far apart)")
        if "ceiling_1t" in f:
            lines.append(
                f"  products' compute ceiling: {f['ceiling_1t']:.1f} tokens/s "
                f"one thread, {f['ceiling_2t']:.1f} two (the arithmetic's "
                f"multiply-pipe mix; batch 16 at "
                f"{r['sweep_16_of_ceiling']:.2f} and batch 32 at "
                f"{r['batch32_of_ceiling']:.2f} of it)")
        for goal, figure, met, at_ceiling in goal_lines(name, m):
            line = (f"  goal {goal:38s} {figure:6.2f}  "
                    f"{'met' if met else 'MISSED'}")
            if at_ceiling is not None:
                line += f"  (at the ceiling: {at_ceiling:.2f}x)"
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(result["models"].items())
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    x = range(len(models))
    labels = [n for n, _ in models]
    w = 0.38
    for ax, ours, theirs, title in (
            (axes[0], "pdserve_prefill_512", "llamacpp_prefill_512",
             "prefill, 512 tokens, 2 threads"),
            (axes[1], "pdserve_decode", "llamacpp_decode",
             "single-stream decode, 2 threads")):
        ax.bar([i - w / 2 for i in x], [m["figures"][ours] for _, m in models],
               w, label="pdserve")
        ax.bar([i + w / 2 for i in x],
               [m["figures"][theirs] for _, m in models], w,
               label="llama.cpp")
        if ours == "pdserve_decode":
            ax.scatter(list(x), [m["figures"]["roofline"] for _, m in models],
                       marker="_", s=600, color="k", label="memory roofline")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=20, ha="right")
        ax.set_ylabel("tokens/s")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend()
    batches = [1, 2, 4, 8, 16]
    for name, m in models:
        line, = axes[2].plot(batches, [1.0] + [m["ratios"][f"sweep_{b}x"]
                                               for b in batches[1:]],
                             marker="o", label=name)
        if "ceiling_sweep_x" in m["ratios"]:  # dotted: the compute ceiling
            c = m["ratios"]["ceiling_sweep_x"]
            axes[2].plot([4, 16], [c, c], ":", color=line.get_color())
    axes[2].plot([8, 16], [GOALS["sweep_8x"], GOALS["sweep_16x"]], "k*",
                 markersize=12, label="goals")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("sequences decoding together (one thread)")
    axes[2].set_ylabel("aggregate tokens/s / batch 1")
    axes[2].set_title("one-thread batched decode\n"
                      "(dotted: the products' compute ceiling)")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine_bench", required=True)
    ap.add_argument("--llamacpp_python", required=True,
                    help="the Python that has llama_cpp")
    ap.add_argument("--llamacpp_speed", default="tools/llamacpp_speed.py")
    ap.add_argument("--models", required=True, nargs="+",
                    help="NAME=GGUF; NAME containing 1b / q8_0 selects "
                         "those goals")
    ap.add_argument("--arithmetics", nargs="+",
                    default=["ggml", "block_sums"],
                    choices=["ggml", "block_sums"],
                    help="the engine's --matmul_arithmetic values to run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3,
                    help="runs per measurement within a round (median)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    models = dict(m.split("=", 1) for m in args.models)
    files = {row_name(name, a): path for name, path in models.items()
             for a in args.arithmetics}
    rounds = {row: [] for row in files}
    for i in range(args.rounds):
        print(f"round {i + 1} of {args.rounds}", file=sys.stderr, flush=True)
        for name, path in models.items():
            for row, figures in one_round(args, name, path).items():
                rounds[row].append(figures)
    first = next(iter(rounds.values()))[0]
    result = {"rounds": args.rounds,
              "llama_cpp_python": first["llamacpp_2t"]["llama_cpp_python"],
              "bandwidth_gbps": statistics.median(
                  r["pdserve_2t"]["bandwidth_gbps"]
                  for rs in rounds.values() for r in rs),
              "goals": GOALS, "models": {}}
    for name, rs in rounds.items():
        m = {"file": os.path.basename(files[name]),
             "matmul_arithmetic": rs[0]["pdserve_2t"]["matmul_arithmetic"],
             "ratios": medians(rs, "ratios"),
             "figures": medians(rs, "figures")}
        m["goals"] = [{"goal": g, "figure": f, "met": ok, "at_ceiling": c}
                      for g, f, ok, c in goal_lines(name, m)]
        m["rounds"] = rs
        result["models"][name] = m
    # The JSON first: the rounds took most of an hour.
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "engine_vs_llamacpp")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    text = table(result)
    print(text)
    with open(base + ".txt", "w") as f:
        f.write(text + "\n")
    plot(result, base + ".png")


if __name__ == "__main__":
    main()
