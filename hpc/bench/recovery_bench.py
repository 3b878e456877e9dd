#!/usr/bin/python3
"""Recovery benchmark: the same failure (a rank SIGKILLed inside the gradient allreduce) recovered in
place (ULFM) and in restart mode (sinew-supervise relaunches from the latest checkpoint), at 4 ranks, in
one run. Prints the breakdown of each as a table, writes JSON and a PNG.

In place:  detect (kill -> error at the survivors), revoke, shrink, agree, rebuild (backends, buckets,
           checkpoint writer), state sync (from the most advanced survivor's memory), first step.
Restart:   detect (kill -> the job has exited), relaunch (mpirun, MPI start-up, data loading),
           checkpoint load, first step, and the replay of the steps lost since that checkpoint.

usage: recovery_bench.py [--rounds N] [--json FILE] [--png FILE]   (run from the repository root)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def env():
    out = subprocess.run(["bash", "-c", f". {ROOT}/mpi_scripts/env.sh; echo $SINEW_MPIRUN; "
                          "printf '%s\\n' \"${SINEW_MPIRUN_FLAGS[@]}\"; echo $SINEW_BUILD_DIR"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    out = [o for o in out if o]
    return out[0], out[1:-1], out[-1]


FAIL_STEP = 60
CKPT_EVERY = 50


def common(d):
    return ["--dataset", "fashion-mnist", "--limit-train", "16384", "--limit-test", "2000", "--model",
            "mlp:512,512", "--epochs", "1", "--batch-size", "64", "--progress", "false", "--log-every", "1",
            "--metrics", f"{d}/metrics.jsonl", "--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every",
            str(CKPT_EVERY), "--grow", "false", "--inject-fault", f"2:allreduce:{FAIL_STEP}"]


def kill_time(text):
    m = re.search(r"injected fault: killing launch rank \d+ .* \(unix_time ([0-9.]+)\)", text)
    if not m:
        raise SystemExit("the fault did not fire:\n" + text[-3000:])
    return float(m.group(1))


def events(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def in_place(mpirun, flags, build):
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([mpirun, *flags, "-n", "4", f"{build}/apps/sinew-train", *common(d)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"in-place run failed ({r.returncode}):\n{r.stderr[-3000:]}")
        t_kill = kill_time(r.stderr)
        ev = events(f"{d}/metrics.jsonl")
        f = next(e for e in ev if e.get("event") == "failure")
        rec = next(e for e in ev if e.get("event") == "recovered")
        detect = (f["detected_unix_time"] - t_kill) * 1e3
        parts = {"detect": detect, "revoke": f["revoke_ms"], "shrink": f["shrink_ms"], "agree": f["agree_ms"],
                 "rebuild": f["rebuild_ms"], "state sync": f["sync_ms"], "first step": rec["first_step_ms"]}
        total = detect + rec["total_ms"]
        return parts, total


def restart(build):
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([f"{ROOT}/mpi_scripts/sinew-supervise", "-n", "4", "--events", f"{d}/sup.jsonl", "--",
                            f"{build}/apps/sinew-train", *common(d), "--elastic", "restart"],
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
        return parts, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(ROOT, "hpc/bench/results/recovery.json"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs/img/recovery.png"))
    a = ap.parse_args()
    mpirun, flags, build = env()
    runs = {"in place": [], "restart": []}
    for k in range(a.rounds):
        runs["in place"].append(in_place(mpirun, flags, build))
        runs["restart"].append(restart(build))
        print(f"round {k + 1}/{a.rounds}: in place {runs['in place'][-1][1]:.1f} ms, "
              f"restart {runs['restart'][-1][1]:.1f} ms", file=sys.stderr)
    out = {}
    for mode, rs in runs.items():
        keys = list(rs[0][0])
        out[mode] = {"parts_ms": {k: statistics.median(r[0][k] for r in rs) for k in keys},
                     "total_ms": statistics.median(r[1] for r in rs),
                     "totals_ms": [r[1] for r in rs]}
    print(f"# recovery from one rank SIGKILLed in the gradient allreduce of step {FAIL_STEP}, 4 ranks, "
          f"MLP 784-512-512-10, checkpoint every {CKPT_EVERY} steps; medians of {a.rounds} rounds (ms)")
    for mode in out:
        print(f"# {mode}")
        for k, v in out[mode]["parts_ms"].items():
            print(f"  {k:>16} {v:10.2f}")
        print(f"  {'total':>16} {out[mode]['total_ms']:10.2f}   (rounds: "
              + ", ".join(f"{t:.1f}" for t in out[mode]["totals_ms"]) + ")")
    ratio = out["restart"]["total_ms"] / out["in place"]["total_ms"]
    out["restart_over_in_place"] = ratio
    print(f"# restart / in place = {ratio:.1f}x")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    json.dump(out, open(a.json, "w"), indent=1)
    plot(out, a.png)


def plot(out, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for y, mode in enumerate(["in place", "restart"]):
        left = 0
        for k, v in out[mode]["parts_ms"].items():
            ax.barh(y, v, left=left, label=f"{mode}: {k}")
            if v > 0.04 * out["restart"]["total_ms"]:
                ax.text(left + v / 2, y, k, ha="center", va="center", fontsize=7)
            left += v
        ax.text(left, y, f"  {out[mode]['total_ms']:.0f} ms", va="center", fontsize=8)
    ax.set_yticks([0, 1], ["in place (ULFM)", "restart (relaunch)"])
    ax.set_xlabel("ms from the kill until training is back at the failed step")
    ax.set_title(f"Recovery, 4 ranks, one rank killed (restart / in place = {out['restart_over_in_place']:.0f}x)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(png), exist_ok=True)
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
