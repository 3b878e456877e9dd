#!/usr/bin/env python3
"""Accuracy side by side: ResNet-18 on Fashion-MNIST, every Sinew algorithm against DDP, in one run.

    sudo "$SINEW_TORCH_VENV/bin/python" hpc/bench/torch_accuracy_bench.py [--epochs 1] [--only NAME,...] \\
        [--async-rate 100mbit] [--out DIR]

The model of the throughput table (hpc/bench/torch_algorithms_bench.py, torch_bench.build("resnet18"):
torchvision's ResNet-18 with a one-channel 7x7 stride-2 stem, 10 classes, seed 0), trained for --epochs on
the 60 000 training images of Fashion-MNIST (Debian's dataset-fashion-mnist, nothing downloaded) by 4 ranks,
batch 32 per rank (global 128), one torch thread per rank, then evaluated on the 10 000 test images:
  - DDP over gloo (SGD, momentum 0.9, weight decay 5e-4, lr 0.05, Sinew's schedule: linear warm-up over 50
    steps, then cosine to 0), the reference; DDP with the PowerSGD hook (rank 4, 10 exact steps), torch's
    best at low bandwidth; DDP with Adam (lr 1e-3), QAdam's reference;
  - Sinew through its Python package with the same hyper-parameters and every algorithm: ring allreduce,
    ByteGrad 8 and 4 bits (error feedback), PowerSGD (rank 4, 10 exact steps), QAdam (Adam lr 1e-3, 100
    exact steps), decentralized (shift_one), low-precision decentralized, async (every 100 ms), auto.
The synchronous algorithms' accuracy does not depend on the link, so they run on this machine's own
transport (shared memory, full bandwidth). Async's does (the slower the link, the staler the averages), so
it runs twice: here, and on the shaped test bed (hpc/net/, 4 hosts, one rank each) at --async-rate, the
rate its throughput is claimed at. Same seed for the model's initialisation; the data order is each
runtime's own (Sinew's sampler, torch's DistributedSampler), the global batch and the schedule are the same.

Writes DIR/torch_accuracy.json (default hpc/bench/results) after every run and prints a table: test accuracy
and its difference from DDP's (from DDP-Adam's for QAdam), wall time. Needs root only for the bed (the
async run at --async-rate; --async-rate none skips it), the build (mpi_scripts/build.sh) and the torch venv.
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NET = os.path.join(ROOT, "hpc", "net")
sys.path.insert(0, HERE)
import torch_bench  # noqa: E402  (the model, shared with the throughput table)

RANKS = 4
BATCH = 32
LR, ADAM_LR, WARMUP, MOMENTUM, WEIGHT_DECAY, SEED = 0.05, 1e-3, 50, 0.9, 5e-4, 1
FMNIST = "/usr/share/datasets/fashion-mnist"

SINEW = {
    "allreduce-ring": ["--algorithm", "gradient_allreduce", "--allreduce", "ring"],
    "bytegrad": ["--algorithm", "bytegrad", "--error-feedback", "true"],
    "bytegrad-4bit": ["--algorithm", "bytegrad", "--error-feedback", "true", "--bytegrad-bits", "4"],
    "powersgd": ["--algorithm", "powersgd", "--powersgd-rank", "4", "--powersgd-warmup-steps", "10"],
    "qadam": ["--algorithm", "qadam", "--optimizer", "adam", "--lr", str(ADAM_LR), "--qadam-warmup-steps", "100"],
    "decentralized": ["--algorithm", "decentralized", "--peer-selection", "shift_one"],
    "low-precision-decentralized": ["--algorithm", "low_precision_decentralized"],
    "async": ["--algorithm", "async", "--sync-interval-ms", "100"],
    "auto": ["--algorithm", "auto"],
}
PEERS = ["ddp", "ddp-powersgd", "ddp-adam"]
REFERENCE = {"qadam": "ddp-adam"}  # the others: ddp


def worker_sinew(args, impl):
    import torch
    import sinew
    from sinew.steps import classifier
    torch.set_num_threads(1)
    lr = [] if "--lr" in SINEW[impl] else ["--lr", str(LR)]
    job = sinew.Job(["--epochs", str(args.epochs), "--batch-size", str(BATCH), "--momentum", str(MOMENTUM),
                     "--weight-decay", str(WEIGHT_DECAY), "--lr-schedule", "cosine", "--warmup-steps", str(WARMUP),
                     "--seed", str(SEED), "--log-every", "100", "--progress", "false", "--log-level", "warn"]
                    + lr + SINEW[impl])
    train_x, train_y, test_x, test_y, _ = job.dataset()
    model = job.wrap(torch_bench.build("resnet18"), "resnet18")
    step, evaluate = classifier(model, train_x, train_y, test_x, test_y)
    summary = job.run(model, len(train_x), step, evaluate, len(test_x))
    if job.rank == 0:
        with open(os.path.join(args.dir, "result.json"), "w") as f:
            json.dump({"test_accuracy": summary["test_accuracy"], "steps": summary["steps"]}, f)
    job.exit(summary["exit_code"])


def worker_ddp(args, impl):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch_ddp_step import load_idx
    torch.set_num_threads(1)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    x, y = load_idx(f"{FMNIST}/train-images-idx3-ubyte.gz", f"{FMNIST}/train-labels-idx1-ubyte.gz")
    tx, ty = load_idx(f"{FMNIST}/t10k-images-idx3-ubyte.gz", f"{FMNIST}/t10k-labels-idx1-ubyte.gz")
    x, tx = x.view(-1, 1, 28, 28), tx.view(-1, 1, 28, 28)
    if impl == "ddp-powersgd":
        # One bucket: with several, the hook's second allreduce races with the next bucket's first over gloo
        # and the ranks abort ("Connection reset by peer"; the same in torch_algorithms_bench.py).
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 40
        model = DDP(torch_bench.build("resnet18"), bucket_cap_mb=1 << 20)
    else:
        model = DDP(torch_bench.build("resnet18"))
    if impl == "ddp-powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                            start_powerSGD_iter=10)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    if impl == "ddp-adam":
        opt = torch.optim.Adam(model.parameters(), lr=ADAM_LR, weight_decay=WEIGHT_DECAY)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    per_rank = math.ceil(len(x) / world)
    steps_per_epoch = math.ceil(per_rank / BATCH)
    total = steps_per_epoch * args.epochs

    def lr_factor(step):  # Sinew's schedule (src/sinew/optim/lr_schedule.cpp): linear warm-up, cosine to 0
        if step < WARMUP:
            return (step + 1) / WARMUP
        t, span = step - WARMUP, max(total - WARMUP, 1)
        return 0.0 if t >= span else 0.5 * (1 + math.cos(math.pi * t / span))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    step = 0
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(SEED + epoch)  # torch's DistributedSampler, shuffled, padded
        order = torch.randperm(len(x), generator=g)
        order = torch.cat([order, order[:per_rank * world - len(x)]])[rank::world]
        model.train()
        for b in range(steps_per_epoch):
            idx = order[b * BATCH:(b + 1) * BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            sched.step()
            step += 1
    if rank == 0:
        model.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, len(tx), 500):
                correct += int((model.module(tx[s:s + 500]).argmax(1) == ty[s:s + 500]).sum())
        with open(os.path.join(args.dir, "result.json"), "w") as f:
            json.dump({"test_accuracy": correct / len(tx), "steps": step}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(args, name, impl, rate):
    """One training run; its row."""
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)
        me = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--epochs", str(args.epochs), "--dir", d,
              "--port", str(free_port())]
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
                   PYTHONPATH=os.pathsep.join([os.path.join(args.build, "python"), HERE] +
                                              [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        if rate == "local":
            env_sh = os.path.join(ROOT, "mpi_scripts", "env.sh")
            cmd = ["bash", "-c", f'. "{env_sh}" && exec "$SINEW_MPIRUN" "${{SINEW_MPIRUN_FLAGS[@]}}" -n {RANKS} '
                   f'-x PYTHONPATH -x OMP_NUM_THREADS -x GLOO_SOCKET_IFNAME "$@"', "mpirun"] + me
        else:
            cmd = [os.path.join(NET, "mpirun.sh"), str(RANKS), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "--"] + me
        t0 = time.time()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        path = os.path.join(d, "result.json")
        if out.returncode != 0 or not os.path.exists(path):
            sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
            raise SystemExit(f"{name}: exit {out.returncode}")
        result = json.load(open(path))
    return {"name": name, "impl": "sinew" if impl in SINEW else "torch", "rate": rate,
            "test_accuracy": result["test_accuracy"], "steps": result["steps"], "run_s": time.time() - t0}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--only", default="", help="runs (names as in the table), default all")
    p.add_argument("--async-rate", default="100mbit", help="the bed's rate for async's second run (none: skip)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    p.add_argument("--out", default=os.path.join(ROOT, "hpc", "bench", "results"))
    p.add_argument("--build", default=os.environ.get("SINEW_BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--worker", default="")
    p.add_argument("--dir", default="")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    if args.worker in SINEW:
        return worker_sinew(args, args.worker)
    if args.worker in PEERS:
        return worker_ddp(args, args.worker)
    if args.worker:
        raise SystemExit(f"unknown worker {args.worker}")
    if args.epochs < 1:
        raise SystemExit("--epochs must be at least 1")
    runs = [(n, n, "local") for n in PEERS + list(SINEW)]
    if args.async_rate != "none":
        runs.append((f"async@{args.async_rate}", "async", args.async_rate))
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in [r[0] for r in runs]]
    if unknown:
        raise SystemExit(f"unknown run {unknown[0]}: one of {', '.join(r[0] for r in runs)}")
    runs = [r for r in runs if not names or r[0] in names]
    if any(rate != "local" for _, _, rate in runs) and os.geteuid() != 0:
        raise SystemExit("the async run on the bed needs root (network namespaces): sudo, or --async-rate none")
    if not os.path.exists(os.path.join(args.build, "python", "sinew")):
        raise SystemExit(f"the sinew package is not built in {args.build}/python: run mpi_scripts/build.sh")
    for f in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        if not os.path.exists(os.path.join(FMNIST, f)):
            raise SystemExit(f"{FMNIST}/{f} is missing: apt-get install dataset-fashion-mnist (mpi_scripts/setup.sh)")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "torch_accuracy.json")
    rows, failures, t_start = [], [], time.time()
    if names and os.path.exists(path):  # --only: these runs again, the file's others kept
        with open(path) as f:
            rows = [r for r in json.load(f)["rows"] if r["name"] not in names]

    def save(complete):
        with open(path + ".tmp", "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "ranks": RANKS,
                       "batch_per_rank": BATCH, "epochs": args.epochs, "wall_s": time.time() - t_start,
                       "complete": complete, "rows": rows, "failures": failures}, f, indent=1)
        os.replace(path + ".tmp", path)

    testbed = os.path.join(NET, "testbed.sh")
    try:
        for name, impl, rate in runs:
            if rate != "local":
                subprocess.run([testbed, "down"], capture_output=True)
                subprocess.run([testbed, "up", str(RANKS), rate], check=True, capture_output=True)
            try:
                row = run_one(args, name, impl, rate)
            except (SystemExit, subprocess.TimeoutExpired) as e:
                print(f"{name:<30} FAILED: {str(e).splitlines()[0]}", flush=True)
                failures.append({"name": name, "error": str(e)[-2000:]})
                save(False)
                continue
            finally:
                if rate != "local":
                    subprocess.run([testbed, "down"], capture_output=True)
            rows.append(row)
            save(False)
            print(f"{name:<30} {100 * row['test_accuracy']:6.2f} % ({row['steps']} steps, {row['run_s']:.0f} s)",
                  flush=True)
    finally:
        save(False)
    at = {r["name"]: r for r in rows}
    print(f"\n{'run':<30} {'test accuracy':>13} {'vs reference':>13} {'wall s':>7}")
    for r in rows:
        ref = at.get(REFERENCE.get(r["name"].split("@")[0], "ddp"))
        diff = f"{100 * (r['test_accuracy'] - ref['test_accuracy']):+.2f} ({ref['name']})" if ref and ref is not r \
            else "-"
        print(f"{r['name']:<30} {100 * r['test_accuracy']:12.2f}% {diff:>13} {r['run_s']:7.0f}")
    save(not failures)
    print(f"\n{len(rows)} runs in {time.time() - t_start:.0f} s; {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
