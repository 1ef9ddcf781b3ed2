#!/usr/bin/env python3
"""Plots planner_sim's JSON (bench/planner_sim.cc) to one PNG.

    plot_planner_sim.py OUT.png planner_sim.json

Four panels sharing the time axis: the trace's request rate per interval;
prefill and decode replicas over time for the planner (asked for and
ready), the oracle and the fixed cluster of the planner's worker-hours;
and each interval's SLO attainment (requests that arrived in it) for the
planner and the oracle, with p99 TTFT beside it.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(run, key):
    return [i["t"] / 60 for i in run["timeline"]], [i[key] for i in run["timeline"]]


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    out, path = argv[1], argv[2]
    with open(path) as f:
        report = json.load(f)
    runs = report["runs"]
    planner, oracle = runs["planner"], runs["oracle"]
    equal = runs["fixed_equal_cost"]
    fig, axes = plt.subplots(4, 1, figsize=(12, 12), sharex=True)
    rate_ax, prefill_ax, decode_ax, slo_ax = axes

    t, rate = series(planner, "rate")
    rate_ax.plot(t, rate, color="black", lw=1)
    rate_ax.set_ylabel("requests/s (per 30 s)")
    tr = report["trace"]
    rate_ax.set_title(
        f"planner_sim: {tr['requests']} requests over {tr['span_s'] / 3600:.1f} h "
        f"(synthetic chat trace, diurnal ramp + bursts); targets TTFT "
        f"{report['targets']['ttft_s']} s, ITL {report['targets']['itl_s'] * 1000:.0f} ms")

    for ax, pool in ((prefill_ax, "prefill"), (decode_ax, "decode")):
        ax.step(*series(oracle, pool), where="post", color="tab:green",
                label="oracle", lw=1)
        ax.step(*series(planner, pool), where="post", color="tab:blue",
                label="planner: asked for", lw=1.2)
        ax.step(*series(planner, pool + "_ready"), where="post",
                color="tab:blue", ls=":", label="planner: ready", lw=1)
        ax.axhline(equal[pool], color="tab:red", ls="--", lw=1,
                   label=f"fixed, planner's worker-hours ({equal[pool]})")
        ax.set_ylabel(f"{pool} workers")
        ax.legend(loc="upper left", fontsize=8)

    for run, name, color in ((planner, "planner", "tab:blue"),
                             (oracle, "oracle", "tab:green"),
                             (equal, "fixed, equal worker-hours", "tab:red")):
        x, a = series(run, "attainment")
        slo_ax.plot(x, [100 * v for v in a], color=color, lw=1, label=name)
    slo_ax.axhline(100 * report["targets"]["goal"], color="gray", ls=":", lw=1)
    slo_ax.set_ylabel("SLO attainment %\n(arrivals per interval)")
    slo_ax.set_ylim(bottom=max(0, slo_ax.get_ylim()[0]))
    slo_ax.set_xlabel("trace time (minutes)")
    slo_ax.legend(loc="lower left", fontsize=8)
    rows = report["table"]
    text = "\n".join(f"{r['policy']}: {100 * r['attainment']:.2f}%, "
                     f"{r['worker_hours']:.0f} worker-h ({r['x_oracle']:.2f}x oracle)"
                     for r in rows)
    slo_ax.text(0.99, 0.02, text, transform=slo_ax.transAxes, fontsize=7,
                ha="right", va="bottom",
                bbox=dict(facecolor="white", alpha=0.8, lw=0))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv)
