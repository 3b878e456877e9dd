#!/usr/bin/env python3
"""PyTorch's own MNIST example, ported two ways, side by side on Fashion-MNIST: torchrun + DDP against Sinew.

    python3 hpc/bench/mnist_port_bench.py [--ranks 4] [--epochs 1] [--seed 1] [--limit-train N --limit-test M]
        [--original mnist_original.py] [--out hpc/bench/results/mnist_port.json] [--workdir DIR]

The two ports of pytorch/examples' mnist/main.py (both read datasets.FashionMNIST('../data')):
  - hpc/bench/mnist_ddp.py: the usual torchrun + DDP port (gloo, DistributedSampler with set_epoch,
    DistributedDataParallel, rank 0 saves);
  - examples/torch/mnist/main.py: the Sinew port (sinew.init(), job.sampler, job.wrap, job.epochs).
Four jobs, --ranks processes each (one torch thread per rank), --epochs epochs, the scripts' own defaults
otherwise (batch 64 per rank, Adadelta lr 1.0, seed 1):
  ddp         torchrun --standalone --nproc-per-node RANKS mnist_ddp.py
  sinew       the Sinew port under mpirun, no failure
  sinew-kill  the Sinew port, a random non-zero rank SIGKILLed at a random step and phase (--inject-fault,
              drawn from --seed): the survivors recover in place and spawn a replacement
  sinew-kill0 the same with rank 0 killed
For each: exit code, test accuracy (the last "Test set: ... Accuracy: C/T" line), wall time; for the Sinew
jobs also the exactly-once audit (mpi_scripts/check-audit.py) and the recovery from the --metrics JSON
Lines (the `failure` and `recovered` events, `failures` of the `done` event). Prints a markdown table and the
accuracy differences against DDP and against the failure-free Sinew run (the bar: within --bar points,
default 1), and writes JSON (--out). Exit status: 0 when every job exited 0, every audit held, every Sinew
job that was killed recovered, and every difference is within the bar; 1 otherwise.

The data come from Debian's dataset-fashion-mnist through examples/torch/mnist/prepare_data.sh into
WORKDIR/data (nothing downloaded; --limit-train/--limit-test for a subset); each job runs in WORKDIR/NAME.
Environment: mpi_scripts/env.sh (mpirun, its flags, the torch venv), the build's Python package
(build/python, --pythonpath to change it).
"""
import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DDP_SCRIPT = os.path.join(HERE, "mnist_ddp.py")
SINEW_SCRIPT = os.path.join(ROOT, "examples", "torch", "mnist", "main.py")
PREPARE = os.path.join(ROOT, "examples", "torch", "mnist", "prepare_data.sh")
CHECK_AUDIT = os.path.join(ROOT, "mpi_scripts", "check-audit.py")
DEFAULT_BATCH = 64  # the ported script's own --batch-size default (per rank)
TEST_LINE = re.compile(r"Test set: Average loss: ([0-9.]+), Accuracy: (\d+)/(\d+)")


def mpi_env():
    """mpirun, its flags and the torch venv, as mpi_scripts/env.sh sets them (the one place they are kept)."""
    script = ('. "$1"; printf "%s\\0" "$SINEW_TORCH_VENV" "$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}"')
    out = subprocess.run(["bash", "-c", script, "env.sh", os.path.join(ROOT, "mpi_scripts", "env.sh")],
                         check=True, capture_output=True, text=True).stdout
    venv, mpirun, *flags = out.split("\0")[:-1]
    if not mpirun:
        sys.exit("mnist_port_bench: no mpirun (mpi_scripts/env.sh)")
    return venv, mpirun, flags


def idx_count(path):
    """The number of items in an IDX file: the first dimension of its header."""
    with open(path, "rb") as f:
        head = f.read(8)
    return struct.unpack(">I", head[4:8])[0]


def diff_stat(original, ported):
    """(added, removed) lines of `diff -u original ported`, and the diff itself."""
    r = subprocess.run(["diff", "-u", original, ported], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    added = sum(1 for l in lines if l.startswith("+") and not l.startswith("+++"))
    removed = sum(1 for l in lines if l.startswith("-") and not l.startswith("---"))
    return added, removed


def run_job(name, cmd, cwd, env, deadline):
    """Runs one job under `timeout` (the whole MPI job gets SIGTERM at the deadline, SIGKILL 10 s later);
    its output goes to cwd/out.txt. Returns (exit code, wall seconds, output)."""
    out_path = os.path.join(cwd, "out.txt")
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    with open(out_path, "w") as out:
        rc = subprocess.call(["timeout", "-k", "10", str(deadline)] + cmd, cwd=cwd, env=env,
                             stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    with open(out_path, errors="replace") as f:
        text = f.read()
    note = f" (its {deadline} s deadline)" if rc == 124 else ""
    print(f"   exit {rc}{note}, {wall:.1f} s", flush=True)
    return rc, wall, text


def accuracy(text):
    """The last "Test set" line's accuracy in percent (every rank prints one; after a kill the replacement
    prints its own too, identical since the model is replicated), or None. The lines of several ranks may
    be interleaved in the output, hence a search rather than a line match."""
    found = TEST_LINE.findall(text)
    if not found:
        return None
    _, correct, total = found[-1]
    return 100.0 * int(correct) / int(total)


def read_metrics(path):
    """The events of a --metrics file: failures, recoveries, the `done` summary."""
    events = []
    try:
        with open(path) as f:
            for raw in f:
                raw = raw.strip()
                if raw:
                    try:
                        e = json.loads(raw)
                    except ValueError:
                        continue  # a line torn by a kill
                    if "event" in e:
                        events.append(e)
    except OSError:
        return {"error": f"no metrics file {path}"}
    keep = ("step", "world_size", "total_ms", "first_step_ms")
    done = [e for e in events if e["event"] == "done"]
    return {
        "failure_events": sum(1 for e in events if e["event"] == "failure"),
        "recovered": [{k: e[k] for k in keep if k in e} for e in events if e["event"] == "recovered"],
        "done": ({k: done[-1].get(k) for k in ("failures", "steps", "world_size", "wall_s", "samples_per_s")}
                 if done else None),
    }


def audit(audit_dir, train_size, epochs):
    """mpi_scripts/check-audit.py on a job's --audit-dir: (held, its last line)."""
    r = subprocess.run([sys.executable, CHECK_AUDIT, audit_dir, "--dataset-size", str(train_size),
                        "--epochs", str(epochs)], capture_output=True, text=True)
    lines = (r.stdout + r.stderr).strip().splitlines()
    return r.returncode == 0, (lines[-1] if lines else f"exit {r.returncode}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, help="per rank (default: the script's, 64)")
    ap.add_argument("--seed", type=int, default=1, help="draws the killed rank, its step and phase")
    ap.add_argument("--script-seed", type=int, help="the scripts' own --seed (default: theirs, 1)")
    ap.add_argument("--phases", default="forward,backward,optimizer", help="the phases a kill is drawn from")
    ap.add_argument("--only", help="a comma-separated subset of ddp,sinew,sinew-kill,sinew-kill0")
    ap.add_argument("--limit-train", type=int, default=0, help="the first N training images only (0: all)")
    ap.add_argument("--limit-test", type=int, default=0, help="the first M test images only (0: all)")
    ap.add_argument("--deadline", type=int, default=1800, help="seconds each job may run")
    ap.add_argument("--bar", type=float, default=1.0, help="accuracy points allowed between the runs")
    ap.add_argument("--original", help="pytorch/examples' mnist/main.py: print both ports' diff stat against it")
    ap.add_argument("--python", help="with torch and torchvision (default: the torch venv of mpi_scripts/env.sh)")
    ap.add_argument("--pythonpath", default=os.path.join(ROOT, "build", "python"), help="the built sinew package")
    ap.add_argument("--workdir", help="data and job directories (default: a temporary one, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary working directory")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "mnist_port.json"))
    args = ap.parse_args()

    venv, mpirun, mpirun_flags = mpi_env()
    python = args.python or os.path.join(venv, "bin", "python")
    torchrun = os.path.join(os.path.dirname(python), "torchrun")
    names = ["ddp", "sinew", "sinew-kill", "sinew-kill0"]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]

    stats = {}
    if args.original:
        for label, script in (("ddp", DDP_SCRIPT), ("sinew", SINEW_SCRIPT)):
            added, removed = diff_stat(args.original, script)
            stats[label] = {"added": added, "removed": removed}
            print(f"diff -u {os.path.basename(args.original)} {os.path.relpath(script, ROOT)}: "
                  f"{added} insertions(+), {removed} deletions(-)")

    workdir = args.workdir or tempfile.mkdtemp(prefix="mnist_port_")
    os.makedirs(workdir, exist_ok=True)
    data = os.path.join(workdir, "data")
    prep = ["bash", PREPARE, data, "--limit-train", str(args.limit_train), "--limit-test", str(args.limit_test)]
    subprocess.run(prep, check=True, stdout=subprocess.DEVNULL)
    raw = os.path.join(data, "FashionMNIST", "raw")
    train_size = idx_count(os.path.join(raw, "train-images-idx3-ubyte"))
    test_size = idx_count(os.path.join(raw, "t10k-images-idx3-ubyte"))

    # The kills: a random non-zero rank, and rank 0, each at a step drawn from the middle 80 % of the run
    # (steps are 1-based; a partial last batch is not counted, to stay inside the run) and a random phase.
    batch = args.batch_size or DEFAULT_BATCH
    total_steps = args.epochs * max(1, train_size // (args.ranks * batch))
    rng = random.Random(args.seed)
    phases = args.phases.split(",")

    def draw(rank):
        step = rng.randint(max(1, total_steps // 10), max(1, total_steps * 9 // 10))
        return f"{rank}:{rng.choice(phases)}:{step}"
    faults = {"sinew": None, "sinew-kill": draw(rng.randrange(1, args.ranks)), "sinew-kill0": draw(0)}

    script_args = ["--epochs", str(args.epochs)] + (["--batch-size", str(args.batch_size)] if args.batch_size else [])
    if args.script_seed is not None:
        script_args += ["--seed", str(args.script_seed)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=args.pythonpath)
    env.pop("SINEW_OPTIONS", None)
    print(f"{args.ranks} ranks, {args.epochs} epoch(s), {train_size} training / {test_size} test images, "
          f"batch {batch} per rank, {total_steps} steps; workdir {workdir}", flush=True)

    results = {}
    for name in names:
        cwd = os.path.join(workdir, name)  # ../data from here is WORKDIR/data
        shutil.rmtree(cwd, ignore_errors=True)
        os.makedirs(cwd)
        r = {}
        if name == "ddp":
            cmd = [torchrun, "--standalone", "--nproc-per-node", str(args.ranks), DDP_SCRIPT] + script_args
            rc, wall, text = run_job(name, cmd, cwd, env, args.deadline)
        else:
            fault = faults[name]
            options = f"--audit-dir {cwd}/audit --metrics {cwd}/metrics.jsonl --progress false"
            if fault:
                options += f" --inject-fault {fault}"
            jenv = dict(env, SINEW_OPTIONS=options)
            cmd = ([mpirun] + mpirun_flags + ["-x", "SINEW_OPTIONS", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
                                              "-n", str(args.ranks), python, SINEW_SCRIPT] + script_args)
            rc, wall, text = run_job(name, cmd, cwd, jenv, args.deadline)
            held, line = audit(os.path.join(cwd, "audit"), train_size, args.epochs)
            r.update(fault=fault, audit_ok=held, audit=line, metrics=read_metrics(os.path.join(cwd, "metrics.jsonl")))
            print(f"   audit: {line}", flush=True)
        r.update(exit_code=rc, wall_s=round(wall, 1), test_accuracy=accuracy(text))
        results[name] = r

    # The differences, and whether each stays within the bar.
    def diff(a, b):
        x, y = results.get(a, {}).get("test_accuracy"), results.get(b, {}).get("test_accuracy")
        return None if x is None or y is None else round(x - y, 2)
    for name, r in results.items():
        r["vs_ddp"] = diff(name, "ddp") if name != "ddp" else None
        r["vs_sinew"] = diff(name, "sinew") if name.startswith("sinew-") else None

    def recovery(r):
        m = r.get("metrics")
        if not m or "error" in m:
            return "" if m is None else m["error"]
        done = m["done"] or {}
        rec = "; ".join(f"recovered at step {e.get('step')} in {e.get('total_ms', 0) / 1000:.1f} s, world "
                        f"{e.get('world_size')}" for e in m["recovered"])
        return (f"failures {done.get('failures')}" + (f", {rec}" if rec else "")
                + ("" if done else ", no done event"))

    def fmt(x, spec="{:.2f}"):
        return "-" if x is None else spec.format(x)
    print()
    print("| run | fault | exit | test accuracy % | vs DDP | vs Sinew | wall s | audit | recovery |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        audit_cell = "-" if "audit_ok" not in r else ("exact" if r["audit_ok"] else "FAILED")
        print(f"| {name} | {r.get('fault') or '-'} | {r['exit_code']} | {fmt(r['test_accuracy'])} | "
              f"{fmt(r['vs_ddp'], '{:+.2f}')} | {fmt(r['vs_sinew'], '{:+.2f}')} | {r['wall_s']:.1f} | "
              f"{audit_cell} | {recovery(r) or '-'} |")

    problems = []
    for name, r in results.items():
        if r["exit_code"] != 0:
            problems.append(f"{name} exited with {r['exit_code']}")
        if r["test_accuracy"] is None:
            problems.append(f"{name}: no 'Test set' line")
        if r.get("audit_ok") is False:
            problems.append(f"{name}: the audit failed ({r['audit']})")
        m = r.get("metrics") or {}
        if r.get("fault") and not (m.get("recovered") and (m.get("done") or {}).get("failures") == 1):
            problems.append(f"{name}: no recovery from the kill in the metrics")
        if "metrics" in r and (m.get("done") or {}).get("world_size") != args.ranks:
            problems.append(f"{name}: ended with {(m.get('done') or {}).get('world_size')} ranks, not {args.ranks} "
                            "(no replacement?)")
        for key, ref in (("vs_ddp", "DDP"), ("vs_sinew", "the failure-free Sinew run")):
            if r.get(key) is not None:
                ok = abs(r[key]) <= args.bar
                print(f"{name}: {r[key]:+.2f} points vs {ref}: {'within' if ok else 'OUTSIDE'} {args.bar} point(s)")
                if not ok:
                    problems.append(f"{name}: {r[key]:+.2f} points vs {ref}")

    report = {"ranks": args.ranks, "epochs": args.epochs, "batch_per_rank": batch, "train_size": train_size,
              "test_size": test_size, "steps": total_steps, "seed": args.seed,
              "script_seed": args.script_seed, "bar_points": args.bar,
              "omp_num_threads": 1, "diff_stat_vs_original": stats or None, "runs": results,
              "problems": problems}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")
    for p in problems:
        print("mnist_port_bench: FAILED:", p)
    if not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
