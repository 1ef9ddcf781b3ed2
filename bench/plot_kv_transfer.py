#!/usr/bin/env python3
"""Plots kv_transfer_bench results: bandwidth against message size.

Usage: plot_kv_transfer.py OUT.png RESULT.json [RESULT.json ...]
Each JSON (one receiver pool kind: allocated or registered) adds pdserve's
streamed and one-at-a-time bandwidth, with markers for the KV-shaped cases;
the first also adds ucx_perftest's put bandwidth with and without -e (peer
error handling), measured in the same run.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out, inputs = sys.argv[1], sys.argv[2:]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for index, path in enumerate(inputs):
        with open(path) as f:
            result = json.load(f)
        memory = result.get("receiver_memory", result["ucx_tls"])
        sweep = [c for c in result["cases"] if c["kind"] == "message"]
        sizes = [c["bytes"] / 1024 for c in sweep]
        ours = ax.plot(sizes, [c["gbps"] for c in sweep], marker="o",
                       label=f"pdserve, {memory} pool, streamed")
        color = ours[0].get_color()
        ax.plot(sizes, [c["single_gbps"] for c in sweep], marker=".",
                linestyle=":", color=color,
                label=f"pdserve, {memory} pool, one write at a time")
        for c in result["cases"]:
            if c["kind"] != "message":
                ax.scatter([c["bytes"] / 1024], [c["gbps"]], marker="s",
                           color=color)
                ax.annotate(c["kind"], (c["bytes"] / 1024, c["gbps"]),
                            textcoords="offset points", xytext=(4, 4),
                            fontsize=8)
        if index == 0:
            ax.plot(sizes, [c["perftest_gbps"] for c in sweep], marker="x",
                    linestyle="--", color="black",
                    label="ucx_perftest ucp_put_bw (no -e: shared memory)")
            ax.plot(sizes, [c["perftest_peer_gbps"] for c in sweep],
                    marker="x", linestyle="--", color="gray",
                    label="ucx_perftest ucp_put_bw -e (peer errors: TCP)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
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
