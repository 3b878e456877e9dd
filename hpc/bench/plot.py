#!/usr/bin/python3
"""Plots for docs/benchmarks.md from the JSON that the benchmarks write.

usage: plot.py OUT_DIR [allreduce-2.json allreduce-4.json ...] [--train-step train_step_summary.json]
                [--checkpoint checkpoint_summary.json] [--torch torch_bench.json]
                [--shard-torch shard_torch_bench.json [--shard-torch-png NAME.png]]
Writes OUT_DIR/allreduce_busbw.png (bus bandwidth vs message size, Sinew bucketed vs MPI_Allreduce, one
line pair per rank count), OUT_DIR/train_step.png (step time, Sinew vs PyTorch DDP) and
OUT_DIR/checkpoint_vs_dd.png (checkpoint write and restore throughput as a multiple of dd's, local disk
and GlusterFS; hpc/bench/checkpoint_bench.sh) and OUT_DIR/torch_vs_ddp.png (PyTorch models, Sinew against
DDP: step time, peak memory, communication hidden behind backward; hpc/bench/torch_bench.py) and
OUT_DIR/shard_torch.png (sharded state on a transformer: peak RSS and training memory per rank as multiples of DDP's, step
time as a multiple of FSDP2's; hpc/bench/shard_torch_bench.py).
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("allreduce", nargs="*")
    p.add_argument("--train-step")
    p.add_argument("--checkpoint")
    p.add_argument("--torch")
    p.add_argument("--shard-torch")
    p.add_argument("--shard-torch-png", default="shard_torch.png", help="the file name of --shard-torch's plot")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.allreduce:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for path in a.allreduce:
            rows = json.load(open(path))
            n = rows[0]["ranks"]
            x = [r["bytes"] for r in rows]
            ax.plot(x, [r["sinew_busbw_gbs"] for r in rows], "o-", label=f"Sinew bucketed, {n} ranks")
            ax.plot(x, [r["mpi_busbw_gbs"] for r in rows], "s--", label=f"MPI_Allreduce, {n} ranks")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title("Allreduce bus bandwidth, shared memory, Open MPI 5.0.7")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "allreduce_busbw.png"), dpi=110)
    if a.train_step:
        s = json.load(open(a.train_step))
        fig, ax = plt.subplots(figsize=(5, 3.2))
        bars = ax.bar(["Sinew", "PyTorch DDP (gloo)"], [s["sinew_step_ms"], s["torch_step_ms"]],
                      color=["tab:blue", "tab:orange"])
        ax.bar_label(bars, fmt="%.2f ms")
        ax.set_ylabel("median step time (ms)")
        ax.set_title(f"MLP 784-512-512-10, batch 64/rank, {s.get('ranks', 2)} ranks")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "train_step.png"), dpi=110)
    if a.checkpoint:
        s = json.load(open(a.checkpoint))
        kinds = [("ratio", "write"), ("restore_warm_ratio", "restore, warm cache"),
                 ("restore_cold_ratio", "restore, cold cache")]
        systems = [k for k in ("local", "glusterfs") if k in s]
        fig, ax = plt.subplots(figsize=(7, 3.6))
        width = 0.8 / len(systems)
        for i, name in enumerate(systems):
            vals = [s[name][k] if s[name][k] is not None else 0 for k, _ in kinds]
            bars = ax.bar([j + i * width for j in range(len(kinds))], vals, width,
                          label={"local": "local disk", "glusterfs": "GlusterFS (4 bricks)"}[name])
            ax.bar_label(bars, fmt="%.2fx")
        ax.axhline(0.8, color="grey", linestyle="--", linewidth=1, label="goal: 0.8x dd")
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(kinds))], [t for _, t in kinds])
        ax.set_ylabel("Sinew / dd (throughput)")
        ax.set_title("4-rank checkpoint of 512 MiB against dd on the same filesystem (medians)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "checkpoint_vs_dd.png"), dpi=110)
    if a.torch:
        s = json.load(open(a.torch))
        rows = s["rows"]
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
        x = range(len(rows))
        for ax, (key_d, key_s, unit, title) in zip(axes, [
                ("ddp_step_ms", "sinew_step_ms", "ms", "median step time"),
                ("ddp_rss_mb", "sinew_rss_mb", "MB", "peak resident memory per rank")]):
            bd = ax.bar([i - 0.2 for i in x], [r[key_d] for r in rows], 0.4, label="PyTorch DDP (gloo)",
                        color="tab:orange")
            bs = ax.bar([i + 0.2 for i in x], [r[key_s] for r in rows], 0.4, label="Sinew (ring)", color="tab:blue")
            ax.bar_label(bd, fmt="%.0f", fontsize=8)
            ax.bar_label(bs, fmt="%.0f", fontsize=8)
            ax.set_xticks(list(x), [f"{r['model']}\nSinew {r['ratio']:.2f}x DDP, {100 * r['hidden']:.0f}% hidden"
                                    if key_s == "sinew_step_ms" else r["model"] for r in rows], fontsize=8)
            ax.set_ylabel(unit)
            ax.set_title(title, fontsize=10)
            ax.margins(y=0.25)
        axes[0].legend(fontsize=8, loc="upper left")
        fig.suptitle(f"{rows[0]['ranks']} ranks on {s.get('cores', '?')} cores, one torch thread each", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "torch_vs_ddp.png"), dpi=110)
    if a.shard_torch:
        s = json.load(open(a.shard_torch))
        rows = {k: v for k, v in s["rows"].items() if "error" not in v}
        ddp, fsdp = rows["ddp"], rows["fsdp2"]
        names = list(rows)
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
        for ax, (values, ref, title, target) in zip(axes, [
                ([rows[n]["rss_mb"] / ddp["rss_mb"] for n in names], "DDP", "peak RSS per rank", (0.55, 0.35)),
                ([rows[n]["state_mb"] / ddp["state_mb"] for n in names], "DDP",
                 "training memory per rank (peak less the libraries')", (0.55, 0.35)),
                ([rows[n]["step_ms"] / fsdp["step_ms"] for n in names], "FSDP2", "median step time", (1.1,))]):
            colors = ["tab:orange" if not n.startswith("sinew") else
                      "tab:green" if n.startswith("sinew-p") else "tab:blue" for n in names]
            bars = ax.bar(range(len(names)), values, color=colors)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
            for t in target:
                ax.axhline(t, color="gray", linestyle=":", linewidth=1)
            ax.set_xticks(range(len(names)), names, rotation=35, fontsize=8)
            ax.set_ylabel(f"x {ref}")
            ax.set_title(title, fontsize=10)
            ax.margins(y=0.2)
        fig.suptitle(f"transformer {s['layers']}x{s['width']}, {s['params'] / 1e6:.0f} M parameters, AdamW, "
                     f"{s['ranks']} ranks on the CPU (dotted: issue 51's targets)", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, a.shard_torch_png), dpi=110)


if __name__ == "__main__":
    main()
