#!/usr/bin/python3
"""Bar charts of torch_algorithms_bench.py's results, one PNG per model (as Bagua's figure): samples/s of every
configuration at every link rate, the compute-only limit as a line per rate.

Usage: plot_torch_algorithms.py [RESULTS.json] [OUT_DIR]
       (defaults: hpc/bench/results/torch_algorithms.json, docs/img; writes torch_algorithms_<model>.png)
       plot_torch_algorithms.py --markdown [RESULTS.json]   the tables of docs/benchmarks.md
       plot_torch_algorithms.py --accuracy [ACCURACY.json] [OUT_DIR]
           torch_accuracy_bench.py's results (default hpc/bench/results/torch_accuracy.json): its table in
           markdown, and torch_accuracy.png (test accuracy of every run, its reference's as a line)
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RATE_ORDER = ["unlimited", "10gbit", "1gbit", "100mbit", "10mbit"]


def markdown(data):
    """Per model: samples/s of each configuration at each rate, and its ratio to plain DDP's."""
    rows = data["rows"]
    rates = sorted({r["rate"] for r in rows}, key=lambda r: RATE_ORDER.index(r) if r in RATE_ORDER else 99)
    failed = {(f["model"], f["rate"], f["name"]) for f in data.get("failures", [])}
    for model in dict.fromkeys(r["model"] for r in rows):
        at = {(r["rate"], r["name"]): r for r in rows if r["model"] == model}
        names = list(dict.fromkeys([r["name"] for r in rows if r["model"] == model] +
                                   [f[2] for f in sorted(failed) if f[0] == model]))
        print(f"\n**{model}** (batch {rows[[r['model'] for r in rows].index(model)]['batch_per_rank']} per rank): "
              "samples/s, and × plain DDP's\n")
        print("| configuration | " + " | ".join(rates) + " |")
        print("|---|" + "---:|" * len(rates))
        for n in names:
            cells = []
            for rate in rates:
                r, ddp = at.get((rate, n)), at.get((rate, "ddp"))
                if r is None:
                    cells.append("failed" if (model, rate, n) in failed else "")
                    continue
                x = f" ({r['samples_per_s'] / ddp['samples_per_s']:.2f}×)" if ddp and n != "ddp" else ""
                chosen = f" [{r['chosen']}]" if "chosen" in r else ""
                cells.append(f"{r['samples_per_s']:.1f}{x}{chosen}")
            label = f"**{n}**" if at.get((rates[0], n), {}).get("impl") == "sinew" else n
            print(f"| {label} | " + " | ".join(cells) + " |")


def accuracy(data, out):
    """The accuracy table (markdown) and bar chart: every run against DDP's (QAdam against DDP with Adam)."""
    rows = data["rows"]
    at = {r["name"]: r for r in rows}
    order = [r["name"] for r in rows if r["impl"] == "torch"] + [r["name"] for r in rows if r["impl"] == "sinew"]

    def reference(name):
        return at.get("ddp-adam" if name.split("@")[0] == "qadam" else "ddp")

    print(f"| run | test accuracy after {data['epochs']} epoch(s) | − reference's | reference |")
    print("|---|---:|---:|---|")
    for n in order:
        r, ref = at[n], reference(n)
        diff = f"{100 * (r['test_accuracy'] - ref['test_accuracy']):+.2f}" if ref and ref is not r else ""
        label = f"**{n}**" if r["impl"] == "sinew" else n
        print(f"| {label} | {100 * r['test_accuracy']:.2f} % | {diff} | {ref['name'] if ref and diff else ''} |")
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ys = [100 * at[n]["test_accuracy"] for n in order]
    bars = ax.barh(range(len(order)), ys, color=["#999999" if at[n]["impl"] == "torch" else "#1f77b4"
                                                 for n in order])
    for b, y in zip(bars, ys):
        ax.text(y + 0.05, b.get_y() + b.get_height() / 2, f"{y:.2f}", va="center", fontsize=8)
    if "ddp" in at:
        ax.axvline(100 * at["ddp"]["test_accuracy"], color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(order, fontsize=8)
    ax.invert_yaxis()
    lo = min(ys)
    ax.set_xlim(max(0, lo - 3), min(100, max(ys) + 1.5))
    ax.set_xlabel("test accuracy, %")
    ax.set_title(f"ResNet-18 on Fashion-MNIST, {data['epochs']} epoch(s), 4 ranks: Sinew (blue) and DDP (grey); "
                 "dashed: DDP", fontsize=9)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "torch_accuracy.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path, file=sys.stderr)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--accuracy":
        src = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "hpc", "bench", "results",
                                                                 "torch_accuracy.json")
        accuracy(json.load(open(src)), sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, "docs", "img"))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--markdown":
        src = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "hpc", "bench", "results",
                                                                 "torch_algorithms.json")
        markdown(json.load(open(src)))
        return 0
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "hpc", "bench", "results", "torch_algorithms.json")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "docs", "img")
    data = json.load(open(src))
    rows = data["rows"]
    rates = sorted({r["rate"] for r in rows}, key=lambda r: RATE_ORDER.index(r) if r in RATE_ORDER else 99)
    os.makedirs(out, exist_ok=True)
    for model in dict.fromkeys(r["model"] for r in rows):
        names = [n for n in dict.fromkeys(r["name"] for r in rows if r["model"] == model) if n != "compute-only"]
        at = {(r["rate"], r["name"]): r for r in rows if r["model"] == model}
        fig, ax = plt.subplots(figsize=(12, 4.8))
        width = 0.8 / max(len(rates), 1)
        for i, rate in enumerate(rates):
            xs = [k + (i - (len(rates) - 1) / 2) * width for k in range(len(names))]
            ys = [at[(rate, n)]["samples_per_s"] if (rate, n) in at else 0 for n in names]
            bars = ax.bar(xs, ys, width, label=rate)
            comp = at.get((rate, "compute-only"))
            if comp:
                ax.axhline(comp["samples_per_s"], color=bars.patches[0].get_facecolor(), linestyle="--",
                           linewidth=0.8)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        for label in ax.get_xticklabels():
            if not label.get_text().startswith("ddp"):
                label.set_fontweight("bold")
        ax.set_ylabel("samples/s (4 ranks)")
        ax.set_title(f"{model}: Sinew's algorithms (bold) and PyTorch DDP with its hooks, by link rate "
                     f"(dashed: compute-only limit)", fontsize=10)
        ax.legend(title="link rate", fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, f"torch_algorithms_{model}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
