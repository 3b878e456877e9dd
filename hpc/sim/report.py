#!/usr/bin/python3
"""Tables and plots of the scale model (sim.py report): reads the sweep's and the validation's JSON and
writes docs/img/scale_*.png and a Markdown file of tables (hpc/sim/results/tables.md), which
docs/scale.md quotes.

Crossovers are read off the simulated points: "from N" is the smallest simulated rank count at which a
relation holds and keeps holding at every larger one; between two simulated counts the plots show the
lines, the tables do not interpolate.
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, NullFormatter  # noqa: E402

PLATFORM_LABELS = {"hdr200": "HDR 200 Gb/s", "edr100": "EDR 100 Gb/s", "eth10": "Ethernet 10 Gb/s"}
MODE_LABELS = {"in-place": "in place (ULFM, N-1 left)", "spare": "hot spare", "spawn": "spawn (ULFM + spawn)",
               "restart": "restart (relaunch)"}
EXACT = ["ring", "tree"]
# The phases of a recovery in the order they happen (sinew-sim's JSON has them sorted by name).
PHASES = ["detect", "revoke", "shrink", "agree", "rebuild", "state sync", "spawn", "relaunch", "data load",
          "checkpoint load", "other", "first step", "replay"]
RELAXED = ["bytegrad", "decentralized", "low-precision-decentralized"]


def load(path):
    with open(path) as f:
        return json.load(f)


def by_key(rows, *keys):
    return {tuple(r[k] for k in keys): r for r in rows}


def workloads(steps):
    """The workloads of the sweep, the calibrated one first."""
    seen = []
    for r in steps:
        if r["workload"] not in seen:
            seen.append(r["workload"])
    return sorted(seen, key=lambda w: w == "custom")


def workload_label(steps, w):
    r = next(s for s in steps if s["workload"] == w)
    name = "Fashion-MNIST MLP" if w != "custom" else "ResNet-50-sized"
    return f"{name} ({r['params'] / 1e6:.2g} M parameters, {r['compute_step_ms']:.3g} ms compute)"


def from_n(ranks, holds):
    """The smallest rank count from which `holds(n)` is true at every simulated count, or None."""
    first = None
    for n in ranks:
        if holds(n):
            first = n if first is None else first
        else:
            first = None
    return first


def fmt_ms(ms):
    if ms >= 10_000:
        return f"{ms / 1e3:.1f} s"
    if ms >= 1000:
        return f"{ms / 1e3:.2f} s"
    return f"{ms:.3g} ms"


HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH_SOURCE = "FLUX_625"  # Open MPI under srun, 128 to 4096 tasks: the one published launch curve


def published_launch():
    """MPI_Init time (ms) against ranks from the published launch curve: a least-squares line a + b N
    through its points (they grow linearly: 4.3 s at 128 tasks, 17.5 s at 4096), and its points."""
    pts = [(p["ranks"], p["value_ms"]) for p in load(os.path.join(HERE, "published.json"))["points"]
           if p["what"] == "launch_mpi_init" and p["source"] == LAUNCH_SOURCE]
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return (lambda ranks: my + b * (ranks - mx)), pts


def restart_as_published(r, launch):
    """A restart whose relaunch takes the published launch's time (when that is longer)."""
    return r["total_ms"] - r["parts_ms"]["relaunch"] + max(r["parts_ms"]["relaunch"], launch(r["ranks"]))


def recovery_tables(rec):
    out = []
    launch, pts = published_launch()
    platforms = list(dict.fromkeys(r["platform"] for r in rec))
    index = by_key(rec, "platform", "failure", "mode", "ranks")
    for failure in ["process", "node"]:
        for p in platforms:
            ranks = sorted({r["ranks"] for r in rec if r["platform"] == p and r["failure"] == failure})
            if not ranks:
                continue
            what = "a rank's process killed" if failure == "process" else "a node lost (heartbeat detection)"
            out.append(f"\n### Recovery on {PLATFORM_LABELS.get(p, p)}: {what}\n")
            out.append("| ranks | in place | spare | spawn | restart | restart / spare | restart / spawn "
                       f"| restart, {LAUNCH_SOURCE}'s launch | that / spare |")
            out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for n in ranks:
                t = {m: index[(p, failure, m, n)]["total_ms"] for m in MODE_LABELS if (p, failure, m, n) in index}
                cells = [fmt_ms(t[m]) if m in t else "–" for m in MODE_LABELS]
                ratio = [f"{t['restart'] / t[m]:.1f}×" if "restart" in t and m in t else "–" for m in ("spare", "spawn")]
                alt = restart_as_published(index[(p, failure, "restart", n)], launch)
                out.append(f"| {n} | " + " | ".join(cells + ratio) + f" | {fmt_ms(alt)} | {alt / t['spare']:.1f}× |")
            worth = {m: from_n(ranks, lambda n, m=m: index[(p, failure, m, n)]["total_ms"]
                               >= index[(p, failure, "restart", n)]["total_ms"])
                     for m in ("in-place", "spare", "spawn")}
            out.append("")
            for m, n in worth.items():
                out.append(f"- {MODE_LABELS[m]} vs restart: " +
                           (f"restart is as fast from {n} ranks on" if n else
                            f"faster than restart at every simulated size ({ranks[0]}–{ranks[-1]})"))
    out.append(f"\nThe column \"restart, {LAUNCH_SOURCE}'s launch\" replaces the simulated relaunch by the published "
               f"MPI_Init time of Open MPI under srun when that is longer: a line through {len(pts)} points "
               f"({pts[0][0]} to {pts[-1][0]} tasks; outside that range it is extrapolated).")
    return out


def parts_table(rec, platform, ranks):
    out = [f"\n### Where the time goes, {PLATFORM_LABELS.get(platform, platform)}, a process killed\n"]
    index = by_key(rec, "platform", "failure", "mode", "ranks")
    for m in MODE_LABELS:
        rows = [index[(platform, "process", m, n)] for n in ranks if (platform, "process", m, n) in index]
        if not rows:
            continue
        parts = sorted(rows[0]["parts_ms"], key=PHASES.index)
        out.append(f"\n{MODE_LABELS[m]}:\n")
        out.append("| part | " + " | ".join(f"{r['ranks']} ranks" for r in rows) + " |")
        out.append("|---|" + "---:|" * len(rows))
        for part in parts:
            out.append(f"| {part} | " + " | ".join(fmt_ms(r["parts_ms"][part]) for r in rows) + " |")
        out.append("| **total** | " + " | ".join(f"**{fmt_ms(r['total_ms'])}**" for r in rows) + " |")
    return out


def step_tables(steps):
    out = []
    index = by_key(steps, "platform", "workload", "algorithm", "ranks")
    platforms = list(dict.fromkeys(r["platform"] for r in steps))
    for w in workloads(steps):
        for p in platforms:
            rows = [r for r in steps if r["platform"] == p and r["workload"] == w]
            ranks = sorted({r["ranks"] for r in rows})
            algs = [a for a in EXACT + RELAXED if any(r["algorithm"] == a for r in rows)]
            out.append(f"\n### Step time, {workload_label(steps, w)}, {PLATFORM_LABELS.get(p, p)}\n")
            out.append("| ranks | " + " | ".join(algs) + " | fastest | bytes/rank, exact | bytes/rank, ByteGrad |")
            out.append("|---:|" + "---:|" * len(algs) + "---|---:|---:|")
            for n in ranks:
                t = {a: index[(p, w, a, n)]["step_ms"] for a in algs if (p, w, a, n) in index}
                best = min(t, key=t.get)
                sent = [f"{index[(p, w, a, n)]['bytes_per_rank'] / 1e6:.3g} MB" if (p, w, a, n) in index else "–"
                        for a in ("ring", "bytegrad")]
                out.append(f"| {n} | " + " | ".join(fmt_ms(t[a]) if a in t else "–" for a in algs) +
                           f" | {best} | " + " | ".join(sent) + " |")
            exact = {n: min(index[(p, w, a, n)]["step_ms"] for a in EXACT if (p, w, a, n) in index) for n in ranks}
            out.append("")
            for a in RELAXED:
                have = [n for n in ranks if (p, w, a, n) in index]
                if not have:
                    continue
                n = from_n(have, lambda n, a=a: index[(p, w, a, n)]["step_ms"] < exact[n])
                gain = (f" ({exact[have[-1]] / index[(p, w, a, have[-1])]['step_ms']:.2f}× the exact allreduce "
                        f"at {have[-1]})")
                out.append(f"- {a} vs the faster exact allreduce: " +
                           (f"faster from {n} ranks on{gain}" if n else f"not faster at {have[-1]} ranks{gain}"))
            n = from_n(ranks, lambda n: index[(p, w, "tree", n)]["step_ms"] < index[(p, w, "ring", n)]["step_ms"])
            out.append(f"- tree vs ring: " + (f"tree faster from {n} ranks on" if n else "ring at least as fast "
                                               "at the largest size"))
    return out


def validation_table(val):
    out = ["\n### The model next to published figures\n",
           "| what | source | ranks | size | published | model | model / published |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for p in val["points"]:
        size = f"{p['bytes'] / 2**20:.4g} MiB" if p.get("bytes") else "–"
        out.append(f"| {p['what']} | {p['source']} | {p['ranks']} | {size} | {fmt_ms(p['value_ms'])} | "
                   f"{fmt_ms(p['model_ms'])} | {p['model_ms'] / p['value_ms']:.2f} |")
    out.append("\nSources:\n")
    used = list(dict.fromkeys(p["source"] for p in val["points"]))
    for s in used:
        src = val["sources"][s]
        out.append(f"- **{s}**: {src['cite']}. {src['url']}. System: {src.get('system', 'not stated')}.")
    return out


def log_axes(ax, ranks):
    """Log-log axes with the simulated rank counts as ticks and plain numbers on both."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks, [str(n) for n in ranks], fontsize=6, rotation=45)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="y", which="both", labelsize=6)
    ax.grid(True, which="both", alpha=0.3)


def plot_recovery(rec, path):
    platforms = list(dict.fromkeys(r["platform"] for r in rec))
    fig, axes = plt.subplots(1, len(platforms), figsize=(4.2 * len(platforms), 4.2), sharey=True)
    axes = [axes] if len(platforms) == 1 else axes
    colours = {"in-place": "tab:green", "spare": "tab:blue", "spawn": "tab:orange", "restart": "tab:red"}
    for ax, p in zip(axes, platforms):
        for failure, style in [("process", "-"), ("node", "--")]:
            for m in MODE_LABELS:
                pts = sorted((r["ranks"], r["total_ms"] / 1e3) for r in rec
                             if r["platform"] == p and r["mode"] == m and r["failure"] == failure)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=colours[m],
                            label=MODE_LABELS[m] + ("" if failure == "process" else ", node lost"))
        log_axes(ax, sorted({r["ranks"] for r in rec}))
        ax.set_title(PLATFORM_LABELS.get(p, p), fontsize=10)
        ax.set_xlabel("ranks before the failure")
    axes[0].set_ylabel("s from the failure until training is back")
    axes[0].legend(fontsize=6, loc="upper left")
    fig.suptitle("Recovery from one failure, simulated (SimGrid), Fashion-MNIST MLP", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_steps(steps, path):
    platforms = list(dict.fromkeys(r["platform"] for r in steps))
    ws = workloads(steps)
    fig, axes = plt.subplots(len(ws), len(platforms), figsize=(4.2 * len(platforms), 3.3 * len(ws)), squeeze=False)
    colours = {"ring": "black", "tree": "grey", "bytegrad": "tab:blue", "decentralized": "tab:green",
               "low-precision-decentralized": "tab:olive"}
    for i, w in enumerate(ws):
        for j, p in enumerate(platforms):
            ax = axes[i][j]
            for a in EXACT + RELAXED:
                pts = sorted((r["ranks"], r["step_ms"]) for r in steps
                             if r["platform"] == p and r["workload"] == w and r["algorithm"] == a)
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, color=colours[a], label=a,
                            ls="--" if a in EXACT[1:] else "-")
            compute = next(r["compute_step_ms"] for r in steps if r["workload"] == w)
            ax.axhline(compute, color="red", lw=0.8, ls=":", label="computation alone")
            log_axes(ax, sorted({r["ranks"] for r in steps}))
            ax.set_title(f"{PLATFORM_LABELS.get(p, p)}", fontsize=9)
            if i == len(ws) - 1:
                ax.set_xlabel("ranks")
            if j == 0:
                ax.set_ylabel(f"step ms\n{workload_label(steps, w).split(' (')[0]}", fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.suptitle("One training step per algorithm, simulated (SimGrid)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_validation(val, path):
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    markers = "osD^v<>phX*"
    sources = list(dict.fromkeys(p["source"] for p in val["points"]))
    for k, s in enumerate(sources):
        pts = [(p["value_ms"], p["model_ms"]) for p in val["points"] if p["source"] == s]
        ax.scatter(*zip(*pts), marker=markers[k % len(markers)], label=s, s=22)
    lo = min(min(p["value_ms"], p["model_ms"]) for p in val["points"]) / 2
    hi = max(max(p["value_ms"], p["model_ms"]) for p in val["points"]) * 2
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    for f in (0.5, 2):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.5, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published (ms)")
    ax.set_ylabel("model on hdr200 (ms)")
    ax.set_title("Model vs published figures (dotted: factor 2)", fontsize=10)
    ax.legend(fontsize=6)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


SHARD_LABELS = {0: "unsharded (--shard none)", 1: "--shard optimizer, R = 1", 2: "--shard optimizer, R = 2"}


def fmt_mb(b):
    return f"{b / 1e6:.3g} MB" if b >= 1e5 else f"{b / 1e3:.3g} kB"


def shard_tables(sh):
    """sim.py shard: the step's bytes and time, and the recovery from a killed rank, per R."""
    steps, rec = sh["steps"], sh["recoveries"]
    ranks = sorted({r["ranks"] for r in rec})
    step = {(r["params"] > 1e7, r["ranks"], r["shard_replicas"]): r
            for r in steps}
    lines = ["", f"## Sharded optimiser state (sim.py shard: {sh['platform']}, Adam, Sinew's ring allreduce)", ""]
    for large, name in [(False, "Fashion-MNIST MLP (0.67 M parameters)"),
                        (True, "ResNet-50-sized (25.6 M parameters, 100 ms of computation)")]:
        lines += [f"Step, {name}: time (of it the parameters' gather) and bytes sent per rank and step", "",
                  "| ranks | unsharded | R = 1 | R = 2 | R = 2 vs R = 1 | R = 2 vs unsharded | bytes unsharded | "
                  "bytes sharded (R = 1, 2) |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in ranks:
            u, r1, r2 = (step.get((large, n, r)) for r in (0, 1, 2))
            if not (u and r1 and r2):
                continue
            lines.append(f"| {n} | {fmt_ms(u['step_ms'])} | {fmt_ms(r1['step_ms'])} ({fmt_ms(r1['gather_ms'])}) | "
                         f"{fmt_ms(r2['step_ms'])} ({fmt_ms(r2['gather_ms'])}) | "
                         f"{r2['step_ms'] - r1['step_ms']:+.3g} ms | {r2['step_ms'] / u['step_ms']:.2f}x | "
                         f"{fmt_mb(u['bytes_per_rank'])} | {fmt_mb(r2['bytes_per_rank'])} "
                         f"({r2['bytes_per_rank'] / u['bytes_per_rank']:.2f}x) |")
        lines.append("")
    recs = {(r["ranks"], r["shard_replicas"]): r for r in rec}
    lines += ["Recovery of the MLP from a killed rank (in place; at R = 1 the rank's shard is lost: the survivors "
              "exit 75 and sinew-run relaunches from the newest checkpoint), ms", "",
              "| ranks | unsharded | R = 2 | R = 2: state sync (plan) | unsharded: state sync | R = 2: first step | "
              "unsharded: first step | R = 2: state moved | R = 1 (relaunch) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in ranks:
        u, r1, r2 = (recs.get((n, r)) for r in (0, 1, 2))
        if not (u and r1 and r2):
            continue
        plan = sh["plan_ms"][str(n)]["2"]
        lines.append(f"| {n} | {fmt_ms(u['total_ms'])} | {fmt_ms(r2['total_ms'])} | "
                     f"{fmt_ms(r2['parts_ms']['state sync'])} ({fmt_ms(plan)}) | {fmt_ms(u['parts_ms']['state sync'])} | "
                     f"{fmt_ms(r2['parts_ms']['first step'])} | {fmt_ms(u['parts_ms']['first step'])} | "
                     f"{fmt_mb(r2.get('moved_state_bytes', 0))} | {fmt_ms(r1['total_ms'])} |")
    return lines


def plot_shard(sh, path):
    steps, rec = sh["steps"], sh["recoveries"]
    colours = {0: "tab:gray", 1: "tab:orange", 2: "tab:blue"}
    fig, axes = plt.subplots(1, 3, figsize=(12.6, 4.2))
    ranks = sorted({r["ranks"] for r in rec})
    for ax, large, title in [(axes[0], False, "step, MLP (0.67 M)"), (axes[1], True, "step, ResNet-50-sized (25.6 M)")]:
        for r in (0, 1, 2):
            pts = sorted((x["ranks"], x["step_ms"]) for x in steps
                         if x["shard_replicas"] == r and (x["params"] > 1e7) == large)
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, color=colours[r], label=SHARD_LABELS[r],
                        linestyle="--" if r == 1 else "-")
        log_axes(ax, ranks)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("ranks")
    axes[0].set_ylabel("ms per step (ring allreduce, Adam)")
    axes[0].legend(fontsize=6, loc="upper left")
    ax = axes[2]
    for r in (0, 1, 2):
        pts = sorted((x["ranks"], x["total_ms"]) for x in rec if x["shard_replicas"] == r)
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, color=colours[r],
                    label=SHARD_LABELS[r] + (": shard lost, relaunch" if r == 1 else ""))
    log_axes(ax, ranks)
    ax.set_title("recovery from a killed rank, MLP", fontsize=10)
    ax.set_xlabel("ranks before the failure")
    ax.set_ylabel("ms from the failure until training is back")
    ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Sharded optimiser state at scale, simulated (SimGrid), HDR 200 Gb/s", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(a):
    sweep = load(a.results)
    val = load(a.validation) if os.path.exists(a.validation) else None
    os.makedirs(a.img, exist_ok=True)
    rec, steps = sweep["recoveries"], sweep["steps"]
    plot_recovery(rec, os.path.join(a.img, "scale_recovery.png"))
    plot_steps(steps, os.path.join(a.img, "scale_step.png"))
    lines = ["# Scale model: tables (written by hpc/sim/sim.py report; docs/scale.md explains them)"]
    if sweep.get("note"):
        lines.append(f"\nThis sweep: {sweep['note']}")
    lines += recovery_tables(rec)
    ranks = sorted({r["ranks"] for r in rec if r["platform"] == "hdr200"})
    shown = [n for n in ranks if n in (ranks[0], 256, ranks[-1])] or ranks
    lines += parts_table(rec, "hdr200", shown)
    lines += step_tables(steps)
    if val:
        plot_validation(val, os.path.join(a.img, "scale_validation.png"))
        lines += validation_table(val)
    shard_path = getattr(a, "shard", None)
    if shard_path and os.path.exists(shard_path):
        sh = load(shard_path)
        plot_shard(sh, os.path.join(a.img, "scale_shard.png"))
        lines += shard_tables(sh)
    os.makedirs(os.path.dirname(os.path.abspath(a.tables)), exist_ok=True)
    with open(a.tables, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"sim.py report: {a.tables}, {a.img}/scale_*.png")
    return 0


if __name__ == "__main__":
    raise SystemExit("run it as: hpc/sim/sim.py report")
