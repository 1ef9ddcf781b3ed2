#!/usr/bin/env python3
"""Plots engine_bench results: decode tokens/s against batch size, prefill.

Usage: plot_engine.py OUT.png RESULT.json [LLAMACPP.json]

Left: the aggregate decode throughput at each batch size, a dashed line for
the single-stream decode roofline measured in the same run (memory
bandwidth / weight bytes read per step) and llama.cpp's single-stream decode.
Right: prefill tokens/s at 128 and 512 prompt tokens beside llama.cpp's.
llama.cpp's figures come from LLAMACPP.json (tools/llamacpp_speed.py, the
same machine) when given, else from the engine-speed issue's reference table
(another machine, for scale only).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# llama.cpp on the default model's shape and format, 2 threads, on the
# engine-speed issue's Zen 4 machine (its reference table).
ISSUE_TABLE = {"pp128": None, "pp512": 312.0, "tg128": 158.0}


def main():
    out, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        r = json.load(f)
    if len(sys.argv) > 3:
        with open(sys.argv[3]) as f:
            llama = json.load(f)
        where = "same machine"
    else:
        llama = ISSUE_TABLE
        where = "issue 7's Zen 4 machine, not this one"
    batched = sorted((int(b), tps) for b, tps in r["batched_decode_tps"].items())
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 5),
                                 gridspec_kw={"width_ratios": [3, 2]})
    ax.plot([b for b, _ in batched], [t for _, t in batched], marker="o",
            label="pdserve, aggregate decode tokens/s")
    ax.axhline(r["decode_roofline_tps"], linestyle="--", color="gray",
               label=f"single-stream roofline ({r['bandwidth_gbps']:.1f} GB/s "
                     f"/ {r['bytes_per_decode_step'] / 1e6:.0f} MB per step)")
    ax.axhline(llama["tg128"], linestyle=":", color="tab:red",
               label=f"llama.cpp tg128, single stream ({where})")
    ax.set_xscale("log", base=2)
    ax.set_xticks([b for b, _ in batched])
    ax.set_xticklabels([str(b) for b, _ in batched])
    ax.set_xlabel("sequences decoding together (batch)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{r['model']} ({r['quantization']}), {r['threads']} threads, "
                 f"median of {r['runs']} runs\nsingle stream "
                 f"{r['decode_single_tps']:.0f} tok/s = "
                 f"{r['decode_roofline_ratio']:.2f} of roofline", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)

    lengths = [128, 512]
    ours = [r["prefill_128_tps"], r["prefill_512_tps"]]
    theirs = [llama.get(f"pp{n}") or 0.0 for n in lengths]
    xs = range(len(lengths))
    bx.bar([x - 0.2 for x in xs], ours, width=0.4, label="pdserve")
    bx.bar([x + 0.2 for x in xs], theirs, width=0.4, color="tab:red",
           label=f"llama.cpp ({where})")
    bx.set_xticks(list(xs))
    bx.set_xticklabels([f"pp{n}" for n in lengths])
    bx.set_ylabel("prefill tokens/s")
    bx.set_title("prefill, one prompt", fontsize=9)
    bx.grid(True, axis="y", alpha=0.3)
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
