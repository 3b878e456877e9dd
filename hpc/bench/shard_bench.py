#!/usr/bin/python3
"""Sharded optimiser state (--shard optimizer, ZeRO-1) and sharded gradients (--shard gradients, ZeRO-2)
against the whole state, in one run: what the redundancy costs and what the recovery costs.

Failure-free, at N ranks (--ranks, default 4), Adam, the built-in MLP (--model, default mlp:4096,4096:
20 M parameters, so that the optimiser state outweighs the data set's loading peak), --steps (default 25),
interleaved rounds (--rounds) of five configurations:
  whole   --shard none (every rank holds all of Adam's state: 8 bytes per parameter);
  r=1     --shard optimizer --shard-replicas 1 (each rank its 1/N: no redundancy, a failure means a relaunch);
  r=2     --shard optimizer --shard-replicas 2 (each shard on two ranks: a failure is recovered in place);
  g r=1, g r=2   --shard gradients with 1 and 2 holders: the gradient buckets reduce-scattered to the holders;
per configuration: the optimiser state each rank holds (the job's own log line), its peak resident memory
(the largest over the ranks, GNU time's maximum RSS), the median step time (the done event) and the bytes a
rank sends per step (the metrics).

A kill: launch rank 2 dies (an injected SIGKILL) inside the gradient allreduce of step 20, --grow false,
whole, r=2 and g r=2: back at the failed step in place, with the parts of the failure event (detect: the kill ->
the survivors' error; revoke, shrink, agree; rebuild of the backends; state sync, and the part of it that is
the reshard for r=2: the lost shards rebuilt from their replicas and laid out over 3; the redone step), medians over
the rounds. With r=1 the same kill loses a shard: the job exits for a relaunch (exit 75), which is checked.

usage: shard_bench.py [--ranks N] [--rounds R] [--model SPEC] [--steps S] [--json FILE] [--png FILE]
       (run from the repository root with /usr/bin/python3; writes hpc/bench/results/shard_bench.json and
       docs/img/shard_bench.png by default)
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_bench import env, events, kill_time  # noqa: E402

CONFIGS = {"whole": ["--shard", "none"], "r=1": ["--shard", "optimizer", "--shard-replicas", "1"],
           "r=2": ["--shard", "optimizer", "--shard-replicas", "2"],
           "g r=1": ["--shard", "gradients", "--shard-replicas", "1"],
           "g r=2": ["--shard", "gradients", "--shard-replicas", "2"]}
COLORS = ["#888", "#4a8", "#48c", "#a84", "#c48"]
FAIL_STEP = 20


def common(d, model, steps, ranks):
    return ["--dataset", "fashion-mnist", "--limit-train", str(64 * ranks * (steps + 2)), "--limit-test", "500",
            "--model", model, "--optimizer", "adam", "--lr", "0.001", "--epochs", "1", "--batch-size", "64",
            "--max-steps", str(steps), "--progress", "false", "--log-every", "1", "--timeout-ms", "60000",
            "--metrics", f"{d}/metrics.jsonl"]


def failure_free(name, a, mpirun, flags, train):
    with tempfile.TemporaryDirectory() as d:
        # Each rank's figure appended to one file (O_APPEND: whole lines), not interleaved on stderr.
        cmd = [mpirun, *flags, "-n", str(a.ranks), "/usr/bin/time", "-a", "-o", f"{d}/rss.txt", "-f",
               "sinew-bench-maxrss-kb %M", train,
               *common(d, a.model, a.steps, a.ranks), *CONFIGS[name]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"{name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        with open(f"{d}/rss.txt") as f:
            rss = [int(x) / 1024 for x in re.findall(r"sinew-bench-maxrss-kb (\d+)", f.read())]
        if len(rss) != a.ranks:
            raise SystemExit(f"{name}: {len(rss)} memory figures for {a.ranks} ranks\n{r.stderr[-2000:]}")
        m = re.search(r"([0-9.]+) MiB per rank of ([0-9.]+) MiB", r.stderr)
        ev = events(f"{d}/metrics.jsonl")
        done = next(e for e in ev if e.get("event") == "done")
        steps = [e for e in ev if "loss" in e and "event" not in e]
        sent = [e["bytes_sent_per_step"] for e in steps[2:] if "bytes_sent_per_step" in e]
        return {"rss_mb": max(rss), "step_ms": done["step_ms"],
                "state_mib": float(m.group(1)) if m else None, "whole_state_mib": float(m.group(2)) if m else None,
                "bytes_per_step": statistics.median(sent) if sent else 0}


def kill(name, a, mpirun, flags, train):
    with tempfile.TemporaryDirectory() as d:
        cmd = [mpirun, *flags, "-n", str(a.ranks), train, *common(d, a.model, a.steps, a.ranks), *CONFIGS[name],
               "--grow", "false", "--inject-fault", f"{min(2, a.ranks - 1)}:allreduce:{FAIL_STEP}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if name == "r=1":
            lost = "all lost (--shard-replicas 1)" in r.stderr
            return {"exit": r.returncode, "relaunch_asked": r.returncode == 75 and lost}
        if r.returncode != 0:
            raise SystemExit(f"{name} kill run failed ({r.returncode}):\n{r.stderr[-3000:]}")
        t_kill = kill_time(r.stderr)
        ev = events(f"{d}/metrics.jsonl")
        f = next(e for e in ev if e.get("event") == "failure")
        rec = next(e for e in ev if e.get("event") == "recovered")
        parts = {"detect": (f["detected_unix_time"] - t_kill) * 1e3, "revoke": f["revoke_ms"],
                 "shrink": f["shrink_ms"], "agree": f["agree_ms"], "rebuild": f["rebuild_ms"],
                 "state sync": f["sync_ms"], "reshard": f.get("reshard_ms", 0.0), "first step": rec["first_step_ms"]}
        # (The reshard is a part of the state sync, not added again.)
        parts["other"] = max(0.0, rec["total_ms"] - sum(v for k, v in parts.items() if k not in ("detect", "reshard")))
        return {"parts": parts, "total_ms": parts["detect"] + rec["total_ms"],
                "recovery_ms": rec["total_ms"] - rec["first_step_ms"]}


def median_of(rows, key):
    return statistics.median(r[key] for r in rows)


def plot(res, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    names = list(CONFIGS)
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.6))
    ff = res["failure_free"]
    ax[0].bar(names, [ff[n]["state_mib"] for n in names], color=COLORS)
    ax[0].set_title("Adam state held per rank (MiB)")
    ax[1].bar(names, [ff[n]["rss_mb"] for n in names], color=COLORS)
    ax[1].set_title("peak resident memory per rank (MB)")
    ax[2].bar(names, [ff[n]["step_ms"] for n in names], color=COLORS)
    ax[2].set_title("median step time (ms)")
    ax[3].bar(names, [ff[n]["bytes_per_step"] / 1e6 for n in names], color=COLORS)
    ax[3].set_title("bytes sent per rank and step (MB)")
    fig.suptitle(f"--shard optimizer (r) and gradients (g r) vs whole state: {res['model']}, Adam, {res['ranks']} ranks "
                 f"(medians of {res['rounds']} interleaved rounds)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="mlp:4096,4096")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--json", default=os.path.join(ROOT, "hpc/bench/results/shard_bench.json"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs/img/shard_bench.png"))
    a = ap.parse_args()
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("Fashion-MNIST is not installed (mpi_scripts/setup.sh installs it)")
        return 77
    mpirun, flags, build = env()
    train = os.path.join(build, "apps/sinew-train")
    rows = {n: [] for n in CONFIGS}
    kills = {"whole": [], "r=2": [], "g r=2": []}
    lost = None
    for i in range(a.rounds):
        for n in CONFIGS:
            rows[n].append(failure_free(n, a, mpirun, flags, train))
        for n in kills:
            kills[n].append(kill(n, a, mpirun, flags, train))
        if lost is None:
            lost = kill("r=1", a, mpirun, flags, train)
        print(f"round {i + 1}/{a.rounds} done", flush=True)
    res = {"ranks": a.ranks, "model": a.model, "rounds": a.rounds, "steps": a.steps, "failure_free": {},
           "kill": {}, "kill_r1": lost}
    for n, rs in rows.items():
        res["failure_free"][n] = {k: median_of(rs, k) for k in ("rss_mb", "step_ms", "bytes_per_step")}
        res["failure_free"][n]["state_mib"] = rs[0]["state_mib"] if rs[0]["state_mib"] is not None else \
            rows["r=1"][0]["whole_state_mib"]
    for n, ks in kills.items():
        res["kill"][n] = {"total_ms": median_of(ks, "total_ms"), "recovery_ms": median_of(ks, "recovery_ms"),
                          "parts": {p: statistics.median(k["parts"][p] for k in ks) for p in ks[0]["parts"]}}
    w = res["failure_free"]["whole"]
    print(f"\n{a.model}, Adam, {a.ranks} ranks, medians of {a.rounds} interleaved rounds")
    print(f"{'':8}{'state/rank MiB':>16}{'peak RSS MB':>13}{'x whole':>9}{'step ms':>9}{'x whole':>9}"
          f"{'sent/step MB':>14}")
    for n, r in res["failure_free"].items():
        print(f"{n:8}{r['state_mib']:16.1f}{r['rss_mb']:13.0f}{r['rss_mb'] / w['rss_mb']:9.2f}"
              f"{r['step_ms']:9.2f}{r['step_ms'] / w['step_ms']:9.2f}{r['bytes_per_step'] / 1e6:14.2f}")
    print(f"\nkill of launch rank 2 in the allreduce of step {FAIL_STEP}, --grow false (ms, medians)")
    parts = list(res["kill"]["whole"]["parts"])
    print(f"{'':8}" + "".join(f"{p:>12}" for p in parts) + f"{'back at step':>14}")
    for n, k in res["kill"].items():
        print(f"{n:8}" + "".join(f"{k['parts'][p]:12.1f}" for p in parts) + f"{k['total_ms']:14.1f}")
    print(f"r=1: exit {lost['exit']}, relaunch asked naming the lost shard: {lost['relaunch_asked']}")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.json}")
    plot(res, a.png)
    return 0 if lost["relaunch_asked"] else 1


if __name__ == "__main__":
    sys.exit(main())
