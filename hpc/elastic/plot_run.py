#!/usr/bin/python3
"""Plots an elastic sinew-train run from its metrics (JSON Lines): world size, throughput and training
loss over time, with the membership events marked (failure, shrink, grow), and resumes from a checkpoint
(a relaunch: a requeued Slurm job, sinew-supervise).

usage: plot_run.py METRICS.jsonl OUT.png [--title TEXT]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"failure": "tab:red", "shrink": "tab:orange", "grow": "tab:green", "resume": "tab:cyan"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("out")
    ap.add_argument("--title", default="Elastic training: job-server resizes and a killed rank")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.metrics) if l.strip()]
    t0 = min(r["unix_time"] for r in rows)
    steps = [r for r in rows if "loss" in r and "event" not in r]
    t = [r["unix_time"] - t0 for r in steps]
    # A relaunch (resume event) leaves a gap with no training: the lines break there, and the gap is shaded.
    resumes = [r["unix_time"] - t0 for r in rows if r.get("event") == "resume"]
    gaps = []
    for x in resumes:
        before = [v for v in t if v < x]
        if before:
            gaps.append((max(before), x))

    def broken(values):
        xs, ys = [], []
        for i, (x, y) in enumerate(zip(t, values)):
            if i and any(t[i - 1] <= g0 and x >= g1 for g0, g1 in gaps):
                xs.append(float("nan"))
                ys.append(float("nan"))
            xs.append(x)
            ys.append(y)
        return xs, ys

    fig, axes = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    axes[0].step(*broken([r["world_size"] for r in steps]), where="post", color="black")
    axes[0].set_ylabel("ranks")
    axes[0].set_ylim(0, max(r["world_size"] for r in steps) + 1)
    axes[1].plot(*broken([r["samples_per_s"] for r in steps]), color="tab:blue", lw=1)
    axes[1].set_ylabel("samples/s")
    axes[2].plot(*broken([r["loss"] for r in steps]), color="tab:purple", lw=1)
    for k, (g0, g1) in enumerate(gaps):
        for ax in axes:
            ax.axvspan(g0, g1, color="0.85", lw=0, label="stopped: relaunch" if k == 0 and ax is axes[0] else None)
    axes[2].set_ylabel("training loss")
    axes[2].set_xlabel("seconds since start")
    seen = set()
    stacked = []  # x positions already labelled, to stack labels of simultaneous events
    for r in rows:
        ev = r.get("event")
        if ev not in COLORS:
            continue
        # A failure is marked where it was detected; its shrink and regrowth are logged once recovered.
        x = r.get("detected_unix_time", r["unix_time"]) - t0
        level = sum(1 for s in stacked if abs(s - x) < 0.05 * (t[-1] - t[0]))
        stacked.append(x)
        label = ev if ev not in seen else None
        seen.add(ev)
        for ax in axes:
            ax.axvline(x, color=COLORS[ev], ls="--", lw=1, label=label if ax is axes[0] else None)
        if ev == "resume":  # a relaunch (a requeued Slurm job, sinew-supervise) from a checkpoint
            text = f"resume\nstep {r.get('step', '?')}"
        else:
            to = r["from_world_size"] - r["lost"] if ev == "failure" else r.get("world_size", "?")
            text = f"{ev}\n{r.get('from_world_size', '?')}→{to}"
        axes[0].annotate(text, (x, 0.3 + 1.1 * level),
                         fontsize=7, color=COLORS[ev], xytext=(2, 0), textcoords="offset points")
    axes[0].legend(loc="upper right", fontsize=8)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].set_title(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
