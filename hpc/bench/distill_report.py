#!/usr/bin/env python3
"""Summarises a distill_bench.sh run: throughput and accuracy per way, distilled vs plain per seed.

Usage: distill_report.py RESULTS_DIR OUT.json [--teacher-accuracy A] [--plot PNG] [...]
Reads RESULTS_DIR/<way>.<seed>.jsonl (sinew-train metrics) and RESULTS_DIR/autoscale.events.jsonl.
"""
import argparse
import glob
import json
import os
import statistics
import sys

WAYS = ["none", "inproc", "service1", "service2", "autoscale", "table"]
LABELS = {
    "none": "no teacher",
    "inproc": "teacher in the student's process",
    "service1": "service, 1 teacher",
    "service2": "service, 2 teachers",
    "autoscale": "service, autoscaled",
    "table": "precomputed table",
}


def done_event(path):
    done = [json.loads(l) for l in open(path) if '"event":"done"' in l]
    if not done:
        sys.exit(f"{path}: no done event (the run did not finish)")
    return done[-1]


def plot(summary, path, teacher_accuracy):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ways = [w for w in WAYS if w in summary]
    labels = [LABELS[w].replace(", ", ",\n").replace(" in the ", "\nin the ") for w in ways]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    sps = [summary[w]["samples_per_s"] / 1e3 for w in ways]
    ax1.bar(range(len(ways)), sps, color=["#888888"] + ["#3b75af"] * (len(ways) - 1))
    ax1.set_xticks(range(len(ways)), labels, fontsize=7)
    ax1.set_ylabel("student throughput (1000 samples/s)")
    for i, v in enumerate(sps):
        ax1.text(i, v, f"{v:.1f}k", ha="center", va="bottom", fontsize=7)
    acc = [100 * summary[w]["test_accuracy"] for w in ways]
    sd = [100 * summary[w]["test_accuracy_sd"] for w in ways]
    ax2.bar(range(len(ways)), acc, yerr=sd, capsize=3, color=["#888888"] + ["#4c9a5a"] * (len(ways) - 1))
    ax2.set_xticks(range(len(ways)), labels, fontsize=7)
    ax2.set_ylabel("student test accuracy (%), mean of seeds")
    lo = min(acc) - 1.0
    hi = max(max(acc), 100 * (teacher_accuracy or 0)) + 0.5
    ax2.set_ylim(lo, hi)
    if teacher_accuracy:
        ax2.axhline(100 * teacher_accuracy, color="k", ls="--", lw=0.8)
        ax2.text(len(ways) - 0.5, 100 * teacher_accuracy, "teacher", ha="right", va="bottom", fontsize=7)
    fig.suptitle("Distillation on Fashion-MNIST: student and teachers on separate cores (taskset)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--teacher-accuracy", type=float, default=None)
    ap.add_argument("--student-cores", default="")
    ap.add_argument("--teacher-cores", default="")
    ap.add_argument("--student-model", default="")
    ap.add_argument("--student-epochs", type=int, default=0)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()

    runs = {}
    for way in WAYS:
        for path in sorted(glob.glob(os.path.join(a.results, f"{way}.*.jsonl"))):
            tag = path.rsplit(".", 2)[-2]
            if not tag.isdigit():
                continue  # autoscale.events.jsonl
            seed = int(tag)
            d = done_event(path)
            runs.setdefault(way, {})[seed] = {
                "samples_per_s": d["samples_per_s"],
                "test_accuracy": d["test_accuracy"],
                "train_s": d["train_s"],
                "wait_ms_per_step": d.get("distill_wait_ms_per_step", 0.0),
                "missing": d.get("distill_missing", 0),
                "failed_requests": d.get("distill_failed_requests", 0),
            }
    if "none" not in runs:
        sys.exit("no baseline runs (none.*.jsonl)")

    summary = {}
    base = runs["none"]
    print(f"student {a.student_model}, {a.student_epochs} epochs, on cores {a.student_cores}; "
          f"teachers on cores {a.teacher_cores}; teacher test accuracy "
          f"{100 * a.teacher_accuracy:.2f}%" if a.teacher_accuracy is not None else "")
    print(f"{'way':34s} {'samples/s':>10s} {'vs none':>8s} {'accuracy %':>11s} {'+- sd':>6s} "
          f"{'wait ms/step':>12s} {'missing':>8s} {'beats none':>10s}")
    base_sps = statistics.mean(r["samples_per_s"] for r in base.values())
    for way in WAYS:
        if way not in runs:
            continue
        rs = runs[way]
        sps = statistics.mean(r["samples_per_s"] for r in rs.values())
        accs = [r["test_accuracy"] for r in rs.values()]
        acc = statistics.mean(accs)
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        wait = statistics.mean(r["wait_ms_per_step"] for r in rs.values())
        missing = sum(r["missing"] for r in rs.values())
        wins = [s for s in rs if s in base and rs[s]["test_accuracy"] > base[s]["test_accuracy"]]
        deltas = {s: rs[s]["test_accuracy"] - base[s]["test_accuracy"] for s in rs if s in base}
        summary[way] = {
            "label": LABELS[way],
            "samples_per_s": sps,
            "throughput_vs_none": sps / base_sps,
            "test_accuracy": acc,
            "test_accuracy_sd": sd,
            "wait_ms_per_step": wait,
            "missing": missing,
            "accuracy_minus_none_per_seed": deltas,
            "seeds_beating_none": len(wins) if way != "none" else None,
            "runs": rs,
        }
        beats = "-" if way == "none" else f"{len(wins)}/{len(rs)}"
        print(f"{LABELS[way]:34s} {sps:10.0f} {sps / base_sps:7.2f}x {100 * acc:11.2f} {100 * sd:6.2f} "
              f"{wait:12.2f} {missing:8d} {beats:>10s}")

    events_path = os.path.join(a.results, "autoscale.events.jsonl")
    decisions = []
    if os.path.exists(events_path):
        for line in open(events_path):
            e = json.loads(line)
            if e.get("event") in ("start", "stop", "exited"):
                decisions.append(e)
        print("autoscaler decisions:")
        for e in decisions:
            print(f"  t={e.get('t', 0):6.1f}s {e['event']:6s} teachers running {e.get('running')} "
                  f"wait {100 * e.get('wait_fraction', 0):.1f}% ({e.get('reason', '')})")

    result = {
        "student_model": a.student_model,
        "student_epochs": a.student_epochs,
        "student_cores": a.student_cores,
        "teacher_cores": a.teacher_cores,
        "teacher_accuracy": a.teacher_accuracy,
        "ways": summary,
        "autoscale_decisions": decisions,
    }
    if a.plot:
        plot(summary, a.plot, a.teacher_accuracy)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
