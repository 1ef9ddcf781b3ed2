#!/usr/bin/env python3
"""Plots `pdctl bench` results (JSON) to one PNG.

    plot_serving.py OUT.png RESULT.json[=LABEL] [RESULT.json[=LABEL] ...]

Four panels: TTFT and TPOT CDFs (one curve per request rate, one line style
per result file), goodput and throughput against the request rate, and p99
TTFT / p99 TPOT against the request rate with the SLO targets. Several
files (e.g. disaggregated and colocated) share the axes for comparison.
"""
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(arg):
    path, _, label = arg.partition("=")
    with open(path) as f:
        report = json.load(f)
    return label or report.get("label") or report.get("target", path), report


def rate_of(run):
    r = run["request_rate"]
    return math.inf if r == "inf" else float(r)


def cdf(ax, values, **kw):
    values = sorted(values)
    if not values:
        return
    n = len(values)
    ax.plot(values, [(i + 1) / n for i in range(n)], **kw)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out, reports = argv[1], [load(a) for a in argv[2:]]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    (ttft_ax, tpot_ax), (good_ax, p99_ax) = axes
    styles = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    slo_ttft = slo_tpot = 0
    for k, (label, report) in enumerate(reports):
        style = styles[k % len(styles)]
        runs = sorted(report["runs"], key=rate_of)
        for i, run in enumerate(runs):
            ok = [r for r in run["requests"] if r["ok"]]
            name = f"{label}, {run['request_rate']}/s"
            color = colors[i % len(colors)]
            cdf(ttft_ax, [r["ttft_ms"] for r in ok], ls=style, color=color,
                label=name)
            cdf(tpot_ax, [r["tpot_ms"] for r in ok if r["output_tokens"] > 1],
                ls=style, color=color, label=name)
            slo_ttft = slo_ttft or run.get("slo_ttft_ms", 0)
            slo_tpot = slo_tpot or run.get("slo_tpot_ms", 0)
        finite = [r for r in runs if math.isfinite(rate_of(r))]
        if finite:
            x = [rate_of(r) for r in finite]
            # Medians over repeats when the run has them.
            med = [r.get("median", {}) for r in finite]
            good_ax.plot(x, [m.get("goodput", r["goodput"])
                             for m, r in zip(med, finite)], "o" + style,
                         label=f"{label}: goodput")
            good_ax.plot(x, [m.get("request_throughput",
                                   r["request_throughput"])
                             for m, r in zip(med, finite)],
                         "x" + style, alpha=0.6,
                         label=f"{label}: throughput")
            p99_ax.plot(x, [m.get("p99_ttft_ms", r["ttft_ms"]["p99"])
                            for m, r in zip(med, finite)],
                        "o" + style, color=colors[0],
                        label=f"{label}: p99 TTFT")
            p99_ax.plot(x, [m.get("p99_tpot_ms", r["tpot_ms"]["p99"])
                            for m, r in zip(med, finite)],
                        "s" + style, color=colors[1],
                        label=f"{label}: p99 TPOT")
    for ax, what, slo in ((ttft_ax, "TTFT", slo_ttft),
                          (tpot_ax, "TPOT", slo_tpot)):
        if slo:
            ax.axvline(slo, color="grey", lw=1, label=f"SLO {slo:g} ms")
        ax.set_xscale("log")
        ax.set_xlabel(f"{what} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{what} CDF")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    good_ax.set_xlabel("request rate (req/s)")
    good_ax.set_ylabel("req/s")
    good_ax.set_title("goodput (requests meeting both SLOs) and throughput")
    good_ax.grid(True, alpha=0.3)
    good_ax.legend(fontsize=7)
    for slo, c in ((slo_ttft, colors[0]), (slo_tpot, colors[1])):
        if slo:
            p99_ax.axhline(slo, color=c, lw=1, alpha=0.5)
    p99_ax.set_yscale("log")
    p99_ax.set_xlabel("request rate (req/s)")
    p99_ax.set_ylabel("ms")
    p99_ax.set_title("p99 TTFT and TPOT (lines: SLO targets)")
    p99_ax.grid(True, alpha=0.3)
    p99_ax.legend(fontsize=7)
    fig.suptitle(" vs ".join(label for label, _ in reports))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
