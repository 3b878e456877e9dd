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


# (stage, R): what sim.py shard runs; stage None is the unsharded job.
SHARD_CONFIGS = [(None, 0), ("optimizer", 1), ("optimizer", 2), ("gradients", 1), ("gradients", 2),
                 ("parameters", 1), ("parameters", 2)]
ZERO = {"optimizer": "ZeRO-1", "gradients": "ZeRO-2", "parameters": "ZeRO-3"}
SHARD_COLOURS = {None: "tab:gray", "optimizer": "tab:blue", "gradients": "tab:green", "parameters": "tab:red"}


def shard_label(stage, r):
    return "unsharded (--shard none)" if stage is None else f"{ZERO[stage]} (--shard {stage}), R = {r}"


def shard_key(x):
    """A result's (stage, R): the unsharded job's stage is None (results before ZeRO-2/3 have no stage)."""
    r = x["shard_replicas"]
    return (x.get("shard_stage", "optimizer") if r > 0 else None), r


def fmt_mb(b):
    return f"{b / 1e6:.3g} MB"


def memory_per_param(stage, r, ranks, units):
    """Bytes per parameter a rank holds (float32 parameters and gradients, Adam's two buffers), as
    docs/sharding.md counts them: unsharded 4 + 4 + 8; ZeRO-1 and 2 (the gradient buffer stays whole) 8 +
    8 R/W; ZeRO-3 16 R/W, plus one unit whole while it runs (its parameters and gradients, 8/U)."""
    if stage is None:
        return 16.0, 16.0
    share = min(r, ranks) / ranks
    if stage == "parameters":
        return 16 * share, 16 * share + 8 / units
    return 8 + 8 * share, 8 + 8 * share


def shard_tables(sh):
    """sim.py shard: the step's time, bytes and memory, and the recovery from a killed rank, per stage and R."""
    rec = sh["recoveries"]
    steps = [x for x in sh["steps"] if x.get("shard_prefetch", 1) == 1]  # (Sinew's default; 0: the table below)
    ranks = sorted({r["ranks"] for r in rec})
    step = {(x["params"] > 1e7, x["ranks"], *shard_key(x)): x for x in steps}
    units = sh.get("units", {"small": 3, "large": 16})
    lines = ["", f"## Sharded training state (sim.py shard: {sh['platform']}, Adam; unsharded and ZeRO-1: Sinew's "
             "ring allreduce; ZeRO-2 and 3: MPI's reduce-scatter, libnbc's)", ""]
    cols = [c for c in SHARD_CONFIGS]
    head = " | ".join("unsharded" if st is None else f"{ZERO[st]} R = {r}" for st, r in cols)
    for large, name in [(False, f"Fashion-MNIST MLP (0.67 M parameters; ZeRO-3: {units['small']} units)"),
                        (True, f"ResNet-50-sized (25.6 M parameters, 100 ms of computation; ZeRO-3: "
                               f"{units['large']} units)")]:
        lines += [f"Step, {name}: time per step (ZeRO-1, 2: of it the gather after the update; ZeRO-3: the "
                  "waits for the units' gathers)", "", f"| ranks | {head} |", "|---:|" + "---:|" * len(cols)]
        def rows(cell):  # one line per rank count; cell(x, stage, replicas) for each column's record
            for n in ranks:
                xs = [(step.get((large, n, st, r)), st, r) for st, r in cols]
                lines.append(f"| {n} | " + " | ".join("" if x is None else cell(x, n, st, r) for x, st, r in xs)
                             + " |")

        def step_cell(x, n, st, r):
            return fmt_ms(x["step_ms"]) if st is None else f"{fmt_ms(x['step_ms'])} ({fmt_ms(x['gather_ms'])})"

        def bytes_cell(x, n, st, r):
            cell = fmt_mb(x["bytes_per_rank"])
            one = step.get((large, n, st, 1))
            if r == 2 and one:
                cell += f" ({x['bytes_per_rank'] - one['bytes_per_rank']:+.3g} B, " \
                        f"{x['step_ms'] - one['step_ms']:+.3g} ms)"
            return cell

        rows(step_cell)
        lines += ["", f"Bytes sent per rank and step (as Sinew's metrics count them), {name}; R = 2 against R = 1",
                  "", f"| ranks | {head} |", "|---:|" + "---:|" * len(cols)]
        rows(bytes_cell)
        lines.append("")
    unhidden = {x["ranks"]: x for x in sh["steps"] if x.get("shard_prefetch", 1) == 0}
    if unhidden:
        lines += ["ZeRO-3 R = 2, ResNet-50-sized: the step with the next unit's gather prefetched (Sinew's default, "
                  "--shard-prefetch 1) and without (0); in brackets the waits for the units' gathers", "",
                  "| ranks | prefetch 1 | prefetch 0 | prefetch 1 / 0 |", "|---:|---:|---:|---:|"]
        for n in ranks:
            one, none = step.get((True, n, "parameters", 2)), unhidden.get(n)
            if one and none:
                lines.append(f"| {n} | {fmt_ms(one['step_ms'])} ({fmt_ms(one['gather_ms'])}) | "
                             f"{fmt_ms(none['step_ms'])} ({fmt_ms(none['gather_ms'])}) | "
                             f"{one['step_ms'] / none['step_ms']:.2f} |")
        lines.append("")
    lines += ["Memory per rank, bytes per parameter (parameters, gradients, Adam's state; ZeRO-3: steady, and with "
              "one unit of the MLP / the ResNet-50-sized model whole)", "", f"| ranks | {head} |",
              "|---:|" + "---:|" * len(cols)]
    for n in ranks:
        row = []
        for st, r in cols:
            steady, peak = memory_per_param(st, r, n, units["small"])
            _, peak_large = memory_per_param(st, r, n, units["large"])
            row.append(f"{steady:.5g}" if st != "parameters" else f"{steady:.3g} ({peak:.3g} / {peak_large:.3g})")
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    recs = {(x["ranks"], *shard_key(x)): x for x in rec}
    lines += ["", "Recovery of the MLP from a killed rank (in place, R = 2; at R = 1 the rank's shard is lost: the "
              "survivors exit 75 and sinew-run relaunches from the newest checkpoint, shown for ZeRO-1), ms; state "
              "sync with of it Sinew's plan_reshard; bytes the reshard moves: state (ZeRO-3: and parameters) point "
              "to point, and ZeRO-1/2's broadcast of every old shard's parameters (received by every member)", "",
              "| ranks | unsharded | ZeRO-1 R = 2 | ZeRO-2 R = 2 | ZeRO-3 R = 2 | state sync: unsharded / ZeRO-1 / "
              "ZeRO-2 / ZeRO-3 (plan) | first step: unsharded / ZeRO-1 / ZeRO-2 / ZeRO-3 | moved p2p: ZeRO-1, 2 / "
              "ZeRO-3 | broadcast: ZeRO-1, 2 | ZeRO-1 R = 1 (relaunch) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in ranks:
        u, z1, z2, z3, r1 = (recs.get((n, *k)) for k in [(None, 0), ("optimizer", 2), ("gradients", 2),
                                                           ("parameters", 2), ("optimizer", 1)])
        if not (u and z1):
            continue
        have = [x for x in (u, z1, z2, z3) if x]
        plan = sh["plan_ms"][str(n)]["2"]
        lines.append(f"| {n} | " + " | ".join(fmt_ms(x["total_ms"]) if x else "" for x in (u, z1, z2, z3)) + " | " +
                     " / ".join(fmt_ms(x["parts_ms"]["state sync"]) for x in have) + f" ({fmt_ms(plan)}) | " +
                     " / ".join(fmt_ms(x["parts_ms"]["first step"]) for x in have) + " | " +
                     f"{fmt_mb(z1.get('moved_state_bytes', 0))} / {fmt_mb(z3.get('moved_state_bytes', 0)) if z3 else ''}"
                     f" | {fmt_mb(z1.get('broadcast_param_bytes', 4 * z1['params']))} | "
                     f"{fmt_ms(r1['total_ms']) if r1 else ''} |")
    return lines


def plot_shard(sh, path):
    steps, rec = [x for x in sh["steps"] if x.get("shard_prefetch", 1) == 1], sh["recoveries"]
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.6))
    ranks = sorted({r["ranks"] for r in rec})
    for ax, large, title in [(axes[0], False, "step, MLP (0.67 M)"), (axes[1], True, "step, ResNet-50-sized (25.6 M)")]:
        for st, r in SHARD_CONFIGS:
            pts = sorted((x["ranks"], x["step_ms"]) for x in steps
                         if shard_key(x) == (st, r) and (x["params"] > 1e7) == large)
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, color=SHARD_COLOURS[st], label=shard_label(st, r),
                        linestyle="--" if r == 1 else "-")
        log_axes(ax, ranks)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("ranks")
    axes[0].set_ylabel("ms per step (Adam)")
    axes[0].legend(fontsize=6, loc="upper left")
    ax = axes[2]
    for st, r in [(None, 0), ("optimizer", 2), ("gradients", 2), ("parameters", 2), ("optimizer", 1)]:
        pts = sorted((x["ranks"], x["total_ms"]) for x in rec if shard_key(x) == (st, r))
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, color=SHARD_COLOURS[st], linestyle="--" if r == 1 else "-",
                    label=shard_label(st, r) + (": shard lost, relaunch" if r == 1 else ""))
    log_axes(ax, ranks)
    ax.set_title("recovery from a killed rank, MLP", fontsize=10)
    ax.set_xlabel("ranks before the failure")
    ax.set_ylabel("ms from the failure until training is back")
    ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Sharded training state at scale, simulated (SimGrid), HDR 200 Gb/s", fontsize=11)
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
