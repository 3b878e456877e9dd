#!/usr/bin/python3
"""Plots a run of the teachers' autoscaler (sinew-teacher autoscale --events) over time: the teachers it
runs (a step line, with its starts, stops and teachers that died) and those registered; the students' wait
for logits as a fraction of their step time, against the target (and target / 4, below which a teacher
may be stopped); the students' demand against the teachers' measured capacity (samples/s).

Optionally overlays one student's own step events (sinew-train --events JSONL: records with "step_ms" and
"distill_wait_ms"). They carry no clock: they are placed by their cumulative step time, starting at
--students-offset seconds into the autoscaler's run.

Usage: plot_autoscale.py EVENTS.jsonl OUT.png [--target F] [--students STEPS.jsonl] [--students-offset S]
"""
import argparse
import json
import sys


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                # The autoscaler flushes whole lines, but a copy taken mid-write may end in half of one.
                print(f"plot_autoscale: {path}:{n}: skipped, not JSON ({e})", file=sys.stderr)
    return rows


def student_waits(path, offset):
    """(t, wait fraction) per step record of a sinew-train events file, t from the cumulative step time."""
    t, out = offset, []
    for r in read_jsonl(path):
        if "step_ms" not in r or "distill_wait_ms" not in r or r["step_ms"] <= 0:
            continue
        t += r["step_ms"] / 1000.0
        out.append((t, r["distill_wait_ms"] / r["step_ms"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("events")
    ap.add_argument("out")
    ap.add_argument("--target", type=float, default=0.05, help="the target wait fraction (default 0.05)")
    ap.add_argument("--students", help="a student's sinew-train events JSONL, overlaid")
    ap.add_argument("--students-offset", type=float, default=0.0, help="when that student started (s into the run)")
    args = ap.parse_args()

    events = read_jsonl(args.events)
    # "error": the registry did not answer; such an observation holds no numbers.
    observe = [e for e in events if e.get("event") == "observe" and not e.get("error")]
    if not observe:
        sys.exit(f"plot_autoscale: {args.events} has no observation")
    t = [e["t"] for e in observe]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_n, ax_w, ax_r) = plt.subplots(3, 1, figsize=(12, 9), sharex=True)

    # Teachers: those it runs change at its events too (start/stop/exited), not only at observations.
    tr = [(e["t"], e["running"]) for e in events if "running" in e]
    ax_n.step([x for x, _ in tr], [y for _, y in tr], where="post", color="C0", label="teachers running")
    ax_n.step(t, [e.get("teachers", 0) for e in observe], where="post", color="C1", linestyle="--",
              label="teachers registered")
    marks = [("start", "^", "green", "start"), ("stop", "v", "red", "stop")]
    for name, marker, color, label in marks:
        pts = [(e["t"], e["running"]) for e in events if e.get("event") == name]
        if pts:
            ax_n.scatter([x for x, _ in pts], [y for _, y in pts], marker=marker, color=color, zorder=3, label=label)
    died = [(e["t"], e["running"]) for e in events
            if e.get("event") == "exited" and str(e.get("reason", "")).startswith("died")]
    if died:
        ax_n.scatter([x for x, _ in died], [y for _, y in died], marker="x", color="black", s=60, zorder=3,
                     label="died")
    top = max([y for _, y in tr] + [e.get("teachers", 0) for e in observe] + [1])
    ax_n.set_ylim(-0.2, top + 0.8)
    ax_n.yaxis.get_major_locator().set_params(integer=True)
    ax_n.set_ylabel("teachers")
    ax_n.legend(loc="upper left", fontsize=8)
    ax_n.grid(alpha=0.3)

    ax_w.plot(t, [e.get("wait_fraction", 0) for e in observe], color="C0", label="students' wait / step time")
    if any(e.get("missing_fraction", 0) > 0 for e in observe):
        ax_w.plot(t, [e.get("missing_fraction", 0) for e in observe], color="C3", alpha=0.7,
                  label="students' missing logits")
    if args.students:
        sw = student_waits(args.students, args.students_offset)
        if sw:
            ax_w.plot([x for x, _ in sw], [y for _, y in sw], color="C2", alpha=0.4, linewidth=0.8,
                      label="one student, per step")
    ax_w.axhline(args.target, color="red", linestyle="--", label=f"target {args.target:g}")
    ax_w.axhline(args.target / 4, color="red", linestyle=":", alpha=0.6, label="target / 4 (stop below)")
    ax_w.set_ylabel("wait fraction")
    ax_w.set_ylim(bottom=0)
    ax_w.legend(loc="upper right", fontsize=8)
    ax_w.grid(alpha=0.3)

    ax_r.plot(t, [e.get("demand", 0) for e in observe], color="C0", label="students' demand")
    ax_r.plot(t, [e.get("capacity", 0) for e in observe], color="C1", label="teachers' capacity (measured)")
    ax_r.set_ylabel("samples/s")
    ax_r.set_xlabel("seconds since the autoscaler started")
    ax_r.set_ylim(bottom=0)
    ax_r.legend(loc="upper left", fontsize=8)
    ax_r.grid(alpha=0.3)

    starts = sum(1 for e in events if e.get("event") == "start")
    stops = sum(1 for e in events if e.get("event") == "stop")
    fig.suptitle(f"teachers' autoscaler: {starts} starts, {stops} stops, {len(died)} died, "
                 f"{observe[-1]['t'] - observe[0]['t']:.0f} s observed")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_autoscale: wrote {args.out}")


if __name__ == "__main__":
    main()
