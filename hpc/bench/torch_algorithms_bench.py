#!/usr/bin/env python3
"""Bagua's bandwidth table on PyTorch models: every Sinew algorithm against DDP and its hooks, on the shaped bed.

    sudo "$SINEW_TORCH_VENV/bin/python" hpc/bench/torch_algorithms_bench.py \\
        [--rates unlimited,1gbit,100mbit] [--models resnet18,vgg16,transformer] [--steps 3] [--slow-steps 2] \\
        [--only NAME,...] [--out DIR]

On the test bed of hpc/net/ (4 network namespaces, one rank each, every link shaped to the rate with tc tbf),
for each rate and model, one short training run per configuration, all in one run:
  - compute-only: the 4 ranks each train the same model on their own at the same time, with no communication
    at all (the limit every algorithm approaches; the 4 ranks share this machine's cores as in every run);
  - Sinew, through its Python package (job.run), with every algorithm: gradient_allreduce over MPI and over
    Sinew's ring, ByteGrad 8 and 4 bits (error feedback), PowerSGD (rank 4), QAdam, decentralized,
    low-precision decentralized, async, auto;
  - the peers: torch.nn.parallel.DistributedDataParallel over gloo; DDP with the fp16 compression hook; DDP with
    the PowerSGD hook (rank 4, the same warm-up as Sinew's); DDP with torch's ZeroRedundancyOptimizer.
Models (torch_bench.build): torchvision's ResNet-18 (1x28x28, batch 32 per rank), VGG-16 (1x32x32, CIFAR-style
classifier, batch 16) and a transformer encoder from torch.nn (6 layers, d=512, an 8 000-word embedding,
8 sequences of 64 tokens); synthetic inputs of those shapes (nothing is downloaded). Step time: median over the
timed steps after the warm-up (Sinew's from its per-step metrics, rank 0; the peers' from rank 0's clock);
samples/s = 4 x batch / step time; bytes each host put on the wire per step (eth0 counters).

Writes DIR/torch_algorithms.json (default hpc/bench/results), prints a table per rate and the goals of issue 41
checked; hpc/bench/plot_torch_algorithms.py draws docs/img/torch_algorithms_<model>.png from the JSON. Needs root
(network namespaces), the build (mpi_scripts/build.sh, with the Python package) and the torch venv.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NET = os.path.join(ROOT, "hpc", "net")
sys.path.insert(0, HERE)
import torch_bench  # noqa: E402  (the models and their synthetic inputs, shared with torch_bench.py)

RANKS = 4
BATCH = {"resnet18": 32, "vgg16": 16, "transformer": 8}
POWERSGD_RANK = 4
WARMUP_ALGO = 2  # PowerSGD's and QAdam's full-precision warm-up steps (within the timed run's warm-up)

# name -> Sinew options (the run's common options are added by the worker)
SINEW = {
    "allreduce-mpi": ["--algorithm", "gradient_allreduce", "--allreduce", "mpi"],
    "allreduce-ring": ["--algorithm", "gradient_allreduce", "--allreduce", "ring"],
    "bytegrad": ["--algorithm", "bytegrad", "--error-feedback", "true"],
    "bytegrad-4bit": ["--algorithm", "bytegrad", "--error-feedback", "true", "--bytegrad-bits", "4"],
    "powersgd": ["--algorithm", "powersgd", "--powersgd-rank", str(POWERSGD_RANK),
                 "--powersgd-warmup-steps", str(WARMUP_ALGO)],
    # A timing run with a 2-step warm-up (Bagua's is 100): the frozen variances are those of the first two
    # steps, and Adam's steps on VGG-16 (no BatchNorm) grew without bound from lr 1e-4 up, in Sinew as in an
    # exact torch emulation of the update (no quantisation). The step's cost does not depend on the values.
    "qadam": ["--algorithm", "qadam", "--optimizer", "adam", "--lr", "1e-5",
              "--qadam-warmup-steps", str(WARMUP_ALGO)],
    "decentralized": ["--algorithm", "decentralized", "--peer-selection", "shift_one"],
    "low-precision-decentralized": ["--algorithm", "low_precision_decentralized"],
    "async": ["--algorithm", "async", "--sync-interval-ms", "100"],
    # auto's PowerSGD or QAdam with the same short warm-up as theirs above (its defaults are 10 and 100 exact
    # steps, which a short timing run would measure instead)
    "auto": ["--algorithm", "auto", "--powersgd-warmup-steps", str(WARMUP_ALGO),
             "--qadam-warmup-steps", str(WARMUP_ALGO)],
}
# The configurations whose first WARMUP_ALGO steps are exact: their timed steps start after those.
WARMING = {"powersgd", "qadam", "auto", "ddp-powersgd"}
PEERS = ["ddp", "ddp-fp16", "ddp-powersgd", "ddp-zero"]
ALL = ["compute-only"] + list(SINEW) + PEERS


# ---- one rank of one run ---------------------------------------------------------------------------------------

def worker(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    rank, world = args.rank, args.world
    if args.name in SINEW:  # started by mpirun
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    batch = BATCH[args.model]
    total = args.warmup + args.steps
    x, y = torch_bench.batches(args.model, total * batch * max(world, 1), batch)
    if args.name in SINEW:
        import sinew
        from sinew.steps import classifier
        lr = [] if "--lr" in SINEW[args.name] else ["--lr", "0.01"]
        opts = ["--max-steps", str(total), "--epochs", "1", "--batch-size", str(batch), "--lr-schedule",
                "constant", "--warmup-steps", "0", "--log-every", "1", "--progress", "false", "--metrics",
                os.path.join(args.dir, "metrics.jsonl"), "--log-level", "warn"] + lr + SINEW[args.name]
        job = sinew.Job(opts)
        model = job.wrap(torch_bench.build(args.model), args.model)

        step, _ = classifier(model, x, y)
        summary = job.run(model, len(x), step)
        job.exit(summary["exit_code"])
    model = torch_bench.build(args.model)
    if args.name == "compute-only":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=rank, world_size=world)
        if args.name == "ddp-powersgd":
            # One bucket: with several, the hook's second allreduce (issued from the first's completion
            # callback) races with the next bucket's first one, gloo sees them in different orders on different
            # ranks and aborts ("op.preamble.length <= op.nbytes"; hpc/bench/torch_ddp_epoch.py). So over gloo
            # torch's PowerSGD overlaps nothing with backward.
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 40
            model = DDP(model, bucket_cap_mb=1 << 20)
        else:
            model = DDP(model)
        if args.name == "ddp-fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif args.name == "ddp-powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                                start_powerSGD_iter=WARMUP_ALGO)
            model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        if args.name == "ddp-zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01,
                                          momentum=0.9)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    me = 0 if args.name == "compute-only" else rank  # alone: its own world of one
    for s in range(total):
        idx = torch.arange((s * world + me) * batch, (s * world + me + 1) * batch)
        t = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        times.append((time.perf_counter() - t) * 1e3)
    if args.name != "compute-only":
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    with open(os.path.join(args.dir, f"rank{rank}.json"), "w") as f:
        json.dump({"step_ms": times[args.warmup:]}, f)
    return 0


# ---- the driver ------------------------------------------------------------------------------------------------

def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def tx_total():
    out = sh([os.path.join(NET, "txbytes.sh"), str(RANKS)]).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())


def rate_bits(rate):
    """The link rate in bit/s of a testbed.sh rate ("100mbit", "1gbit"); unlimited: infinite."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, factor in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * factor
    return float("inf")


def run_one(args, rate, model, name):
    """One configuration on the bed as it is: its row."""
    # Warm-up: the algorithms' exact steps, then one more (the first steps allocate); timed steps: fewer on
    # slow links, where one step of an exact allreduce takes seconds and varies by little.
    warmup = WARMUP_ALGO + args.warmup if name in WARMING else args.warmup
    steps = args.slow_steps if rate_bits(rate) <= 100e6 else args.steps
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)
        me = [sys.executable, os.path.abspath(__file__), "--worker", "--name", name, "--model", model,
              "--steps", str(steps), "--warmup", str(warmup), "--dir", d]
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0",
                   PYTHONPATH=os.pathsep.join([os.path.join(args.build, "python")] +
                                              [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        before = tx_total()
        t0 = time.time()
        if name in SINEW:
            cmd = [os.path.join(NET, "mpirun.sh"), str(RANKS), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "--"] + me
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            if out.returncode != 0:
                sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
                raise SystemExit(f"{name} {model} at {rate}: exit {out.returncode}")
            events = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl")) if line.strip()]
            timed = [e for e in events if "step_ms" in e and "event" not in e and e["step"] > warmup]
            step_ms = statistics.median(e["step_ms"] for e in timed)
            chosen = [e["chosen"] for e in events if e.get("event") == "algorithm"]
        else:
            port = 20000 + (os.getpid() + int(t0)) % 20000  # a fresh port per run (a reused one hung gloo once)
            procs = []
            for k in range(RANKS):
                extra = ["--rank", str(k), "--world", str(RANKS), "--master", f"10.77.0.1:{port}"]
                if name == "compute-only":
                    extra = ["--rank", str(k), "--world", "1"]
                procs.append(subprocess.Popen(["ip", "netns", "exec", f"sinew-h{k + 1}", "timeout", str(args.timeout)]
                                              + me + extra, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
            failed = []
            for k, p in enumerate(procs):
                so, se = p.communicate()
                if p.returncode != 0:
                    failed.append(f"rank {k}: exit {p.returncode}\n{se[-2000:]}")
            if failed:
                raise SystemExit(f"{name} {model} at {rate}:\n" + "\n".join(failed))
            # compute-only: every rank's own median (they run alone); the peers: rank 0's clock
            files = range(RANKS) if name == "compute-only" else [0]
            step_ms = statistics.median(
                statistics.median(json.load(open(os.path.join(d, f"rank{k}.json")))["step_ms"]) for k in files)
            chosen = []
        wire = (tx_total() - before) / RANKS / (warmup + steps)
    row = {"model": model, "rate": rate, "name": name, "impl": "sinew" if name in SINEW else "torch",
           "batch_per_rank": BATCH[model], "warmup_steps": warmup, "timed_steps": steps, "step_ms": step_ms,
           "samples_per_s": RANKS * BATCH[model] / (step_ms / 1e3), "wire_bytes_per_step": wire,
           "run_s": time.time() - t0}
    if chosen:
        row["chosen"] = chosen[-1]
    return row


def goals(rows):
    """Issue 41's performance goals, measured in this run: (text, met) per goal that has its figures."""
    at = {(r["rate"], r["model"], r["name"]): r for r in rows}
    out = []
    for model in ("resnet18", "vgg16"):
        rate = "100mbit"
        sinew = [r for (rt, m, n), r in at.items() if rt == rate and m == model and r["impl"] == "sinew"]
        compute, psgd, ddp = (at.get((rate, model, n)) for n in ("compute-only", "ddp-powersgd", "ddp"))
        if not sinew or not compute:
            continue
        best = min(sinew, key=lambda r: r["step_ms"])
        ratio = best["step_ms"] / compute["step_ms"]
        out.append((f"{model} at 100 Mbit/s: best Sinew ({best['name']}) {best['step_ms']:.0f} ms per step = "
                    f"{ratio:.2f}x the compute-only limit (goal <= 1.25x)", ratio <= 1.25))
        if psgd:
            r = best["samples_per_s"] / psgd["samples_per_s"]
            out.append((f"{model} at 100 Mbit/s: {r:.2f}x DDP with the PowerSGD hook's samples/s (goal >= 1.2x)",
                        r >= 1.2))
        if ddp:
            out.append((f"{model} at 100 Mbit/s: {best['samples_per_s'] / ddp['samples_per_s']:.2f}x plain DDP's "
                        f"samples/s", True))
    for (rate, model, name), r in sorted(at.items()):
        if rate == "unlimited" and name == "allreduce-ring" and (rate, model, "ddp") in at:
            x = r["samples_per_s"] / at[(rate, model, "ddp")]["samples_per_s"]
            out.append((f"{model} unshaped: Sinew ring {x:.2f}x DDP's samples/s (goal >= 1.0x)", x >= 1.0))
    return out


def table(rows, rate):
    print(f"\n## {rate}")
    print(f"{'model':<12} {'configuration':<30} {'step ms':>8} {'samples/s':>10} {'vs DDP':>7} {'vs compute':>10} "
          f"{'MB/step':>8}")
    at = {(r["model"], r["name"]): r for r in rows if r["rate"] == rate}
    for (model, name), r in at.items():
        ddp, comp = at.get((model, "ddp")), at.get((model, "compute-only"))
        vs_ddp = f"{r['samples_per_s'] / ddp['samples_per_s']:.2f}x" if ddp else "-"
        vs_comp = f"{r['step_ms'] / comp['step_ms']:.2f}x" if comp else "-"
        label = name + (f" ({r['chosen']})" if "chosen" in r else "")
        print(f"{model:<12} {label:<30} {r['step_ms']:8.0f} {r['samples_per_s']:10.1f} {vs_ddp:>7} {vs_comp:>10} "
              f"{r['wire_bytes_per_step'] / 1e6:8.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="unlimited,1gbit,100mbit")
    p.add_argument("--models", default="resnet18,vgg16,transformer")
    p.add_argument("--only", default="", help="configurations to run (names as in the table), default all")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (after the warm-up)")
    p.add_argument("--slow-steps", type=int, default=2, help="timed steps per run at 100 Mbit/s and below")
    p.add_argument("--warmup", type=int, default=1,
                   help=f"untimed steps per run (after the {WARMUP_ALGO} exact ones of PowerSGD, QAdam, auto)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--out", default=os.path.join(ROOT, "hpc", "bench", "results"))
    p.add_argument("--build", default=os.environ.get("SINEW_BUILD_DIR", os.path.join(ROOT, "build")))
    # a worker's own arguments
    p.add_argument("--worker", action="store_true")
    p.add_argument("--name", default="")
    p.add_argument("--model", default="")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--master", default="")
    p.add_argument("--dir", default="")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.warmup < 1 or args.steps < 1 or args.slow_steps < 1:
        raise SystemExit("--warmup, --steps and --slow-steps must be at least 1")
    names = [n for n in args.only.split(",") if n] or ALL
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise SystemExit(f"unknown configuration {unknown[0]}: one of {', '.join(ALL)}")
    if os.geteuid() != 0:
        raise SystemExit("the bed needs root (network namespaces): run with sudo")
    if not os.path.exists(os.path.join(args.build, "python", "sinew")):
        raise SystemExit(f"the sinew package is not built in {args.build}/python: run mpi_scripts/build.sh")
    rows, failures = [], []
    t_start = time.time()
    testbed = os.path.join(NET, "testbed.sh")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "torch_algorithms.json")

    def save(complete, checked=()):
        # After every run, so that an interrupted benchmark leaves what it measured, marked incomplete.
        with open(path + ".tmp", "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "ranks": RANKS,
                       "steps": args.steps, "slow_steps": args.slow_steps, "warmup": args.warmup, "wall_s": time.time() - t_start,
                       "complete": complete, "rows": rows, "failures": failures,
                       "goals": [{"goal": t, "met": ok} for t, ok in checked]}, f, indent=1)
        os.replace(path + ".tmp", path)

    try:
        for rate in args.rates.split(","):
            sh([testbed, "down"])
            sh([testbed, "up", str(RANKS), rate])
            for model in args.models.split(","):
                for name in names:
                    try:
                        row = run_one(args, rate, model, name)
                    except (SystemExit, subprocess.TimeoutExpired) as e:  # one configuration, not the table
                        print(f"{rate:>9} {model:<12} {name:<28} FAILED: {str(e).splitlines()[0]}", flush=True)
                        failures.append({"model": model, "rate": rate, "name": name, "error": str(e)[-2000:]})
                        save(False)
                        continue
                    rows.append(row)
                    save(False)
                    print(f"{rate:>9} {model:<12} {name:<28} {row['step_ms']:8.0f} ms/step "
                          f"{row['samples_per_s']:8.1f} samples/s ({row['run_s']:.0f} s)", flush=True)
    finally:
        subprocess.run([testbed, "down"], capture_output=True)
    for rate in args.rates.split(","):
        table(rows, rate)
    checked = goals(rows)
    if checked:
        print("\n## goals (issue 41)")
        for text, ok in checked:
            print(f"  [{'met' if ok else 'NOT met'}] {text}")
    save(True, checked)
    print(f"\n{len(rows)} runs in {time.time() - t_start:.0f} s; {path}")
    for f in failures:
        print(f"FAILED: {f['name']} {f['model']} at {f['rate']}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
