#!/usr/bin/env python3
"""DataLoader worker processes in Sinew's own-loop API: throughput and the cost of a resize, on the ImageFolder
example (examples/torch/imagefolder/train.py: ResNet-18, PNG files decoded by PIL in the loader).

    "$SINEW_TORCH_VENV/bin/python" hpc/bench/loader_bench.py [--ranks 3] [--workers 2] [--rounds 3] [--out FILE]

Throughput: the example with --workers K against --workers 0, the same ranks and data, in interleaved rounds
(the order alternates each round, so that a drift of the machine's load weighs on both alike); each run's
samples/s is its RESULT line's (the group's training samples over rank 0's time in the training loops,
evaluation left out; the first epoch includes starting the workers). Medians over --rounds and their ratio.

Resize: one run for each worker setting under the job server's schedule (shrink to half the ranks in epoch 1,
grow back later), with --metrics and a record per step. For each resize: Sinew's own time for it (the event's
"ms": the leave, or spawning and syncing the newcomers), the time from the event to the end of the first step
after it, and the excess of the next --after steps over as many median steps at the new size (what the
loader's restart and the iterations dropped cost beyond the membership change); the iterations dropped are
rank 0's count for the whole run (RESULT "dropped").

Prints markdown tables and writes the figures as JSON (--out, default hpc/bench/results/loader_bench.json).
"""
import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "torch", "imagefolder")


def mpi_env():
    """mpirun, its flags and the build directory, as mpi_scripts/env.sh sets them."""
    out = subprocess.run(["bash", "-c", f". '{ROOT}/mpi_scripts/env.sh'; echo $SINEW_MPIRUN; "
                          "printf '%s\\n' \"${SINEW_MPIRUN_FLAGS[@]}\"; echo $SINEW_BUILD_DIR"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    out = [o for o in out if o]
    if len(out) < 2 or not out[0]:
        raise SystemExit("error: no mpirun found (mpi_scripts/env.sh)")
    return out[0], out[1:-1], out[-1]


def run_job(args, ranks, workers, epochs, sinew_options, log):
    """One job of the example; returns its RESULT (a dict). Its output goes to `log`. The job runs in a session
    of its own, so that a deadline ends mpirun and every rank and worker it started."""
    mpirun, flags, build = args.mpi
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), OMP_NUM_THREADS="1",
               SINEW_OPTIONS=" ".join(["--progress false"] + sinew_options))
    cmd = [mpirun, *flags, "-n", str(ranks), "-x", "SINEW_OPTIONS", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
           args.python, os.path.join(EXAMPLE, "train.py"), "--data", args.data, "--epochs", str(epochs),
           "--batch-size", str(args.batch_size), "--workers", str(workers), "--arch", args.arch]
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                    p.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            raise SystemExit(f"error: a job ran past its {args.timeout} s deadline; its output: {log}")
    results = [json.loads(line[len("RESULT "):]) for line in open(log) if line.startswith("RESULT ")]
    if rc != 0 or len(results) != 1:
        raise SystemExit(f"error: the job exited with {rc} and printed {len(results)} RESULT lines; its output: {log}")
    return results[0]


def default_schedule(args, size):
    """Shrink to half the ranks halfway through epoch 1, grow back 8 steps later (a step counts global batches:
    at the smaller size the steps are smaller)."""
    steps_full = math.ceil(size / (args.ranks * args.batch_size))
    shrink = max(2, steps_full // 2)
    return f"{shrink}:{max(1, args.ranks // 2)},{shrink + 8}:{args.ranks}"


def resize_costs(metrics_path, after):
    """Per resize event of a --metrics file (--log-every 1): its figures (see the module's doc)."""
    lines = [json.loads(l) for l in open(metrics_path) if l.strip()]
    steps = sorted((l for l in lines if "event" not in l and "step_ms" in l), key=lambda l: l["step"])
    changes = [l for l in lines if l.get("event") in ("shrink", "grow")]
    # Steps within `after` of a change, or whose interval spans an epoch's end (the evaluation), are no
    # typical steps of their size.
    near = {c["step"] + k for c in changes for k in range(1, after + 1)}
    typical = {}
    for a, b in zip(steps, steps[1:]):
        if (b["step"] == a["step"] + 1 and b["step"] not in near and a["world_size"] == b["world_size"]
                and a["epoch"] == b["epoch"]):
            typical.setdefault(b["world_size"], []).append(b["unix_time"] - a["unix_time"])
    out = []
    for c in changes:
        following = [s for s in steps if s["step"] > c["step"]][:after]
        median = statistics.median(typical[c["world_size"]]) if c["world_size"] in typical else None
        row = {"event": c["event"], "step": c["step"], "from_world_size": c["from_world_size"],
               "world_size": c["world_size"], "event_ms": c.get("ms"), "median_step_s": median,
               "first_step_s": following[0]["unix_time"] - c["unix_time"] if following else None,
               "excess_s": None}
        if len(following) == after and median is not None and all(s["world_size"] == c["world_size"]
                                                                   for s in following):
            row["excess_s"] = following[-1]["unix_time"] - c["unix_time"] - after * median
        out.append(row)
    return out


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=3, help="ranks of every job (default 3)")
    p.add_argument("--workers", type=int, default=2, help="worker processes compared with none (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the throughput comparison (default 3)")
    p.add_argument("--per-class", type=int, default=60, help="training images per class (default 60)")
    p.add_argument("--epochs", type=int, default=1, help="epochs of a throughput run (default 1; resize runs: 2)")
    p.add_argument("--batch-size", type=int, default=16, help="per rank (default 16)")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--resize-schedule", help="the resize runs' schedule (default: shrink to half, grow back)")
    p.add_argument("--after", type=int, default=3, help="steps after a resize whose excess time is measured")
    p.add_argument("--no-resize", action="store_true", help="measure the throughput only")
    p.add_argument("--timeout", type=int, default=600, help="deadline of a job in seconds (default 600)")
    p.add_argument("--python", default=sys.executable, help="the jobs' python (with torch and torchvision)")
    p.add_argument("--workdir", help="images and logs (default: a temporary directory, removed at the end)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "loader_bench.json"))
    args = p.parse_args()
    if args.ranks < 2 or args.workers < 1 or args.rounds < 1:
        p.error("--ranks >= 2, --workers >= 1 and --rounds >= 1")
    args.mpi = mpi_env()
    work = args.workdir or tempfile.mkdtemp(prefix="sinew-loader-bench-")
    os.makedirs(work, exist_ok=True)
    args.data = os.path.join(work, "images")
    subprocess.run([args.python, os.path.join(EXAMPLE, "make_images.py"), "--out", os.path.join(args.data, "train"),
                    "--per-class", str(args.per_class), "--test-per-class", "20"], check=True)
    size = 10 * args.per_class
    settings = [0, args.workers]

    runs = {w: [] for w in settings}
    for r in range(args.rounds):
        for w in (settings if r % 2 == 0 else settings[::-1]):
            res = run_job(args, args.ranks, w, args.epochs, [], os.path.join(work, f"round{r}-workers{w}.log"))
            runs[w].append(res["samples_per_s"])
            print(f"round {r + 1}/{args.rounds}, workers {w}: {res['samples_per_s']:.1f} samples/s", flush=True)
    median = {w: statistics.median(v) for w, v in runs.items()}
    report = {"ranks": args.ranks, "batch_size": args.batch_size, "train_samples": size, "epochs": args.epochs,
              "arch": args.arch, "rounds": args.rounds,
              "throughput": {str(w): {"samples_per_s": runs[w], "median": median[w]} for w in settings},
              "ratio": median[args.workers] / median[0]}

    if not args.no_resize:
        schedule = args.resize_schedule or default_schedule(args, size)
        report["resize"] = {"schedule": schedule, "epochs": 2, "after": args.after, "runs": {}}
        for w in settings:
            run_dir = os.path.join(work, f"resize-workers{w}")
            os.makedirs(run_dir, exist_ok=True)
            metrics = os.path.join(run_dir, "metrics.jsonl")
            res = run_job(args, args.ranks, w, 2, ["--resize-schedule", schedule, "--metrics", metrics,
                                                "--log-every", "1"], os.path.join(run_dir, "out.log"))
            report["resize"]["runs"][str(w)] = {"dropped": res["dropped"], "samples_per_s": res["samples_per_s"],
                                                "steps": res["steps"], "events": resize_costs(metrics, args.after)}
            print(f"resize run, workers {w}: {res['dropped']} iterations dropped", flush=True)

    print(f"\n### DataLoader workers: {args.ranks} ranks, {size} PNG images, batch {args.batch_size} per rank, "
          f"{args.arch}, {args.epochs} epoch(s), median of {args.rounds}\n")
    print("| workers | samples/s (median) | runs |")
    print("|--:|--:|:--|")
    for w in settings:
        print(f"| {w} | {median[w]:.1f} | {', '.join(f'{v:.1f}' for v in runs[w])} |")
    print(f"\nratio workers={args.workers} / workers=0: {report['ratio']:.2f}")
    if "resize" in report:
        print(f"\n### Resizes (schedule {report['resize']['schedule']}, 2 epochs)\n")
        print(f"| workers | event | step | ranks | event ms | first step after (s) | median step (s) | "
              f"excess of {args.after} steps (s) | dropped (run) |")
        print("|--:|:--|--:|:--|--:|--:|--:|--:|--:|")
        for w, r in report["resize"]["runs"].items():
            for e in r["events"]:
                print(f"| {w} | {e['event']} | {e['step']} | {e['from_world_size']} -> {e['world_size']} | "
                      f"{fmt(e['event_ms'], 0)} | {fmt(e['first_step_s'])} | {fmt(e['median_step_s'])} | "
                      f"{fmt(e['excess_s'])} | {r['dropped']} |")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
