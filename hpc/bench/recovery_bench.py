#!/usr/bin/python3
"""Recovery benchmark: the same failure (a rank SIGKILLed inside the gradient allreduce) recovered four
ways at N ranks (--ranks, default 4), in one run: three in place (ULFM) and one in restart mode
(sinew-supervise relaunches from the latest checkpoint). Prints the breakdown of each in one table, writes
JSON and a PNG.

In place:  --grow false: detect (kill -> error at the survivors), revoke, shrink, agree, rebuild
           (backends, buckets, checkpoint writer), state sync (from the most advanced survivor's memory),
           first step; the job goes on at N-1 ranks.
Spare:     N+1 launched with --spares 1: the same steps, the pool's revoke/shrink/agree promoting the idle
           spare (it has the data loaded), which takes the state from the members' memory; back to N, no
           spawn (spawn 0).
Spawn:     --grow true, no spares: as in place, then spawn (MPI_Comm_spawn of the replacement, its start-up
           and data loading, merge, rebuild and state sync of the grown view); back to N.
Restart:   detect (kill -> the job has exited), relaunch (mpirun, MPI start-up, data loading),
           checkpoint load, first step, and the replay of the steps lost since that checkpoint.
Node loss: on the shaped test bed (hpc/net/, one rank per host, unshaped links; needs root), the host of
           the same rank is lost at the same step: its links go dark, its rank and PRRTE daemon are killed,
           its /dev/shm emptied. PRRTE ends the whole job when it loses a daemon, so this is never in place:
           sinew-run relaunches on the hosts left, from the checkpoint and then the state the nodes kept in
           memory (--state-mirror). Parts: detect (loss -> the job has exited), relaunch, checkpoint load,
           memory load, first step, replay (none: the memory holds the last step).

Each is measured from the kill (the injected fault's unix_time) until training is back at the failed step:
in place, spare and spawn as the failure event's detected_unix_time minus the kill, plus the recovered
event's total_ms (detection -> first step done); `other` is the part of that total outside the named
parts. Medians over --rounds rounds.

The killed rank is launch rank 2 (rank 1 at --ranks 2). Every run trains on 16384 samples (4096 per rank
from 5 ranks up, so that an epoch still reaches the failed step).

usage: recovery_bench.py [--ranks N] [--rounds R] [--train BIN] [--json FILE] [--png FILE]   (run from the
       repository root; BIN defaults to $SINEW_BUILD_DIR/apps/sinew-train; --json and --png default to the
       4-rank results that docs/benchmarks.md shows, pass others when measuring another size)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def env():
    out = subprocess.run(["bash", "-c", f". {ROOT}/mpi_scripts/env.sh; echo $SINEW_MPIRUN; "
                          "printf '%s\\n' \"${SINEW_MPIRUN_FLAGS[@]}\"; echo $SINEW_BUILD_DIR"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    out = [o for o in out if o]
    return out[0], out[1:-1], out[-1]


FAIL_STEP = 60
CKPT_EVERY = 50
BATCH = 64
MODES = ["in place", "spare", "spawn", "restart", "node loss"]
# Rows of the table, in the order they happen (a mode shows "-" for a part it does not have).
PARTS = ["detect", "revoke", "shrink", "agree", "rebuild", "state sync", "spawn", "relaunch",
         "checkpoint load", "memory load", "first step", "replay", "other"]
NET = os.path.join(ROOT, "hpc/net")


def in_place_modes(ranks):
    """The in-place modes: processes launched, their options, and the world size after the recovery."""
    return {
        "in place": (ranks, ["--grow", "false"], ranks - 1),
        "spare": (ranks + 1, ["--grow", "true", "--spares", "1"], ranks),
        "spawn": (ranks, ["--grow", "true"], ranks),
    }


def mode_labels(ranks):
    return {"in place": f"in place (ULFM, {ranks - 1} left)", "spare": f"hot spare ({ranks}+1)",
            "spawn": "spawn (ULFM + spawn)", "restart": "restart (relaunch)",
            "node loss": f"node lost (relaunch, {ranks - 1} hosts)"}


def common(d, ranks):
    # The victim is a training rank (never the spare, launch rank `ranks`); an epoch reaches the failed step.
    victim = min(2, ranks - 1)
    samples = max(16384, (FAIL_STEP + 4) * BATCH * ranks)
    return ["--dataset", "fashion-mnist", "--limit-train", str(samples), "--limit-test", "2000", "--model",
            "mlp:512,512", "--epochs", "1", "--batch-size", str(BATCH), "--progress", "false", "--log-every",
            "1", "--metrics", f"{d}/metrics.jsonl", "--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every",
            str(CKPT_EVERY), "--inject-fault", f"{victim}:allreduce:{FAIL_STEP}"]


def kill_time(text):
    m = re.search(r"injected fault: killing launch rank \d+ .* \(unix_time ([0-9.]+)\)", text)
    if not m:
        raise SystemExit("the fault did not fire:\n" + text[-3000:])
    return float(m.group(1))


def events(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def in_place(mode, ranks, mpirun, flags, train):
    """One run of an in-place mode: (parts, total, details)."""
    procs, options, world = in_place_modes(ranks)[mode]
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([mpirun, *flags, "-n", str(procs), train, *common(d, ranks), *options],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"{mode} run failed ({r.returncode}):\n{r.stderr[-3000:]}")
        t_kill = kill_time(r.stderr)
        ev = events(f"{d}/metrics.jsonl")
        f = next(e for e in ev if e.get("event") == "failure")
        rec = next(e for e in ev if e.get("event") == "recovered")
        grow = next((e for e in ev if e.get("event") == "grow"), None)
        # The run must have recovered the way its mode says (a spare that was not used would measure a spawn).
        promoted, spawn_ms = f.get("promoted", 0), f.get("spawn_ms", 0.0)
        expect = {"in place": promoted == 0 and spawn_ms == 0, "spare": promoted == 1 and spawn_ms == 0,
                  "spawn": promoted == 0 and spawn_ms > 0}[mode]
        if not expect or f["world_size"] != world:
            raise SystemExit(f"{mode} run did not recover as expected: promoted {promoted}, spawn_ms {spawn_ms}, "
                             f"world size {f['world_size']} (expected {world})\n{r.stderr[-2000:]}")
        detect = (f["detected_unix_time"] - t_kill) * 1e3
        parts = {"detect": detect, "revoke": f["revoke_ms"], "shrink": f["shrink_ms"], "agree": f["agree_ms"],
                 "rebuild": f["rebuild_ms"], "state sync": f["sync_ms"]}
        if mode != "in place":
            parts["spawn"] = spawn_ms
        parts["first step"] = rec["first_step_ms"]
        parts["other"] = max(0.0, rec["total_ms"] - sum(v for k, v in parts.items() if k != "detect"))
        total = detect + rec["total_ms"]
        details = {"world_size": f["world_size"], "promoted": promoted, "launched": procs}
        if grow is not None:
            details["grow"] = {k: grow[k] for k in ("spawn_ms", "merge_ms", "rebuild_ms", "sync_ms", "ms")
                               if k in grow}
        return parts, total, details


def restart(ranks, train):
    with tempfile.TemporaryDirectory() as d:
        # From the checkpoint alone (--state-mirror none): the classic restart; the node-loss column shows the
        # relaunch from node memory.
        r = subprocess.run([f"{ROOT}/mpi_scripts/sinew-supervise", "-n", str(ranks), "--events", f"{d}/sup.jsonl",
                            "--state-mirror", "none", "--", train, *common(d, ranks), "--grow", "false", "--elastic", "restart"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"restart run failed ({r.returncode}):\n{r.stderr[-3000:]}")
        t_kill = kill_time(r.stdout + r.stderr)
        sup = events(f"{d}/sup.jsonl")
        t_exit = next(e for e in sup if e["event"] == "exit" and e["generation"] == 0)["unix_time"]
        t_launch = next(e for e in sup if e["event"] == "launch" and e["generation"] == 1)["unix_time"]
        ev = events(f"{d}/metrics.jsonl")
        res = next(e for e in ev if e.get("event") == "resume" and e.get("generation") == 1)
        i = ev.index(res)
        steps = [e for e in ev[i:] if "loss" in e and "event" not in e]
        first = steps[0]
        back = next(e for e in steps if e["step"] >= FAIL_STEP)
        detect = (t_exit - t_kill) * 1e3
        relaunch = (res["unix_time"] - t_launch) * 1e3 - res["load_ms"] + (t_launch - t_exit) * 1e3
        parts = {"detect": detect, "relaunch": relaunch, "checkpoint load": res["load_ms"],
                 "first step": (first["unix_time"] - res["unix_time"]) * 1e3,
                 "replay": (back["unix_time"] - first["unix_time"]) * 1e3}
        total = (back["unix_time"] - t_kill) * 1e3
        return parts, total, {"world_size": ranks, "launched": ranks}


def node_loss(ranks, train):
    """One run: a bed host lost at the failed step, sinew-run relaunching on the hosts left."""
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/hosts", "w") as f:
            f.writelines(f"sinew-h{h} slots=1\n" for h in range(1, ranks + 1))
        opts = common(d, ranks)
        i = opts.index("--inject-fault")
        del opts[i:i + 2]  # the loss comes from outside
        job = subprocess.Popen([f"{ROOT}/mpi_scripts/sinew-run", "--mpirun", f"{NET}/mpirun.sh --as-mpirun",
                                "--hostfile", f"{d}/hosts", "--events", f"{d}/sup.jsonl", "--", train, *opts,
                                "--grow", "false"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        victim = min(2, ranks - 1)
        t_kill = None
        deadline = time.time() + 300
        while t_kill is None and job.poll() is None and time.time() < deadline:
            try:
                with open(f"{d}/metrics.jsonl") as f:
                    steps = [json.loads(l)["step"] for l in f if '"loss"' in l]
            except FileNotFoundError:
                steps = []
            if steps and max(steps) >= FAIL_STEP - 1:  # the loss lands in step FAIL_STEP
                t_kill = time.time()
                subprocess.run([f"{NET}/testbed.sh", "lose", str(victim + 1)], check=True, capture_output=True)
            time.sleep(0.002)
        out, _ = job.communicate(timeout=300)
        if job.returncode != 0 or t_kill is None:
            raise SystemExit(f"node loss run failed ({job.returncode}, loss at {t_kill}):\n{out[-3000:]}")
        sup = events(f"{d}/sup.jsonl")
        t_exit = next(e for e in sup if e["event"] == "exit" and e["generation"] == 0)["unix_time"]
        last = max(e["generation"] for e in sup if e["event"] == "launch")
        t_launch = next(e for e in sup if e["event"] == "launch" and e["generation"] == last)["unix_time"]
        ev = events(f"{d}/metrics.jsonl")
        before = max(e["step"] for e in ev if "loss" in e and e["unix_time"] < t_launch)
        res = [e for e in ev if e.get("event") == "resume" and e.get("generation") == last]
        mem = next((e for e in res if e["path"].endswith(".bin")), None)
        if mem is None:
            raise SystemExit(f"node loss run did not resume from node memory: {res}\n{out[-2000:]}")
        ckpt_ms = sum(e["load_ms"] for e in res if e is not mem)
        i = ev.index(mem)
        steps = [e for e in ev[i:] if "loss" in e and "event" not in e]
        first, back = steps[0], next(e for e in steps if e["step"] > before)
        t_res = mem["unix_time"]
        relaunch = (t_res - t_exit) * 1e3 - ckpt_ms - mem["load_ms"]
        parts = {"detect": (t_exit - t_kill) * 1e3, "relaunch": relaunch, "checkpoint load": ckpt_ms,
                 "memory load": mem["load_ms"], "first step": (first["unix_time"] - t_res) * 1e3,
                 "replay": (back["unix_time"] - first["unix_time"]) * 1e3}
        total = (back["unix_time"] - t_kill) * 1e3
        return parts, total, {"world_size": mem["world_size"], "launched": ranks, "launches": last + 1,
                              "resumed_step": mem["step"], "failed_step": before + 1}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4, help="training ranks before the failure (default 4)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--train", help="the sinew-train to run (default $SINEW_BUILD_DIR/apps/sinew-train)")
    ap.add_argument("--json", default=os.path.join(ROOT, "hpc/bench/results/recovery.json"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs/img/recovery.png"))
    a = ap.parse_args()
    if a.ranks < 2:
        ap.error("--ranks must be at least 2 (one rank is killed, the others recover)")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    mpirun, flags, build = env()
    train = a.train or f"{build}/apps/sinew-train"
    if not os.access(train, os.X_OK):
        raise SystemExit(f"recovery_bench: {train} is not an executable (build it, or pass --train)")
    if os.geteuid() != 0:
        raise SystemExit("recovery_bench: the node-loss column needs the test bed (root: network namespaces)")
    subprocess.run([f"{NET}/testbed.sh", "up", str(a.ranks), "unlimited"], check=True, capture_output=True)
    runs = {mode: [] for mode in MODES}
    try:
        for k in range(a.rounds):
            for mode in MODES:
                if mode == "node loss":
                    subprocess.run([f"{NET}/testbed.sh", "heal"], check=True, capture_output=True)
                    runs[mode].append(node_loss(a.ranks, train))
                else:
                    runs[mode].append(restart(a.ranks, train) if mode == "restart"
                                      else in_place(mode, a.ranks, mpirun, flags, train))
            print(f"round {k + 1}/{a.rounds}: " + ", ".join(f"{m} {runs[m][-1][1]:.1f} ms" for m in MODES),
                  file=sys.stderr)
    finally:
        subprocess.run([f"{NET}/testbed.sh", "down"], capture_output=True)
        print(f"round {k + 1}/{a.rounds}: " + ", ".join(f"{m} {runs[m][-1][1]:.1f} ms" for m in MODES),
              file=sys.stderr)
    out = {}
    for mode, rs in runs.items():
        keys = list(rs[0][0])
        out[mode] = {"parts_ms": {k: statistics.median(r[0][k] for r in rs) for k in keys},
                     "total_ms": statistics.median(r[1] for r in rs),
                     "totals_ms": [r[1] for r in rs], **rs[0][2]}
        if mode == "spawn":
            out[mode]["grow_ms"] = {k: statistics.median(r[2]["grow"][k] for r in rs) for k in rs[0][2]["grow"]}
            out[mode].pop("grow", None)
    out["restart_over_in_place"] = out["restart"]["total_ms"] / out["in place"]["total_ms"]
    out["restart_over_spare"] = out["restart"]["total_ms"] / out["spare"]["total_ms"]
    out["spawn_over_spare"] = out["spawn"]["total_ms"] / out["spare"]["total_ms"]
    out["node_loss_over_restart"] = out["node loss"]["total_ms"] / out["restart"]["total_ms"]
    print(table(out, a.rounds, a.ranks))
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    plot(out, a.png, a.ranks)


def table(out, rounds, ranks):
    lines = [f"# recovery from one rank SIGKILLed in the gradient allreduce of step {FAIL_STEP}, {ranks} ranks, "
             f"MLP 784-512-512-10, checkpoint every {CKPT_EVERY} steps; medians of {rounds} rounds (ms)",
             f"# spare: {ranks}+1 launched with --spares 1, its revoke/shrink/agree are the pool's reform that "
             "promotes the spare; spawn: --grow true, spawn = the replacement's spawn, start-up, merge and "
             "state sync",
             f"{'':>16}" + "".join(f"{m:>12}" for m in MODES)]
    for part in PARTS:
        if not any(part in out[m]["parts_ms"] for m in MODES):
            continue
        lines.append(f"{part:>16}" + "".join(f"{out[m]['parts_ms'][part]:12.2f}" if part in out[m]["parts_ms"]
                                               else f"{'-':>12}" for m in MODES))
    lines.append(f"{'total':>16}" + "".join(f"{out[m]['total_ms']:12.2f}" for m in MODES))
    lines.append(f"{'world after':>16}" + "".join(f"{out[m]['world_size']:>12}" for m in MODES))
    if "grow_ms" in out["spawn"]:
        g = out["spawn"]["grow_ms"]
        lines.append("# spawn, of which: " + ", ".join(f"{k} {v:.1f}" for k, v in g.items()))
    for m in MODES:
        lines.append(f"# {m} rounds: " + ", ".join(f"{t:.1f}" for t in out[m]["totals_ms"]))
    lines.append(f"# restart / spare = {out['restart_over_spare']:.1f}x, spawn / spare = "
                 f"{out['spawn_over_spare']:.1f}x, restart / in place = {out['restart_over_in_place']:.1f}x, "
                 f"node loss / restart = {out['node_loss_over_restart']:.2f}x")
    nl = out["node loss"]
    lines.append(f"# node loss: on the bed, one rank per host; relaunched in {nl['launches']} launches, resumed "
                 f"from node memory at step {nl['resumed_step']} (the failed step: {nl['failed_step']})")
    return "\n".join(lines)


def plot(out, png, ranks):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = dict(zip(PARTS, plt.get_cmap("tab20").colors))
    longest = max(out[m]["total_ms"] for m in MODES)
    fig, ax = plt.subplots(figsize=(8.5, 4.4))
    order = ["spare", "in place", "spawn", "node loss", "restart"]  # fastest at the bottom
    for y, mode in enumerate(order):
        left = 0
        for k, v in out[mode]["parts_ms"].items():
            ax.barh(y, v, left=left, color=colors[k], label=k)
            if v > 0.05 * longest:
                ax.text(left + v / 2, y, k, ha="center", va="center", fontsize=7)
            left += v
        ax.text(left, y, f"  {out[mode]['total_ms']:.0f} ms", va="center", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))  # one entry per part
    ax.legend([seen[p] for p in PARTS if p in seen], [p for p in PARTS if p in seen], fontsize=6, ncol=2,
              loc="lower right")
    ax.set_yticks(range(len(order)), [mode_labels(ranks)[m] for m in order])
    ax.set_xlim(0, longest * 1.15)
    ax.set_xlabel("ms from the kill until training is back at the failed step")
    ax.set_title(f"Recovery, {ranks} ranks, one rank killed (restart / spare = {out['restart_over_spare']:.0f}x, "
                 f"spawn / spare = {out['spawn_over_spare']:.0f}x)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
