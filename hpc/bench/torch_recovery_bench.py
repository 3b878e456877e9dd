#!/usr/bin/env python3
"""Recovery on a real model: ResNet-18 with one of 4 ranks killed (kill -9) at a random step, four ways, in one run.

    "$SINEW_TORCH_VENV/bin/python" hpc/bench/torch_recovery_bench.py [--rounds 3] [--seed 1] [--out DIR]

  sinew in place   Sinew's ULFM recovery: the survivors revoke, shrink, agree, take the state from their own
                   memory and redo the failed step at 3 ranks (--grow false).
  sinew spare      4 + 1 launched with --spares 1: the idle spare (data and model loaded) is promoted and
                   receives the state from the members' memory; back at 4 ranks, nothing spawned.
  sinew restart    Sinew's restart mode under mpi_scripts/sinew-supervise: the job ends, is relaunched on
                   the surviving slots, resumes from its newest checkpoint and replays the steps since.
  torchrun         torch's elastic agent (torchrun --max-restarts 3): DDP over gloo, a user script that saves
                   model and optimiser with torch.save every --ckpt-every steps and resumes from that file;
                   when a worker dies the agent stops the others and restarts all 4 (hpc/bench/torchrun_job.py).

Every mode trains the same model (torch_bench.build("resnet18"): torchvision's, 1x28x28, batch 32 per rank, one
torch thread per rank, synthetic inputs) and saves every --ckpt-every steps (Sinew's sharded HDF5 checkpoints,
torchrun's torch.save), and within a round the same rank dies at the same random step K (all rounds: one seed).
Measured from the kill until the job has completed step K again ("back at the failed step"), and the work lost:
completed steps that had to be computed again (the failed step itself is redone by every mode and not counted).
Medians over --rounds. Writes DIR/torch_recovery.json (default hpc/bench/results) and prints a table with the
ratios to torchrun (issue 41's goal: in place and spare each >= 20x faster than torchrun, no work lost).
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

RANKS = 4
BATCH = 32
VICTIM = 2
MODES = ["sinew in place", "sinew spare", "sinew restart", "torchrun"]


def sinew_worker(options):
    """One rank of the Sinew job: ResNet-18 on synthetic data through the sinew package."""
    import torch
    import torch_bench
    import sinew
    from sinew.steps import classifier
    torch.set_num_threads(1)
    job = sinew.Job(options)
    x, y = torch_bench.batches("resnet18", 64 * BATCH * RANKS, BATCH)
    model = job.wrap(torch_bench.build("resnet18"), "resnet18")

    step, _ = classifier(model, x, y)
    summary = job.run(model, len(x), step)
    job.exit(summary["exit_code"])


def worker_env(build):
    """The environment of the benchmark's jobs: one OpenMP thread, the sinew package of `build` and this
    folder's modules first on the path."""
    return dict(os.environ, OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([os.path.join(build, "python"), HERE] +
                                           [q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q]))


def mpi_env():
    out = subprocess.run(["bash", "-c", f". {ROOT}/mpi_scripts/env.sh; echo $SINEW_MPIRUN; "
                          "printf '%s\\n' \"${SINEW_MPIRUN_FLAGS[@]}\"; echo $SINEW_BUILD_DIR"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    out = [o for o in out if o]
    return out[0], out[1:-1], out[-1]


def events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def kill_time(text):
    m = re.search(r"injected fault: killing launch rank \d+ .* \(unix_time ([0-9.]+)\)", text)
    if not m:
        raise SystemExit("the fault did not fire:\n" + text[-3000:])
    return float(m.group(1))


def sinew_options(d, fail_step, ckpt_every):
    return ["--max-steps", str(fail_step + 3), "--epochs", "1", "--batch-size", str(BATCH), "--lr", "0.01",
            "--lr-schedule", "constant", "--warmup-steps", "0", "--log-every", "1", "--progress", "false",
            "--metrics", f"{d}/metrics.jsonl", "--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every",
            str(ckpt_every), "--inject-fault", f"{VICTIM}:backward:{fail_step}"]


def sinew_in_place(mode, a, fail_step, py, env):
    mpirun, flags, _ = mpi_env()
    procs, extra = (RANKS, ["--grow", "false"]) if mode == "sinew in place" else (RANKS + 1, ["--spares", "1"])
    with tempfile.TemporaryDirectory() as d:
        cmd = [mpirun, *flags, "-n", str(procs), "-x", "PYTHONPATH", py, os.path.abspath(__file__), "--worker",
               "--", *sinew_options(d, fail_step, a.ckpt_every), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if r.returncode != 0:
            raise SystemExit(f"{mode} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        t_kill = kill_time(r.stdout + r.stderr)
        ev = events(f"{d}/metrics.jsonl")
        f = next(e for e in ev if e.get("event") == "failure")
        rec = next(e for e in ev if e.get("event") == "recovered")
        if mode == "sinew spare" and f.get("promoted", 0) != 1:
            raise SystemExit(f"the spare was not promoted: {f}")
        total = (f["detected_unix_time"] - t_kill) * 1e3 + rec["total_ms"]
        # The survivors redo the failed step from their memory: no completed step is computed again.
        detect = (f["detected_unix_time"] - t_kill) * 1e3
        return {"total_ms": total, "lost_steps": f["step"] - f.get("resumed_step", f["step"]),
                "parts_ms": {"to first step": total, "replay": 0.0, "detect": detect,
                             "step itself": rec["first_step_ms"]},
                "world_after": f["world_size"]}


def sinew_restart(a, fail_step, py, env):
    with tempfile.TemporaryDirectory() as d:
        cmd = [f"{ROOT}/mpi_scripts/sinew-supervise", "-n", str(RANKS), "--events", f"{d}/sup.jsonl", "--", py,
               os.path.abspath(__file__), "--worker", "--", *sinew_options(d, fail_step, a.ckpt_every),
               "--grow", "false", "--elastic", "restart"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if r.returncode != 0:
            raise SystemExit(f"sinew restart failed ({r.returncode}):\n{r.stderr[-3000:]}")
        t_kill = kill_time(r.stdout + r.stderr)
        ev = events(f"{d}/metrics.jsonl")
        res = next(e for e in ev if e.get("event") == "resume" and e.get("generation") == 1)
        after = ev[ev.index(res):]
        back = next(e for e in after if "loss" in e and "event" not in e and e["step"] >= fail_step)
        first = next(e for e in after if "loss" in e and "event" not in e)
        return {"total_ms": (back["unix_time"] - t_kill) * 1e3, "lost_steps": fail_step - 1 - res["step"],
                "parts_ms": {"to first step": (first["unix_time"] - t_kill) * 1e3,
                             "replay": (back["unix_time"] - first["unix_time"]) * 1e3},
                "world_after": RANKS - 1}


def torchrun(a, fail_step, env):
    with tempfile.TemporaryDirectory() as d:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        runner = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [runner, "--nnodes", "1", "--nproc-per-node", str(RANKS), "--max-restarts", "3",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               os.path.join(HERE, "torchrun_job.py"), "--steps", str(fail_step + 3), "--batch", str(BATCH),
               "--ckpt", f"{d}/ckpt.pt", "--ckpt-every", str(a.ckpt_every), "--record", f"{d}/steps.jsonl",
               "--fail-rank", str(VICTIM), "--fail-step", str(fail_step)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if r.returncode != 0:
            raise SystemExit(f"torchrun failed ({r.returncode}):\n{r.stderr[-3000:]}")
        ev = events(f"{d}/steps.jsonl")
        kill = next(e for e in ev if e.get("event") == "kill")
        resumed = next(e for e in ev if e.get("event") == "resume" and e["restart"] >= 1)
        back = next(e for e in ev if e.get("event") == "step" and e["restart"] >= 1 and e["step"] >= fail_step)
        first = next(e for e in ev if e.get("event") == "step" and e["restart"] >= 1)
        return {"total_ms": (back["unix_time"] - kill["unix_time"]) * 1e3,
                "lost_steps": fail_step - 1 - resumed["step"],
                "parts_ms": {"to first step": (first["unix_time"] - kill["unix_time"]) * 1e3,
                             "replay": (back["unix_time"] - first["unix_time"]) * 1e3},
                "world_after": RANKS}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=10, help="steps between saves, every mode")
    p.add_argument("--min-step", type=int, default=14)
    p.add_argument("--max-step", type=int, default=26)
    p.add_argument("--out", default=os.path.join(ROOT, "hpc", "bench", "results"))
    p.add_argument("--build", default=os.environ.get("SINEW_BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--worker", action="store_true")
    args, rest = p.parse_known_args()
    if args.worker:
        return sinew_worker(rest[1:] if rest and rest[0] == "--" else rest)
    py = sys.executable
    env = worker_env(args.build)
    rng = random.Random(args.seed)
    runs = {m: [] for m in MODES}
    steps = []
    t0 = time.time()
    for k in range(args.rounds):
        fail_step = rng.randint(args.min_step, args.max_step)
        steps.append(fail_step)
        for mode in MODES:
            if mode in ("sinew in place", "sinew spare"):
                r = sinew_in_place(mode, args, fail_step, py, env)
            elif mode == "sinew restart":
                r = sinew_restart(args, fail_step, py, env)
            else:
                r = torchrun(args, fail_step, env)
            runs[mode].append(r)
        print(f"round {k + 1}/{args.rounds}, kill at step {fail_step}: " +
              ", ".join(f"{m} {runs[m][-1]['total_ms']:.0f} ms ({runs[m][-1]['lost_steps']} steps lost)"
                        for m in MODES), file=sys.stderr, flush=True)
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "ranks": RANKS, "batch": BATCH,
           "ckpt_every": args.ckpt_every, "seed": args.seed, "fail_steps": steps, "wall_s": time.time() - t0,
           "modes": {}}
    for m, rs in runs.items():
        out["modes"][m] = {"total_ms": statistics.median(r["total_ms"] for r in rs),
                           "parts_ms": {k: statistics.median(r["parts_ms"][k] for r in rs) for k in rs[0]["parts_ms"]},
                           "totals_ms": [r["total_ms"] for r in rs],
                           "lost_steps": [r["lost_steps"] for r in rs], "world_after": rs[0]["world_after"]}
    tr = out["modes"]["torchrun"]["total_ms"]
    for m in MODES:
        out["modes"][m]["torchrun_over"] = tr / out["modes"][m]["total_ms"]
    print(f"\n# ResNet-18, {RANKS} ranks, rank {VICTIM} killed at steps {steps} (seed {args.seed}), saves every "
          f"{args.ckpt_every} steps; medians of {args.rounds} rounds")
    print(f"{'mode':<16} {'kill -> back at the failed step':>32} {'torchrun / mode':>16} {'steps lost':>14} "
          f"{'ranks after':>12}   parts (ms)")
    for m in MODES:
        r = out["modes"][m]
        parts = ", ".join(f"{k} {v:.0f}" for k, v in r["parts_ms"].items())
        print(f"{m:<16} {r['total_ms']:>29.0f} ms {r['torchrun_over']:>15.1f}x {str(r['lost_steps']):>14} "
              f"{r['world_after']:>12}   {parts}")
    print("# parts: to first step = kill -> the first step after the failure is done (in place: detection, revoke, "
          "shrink, agree, rebuild, state sync, and the failed step computed again, whose own time is 'step itself'; "
          "restart and torchrun: teardown, relaunch, rendezvous, checkpoint load, one step); replay = then until "
          "the failed step is done again (the steps lost since the last save)")
    goals = []
    for m in ("sinew in place", "sinew spare"):
        r = out["modes"][m]
        ok = r["torchrun_over"] >= 20 and all(x == 0 for x in r["lost_steps"])
        goals.append({"goal": f"{m}: {r['torchrun_over']:.1f}x faster than torchrun (>= 20x), steps lost "
                              f"{r['lost_steps']} (none)", "met": ok})
    out["goals"] = goals
    print("\n## goals (issue 41)")
    for g in goals:
        print(f"  [{'met' if g['met'] else 'NOT met'}] {g['goal']}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "torch_recovery.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
