#!/usr/bin/env python3
"""Plots kv_transfer_bench results: bandwidth against message size.

Usage: plot_kv_transfer.py OUT.png RESULT.json [RESULT.json ...]
Each JSON (one per UCX_TLS setting) adds two lines: pdserve's UcxTransport
and ucx_perftest on the same transport, plus markers for the KV-shaped cases.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out, inputs = sys.argv[1], sys.argv[2:]
    fig, ax = plt.subplots(figsize=(8, 5))
    for path in inputs:
        with open(path) as f:
            result = json.load(f)
        tls = result["ucx_tls"]
        sweep = [c for c in result["cases"] if c["kind"] == "message"]
        sizes = [c["bytes"] / 1024 for c in sweep]
        ours = ax.plot(sizes, [c["gbps"] for c in sweep], marker="o",
                       label=f"pdserve UcxTransport (UCX_TLS={tls})")
        ax.plot(sizes, [c["perftest_gbps"] for c in sweep], marker="x",
                linestyle="--", color=ours[0].get_color(),
                label=f"ucx_perftest ucp_put_bw -e (UCX_TLS={tls})")
        for c in result["cases"]:
            if c["kind"] != "message":
                ax.scatter([c["bytes"] / 1024], [c["gbps"]], marker="s",
                           color=ours[0].get_color())
                ax.annotate(c["kind"], (c["bytes"] / 1024, c["gbps"]),
                            textcoords="offset points", xytext=(4, 4),
                            fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per write (KiB)")
    ax.set_ylabel("GB/s (median of repetitions)")
    ax.set_title("KV transfer between two processes on one host")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot written to {out}")


if __name__ == "__main__":
    main()
