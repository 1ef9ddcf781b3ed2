#!/usr/bin/env python3
"""Plots engine_bench results: decode tokens/s against batch size.

Usage: plot_engine.py OUT.png RESULT.json

One line for the aggregate decode throughput at each batch size, a dashed
line for the single-stream decode roofline measured in the same run
(memory bandwidth / weight bytes read per step), and the llama.cpp
reference figure (tg128, Q4_1, 2 threads) for comparison.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# llama.cpp tg128 on the default model's shape and format, 2 threads
# (the engine-speed issue's reference table).
LLAMA_CPP_DECODE_TPS = 158.0


def main():
    out, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        r = json.load(f)
    batched = sorted((int(b), tps) for b, tps in r["batched_decode_tps"].items())
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot([b for b, _ in batched], [t for _, t in batched], marker="o",
            label="pdserve, aggregate decode tokens/s")
    ax.axhline(r["decode_roofline_tps"], linestyle="--", color="gray",
               label=f"single-stream roofline ({r['bandwidth_gbps']:.1f} GB/s "
                     f"/ {r['bytes_per_decode_step'] / 1e6:.0f} MB per step)")
    ax.axhline(LLAMA_CPP_DECODE_TPS, linestyle=":", color="tab:red",
               label="llama.cpp tg128, single stream (issue 7's Zen 4 machine, not this one)")
    ax.set_xscale("log", base=2)
    ax.set_xticks([b for b, _ in batched])
    ax.set_xticklabels([str(b) for b, _ in batched])
    ax.set_xlabel("sequences decoding together (batch)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{r['model']} ({r['quantization']}), {r['threads']} threads, "
                 f"median of {r['runs']} runs; single stream "
                 f"{r['decode_single_tps']:.0f} tok/s = "
                 f"{r['decode_roofline_ratio']:.2f} of roofline", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
