#!/usr/bin/env python3
"""Plots spec_decode_bench results.

Usage: plot_spec.py OUT.png RESULT.json
Left: median TPOT per workload, plain decoding against n-gram speculation
(with the acceptance rate). Right: what one sequence's forward pass costs
for 1..9 tokens relative to one token, beside the flat line a pass would
follow if verifying drafts were free (the limit on what speculation buys).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        r = json.load(f)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    names = list(r["workloads"].keys())
    plain = [r["workloads"][n]["plain_tpot_ms"] for n in names]
    spec = [r["workloads"][n]["ngram_tpot_ms"] for n in names]
    x = range(len(names))
    left.bar([i - 0.2 for i in x], plain, width=0.4, label="plain decoding")
    left.bar([i + 0.2 for i in x], spec, width=0.4,
             label=f"n-gram speculation (k={r['num_speculative_tokens']})")
    for i, n in enumerate(names):
        w = r["workloads"][n]
        left.annotate(f"{w['tpot_ratio']:.2f}x\n{100 * w['acceptance_rate']:.0f}% acc.",
                      (i + 0.2, spec[i]), ha="center", va="bottom", fontsize=8)
    left.set_xticks(list(x))
    left.set_xticklabels(names)
    left.set_ylabel("TPOT, ms (median over prompts)")
    left.set_title(f"{r['model']}, {r['threads']} thread(s), {r['runs']} runs")
    left.legend(fontsize=8)
    tokens = [p["tokens"] for p in r["pass_cost"]]
    ms = [p["ms"] for p in r["pass_cost"]]
    right.plot(tokens, [m / ms[0] for m in ms], marker="o",
               label="measured pass time / one token's")
    right.plot(tokens, [1] * len(tokens), linestyle="--",
               label="free verification (weights read once)")
    right.plot(tokens, tokens, linestyle=":", label="no sharing at all")
    right.set_xlabel("tokens of one sequence in the pass (1 + drafted)")
    right.set_ylabel("cost relative to one token")
    right.set_title("Verification pass cost, context 300")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
