#!/usr/bin/env python3
"""Sinew against torch.nn.parallel.DistributedDataParallel (gloo) on real PyTorch models, in one run.

    python3 hpc/bench/torch_bench.py [--ranks 4] [--steps 12] [--models resnet18,transformer] [--out DIR]

For each model, the same 4-rank job three times on this machine: DDP over gloo, and Sinew through its Python
package (the ring allreduce: --algorithm gradient_allreduce --allreduce ring), by Job.run's step function and
by the script's own loop (DDP's loop with Sinew's lines: the user's optimizer, a DataLoader over job.sampler()). Both train the same model on
the same synthetic batches (no download), one torch thread per rank, and report:
  - step time (median over the timed steps, after warm-up) and Sinew's as a ratio of DDP's;
  - peak resident memory per rank (the largest over the ranks);
  - for Sinew, how much of the gradient communication ran hidden behind the backward pass
    (1 - exposed / total communication time, from its per-step metrics).
Models: torchvision's ResNet-18 (1x28x28 inputs, 10 classes, strided stem) and a transformer encoder from
torch.nn (6 layers, d=512, 8 heads, a 8 000-word embedding, sequences of 64). Prints a table and writes
torch_bench.json to --out. Run with the venv's python (mpi_scripts/setup.sh installs it).
"""
import argparse
import glob
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def build(name):
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return m
    if name == "vgg16":
        # torchvision's VGG-16 as it is used on CIFAR-sized data: its 13 convolutions on 1x32x32 inputs (five
        # poolings leave 512x1x1) and one linear layer to the 10 classes instead of the 224x224 classifier.
        import torchvision
        m = torchvision.models.vgg16(num_classes=10)
        m.features[0] = nn.Conv2d(1, 64, kernel_size=3, padding=1)
        m.avgpool = nn.Identity()
        m.classifier = nn.Linear(512, 10)
        return m
    if name == "transformer":
        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(8000, 512)
                layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
                self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
                self.head = nn.Linear(512, 10)

            def forward(self, x):
                return self.head(self.encoder(self.embed(x)).mean(1))
        return Encoder()
    raise SystemExit(f"unknown model {name}")


def batches(name, n, batch):
    """n synthetic samples of the model's input and labels."""
    import torch
    g = torch.Generator().manual_seed(1)
    if name == "resnet18":
        x = torch.randn(n, 1, 28, 28, generator=g)
    elif name == "vgg16":
        x = torch.randn(n, 1, 32, 32, generator=g)
    else:
        x = torch.randint(0, 8000, (n, 64), generator=g)
    return x, torch.randint(0, 10, (n,), generator=g)


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_result(args, rank, result):
    with open(os.path.join(os.path.dirname(args.metrics), f"result-{args.impl}-{rank}.json"), "w") as f:
        json.dump(result, f)


def worker(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    total = args.warmup + args.steps
    x, y = batches(args.model, total * args.batch * size, args.batch)
    if args.impl == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=size)
        model = DDP(build(args.model))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        times = []
        for s in range(total):
            idx = torch.arange((s * size + rank) * args.batch, (s * size + rank + 1) * args.batch)
            t = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            times.append((time.perf_counter() - t) * 1e3)
        dist.barrier()
        result = {"rank": rank, "step_ms": times[args.warmup:], "rss_mb": rss_mb()}
        dist.destroy_process_group()
        write_result(args, rank, result)
        return 0
    import sinew
    if args.impl == "loop":
        # The script's own loop (docs/pytorch.md): DDP's loop above with Sinew's four lines, timed the same way.
        from torch.utils.data import DataLoader, TensorDataset
        job = sinew.init(max_steps=total, algorithm="gradient_allreduce", allreduce="ring", progress=False,
                         log_level="warn")
        model = job.wrap(build(args.model), args.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        data = TensorDataset(x, y)
        loader = DataLoader(data, sampler=job.sampler(data), batch_size=args.batch)
        times = []
        for _ in job.epochs(1):
            for xb, yb in loader:
                t = time.perf_counter()
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
                times.append((time.perf_counter() - t) * 1e3)
        write_result(args, job.rank, {"rank": job.rank, "step_ms": times[args.warmup:], "rss_mb": rss_mb()})
        return 0
    from sinew.steps import classifier
    job = sinew.Job(["--max-steps", str(total), "--epochs", "1", "--batch-size", str(args.batch), "--lr", "0.01",
                     "--lr-schedule", "constant", "--warmup-steps", "0", "--algorithm", "gradient_allreduce",
                     "--allreduce", "ring", "--log-every", "1", "--progress", "false", "--metrics", args.metrics,
                     "--log-level", "warn"])
    model = job.wrap(build(args.model), args.model)

    step, _ = classifier(model, x, y)
    summary = job.run(model, len(x), step)
    write_result(args, job.rank, {"rank": job.rank, "rss_mb": rss_mb()})
    job.exit(summary["exit_code"])


def launch(args, impl, model):
    env_sh = os.path.join(ROOT, "mpi_scripts", "env.sh")
    cmd = f'. "{env_sh}" && "$SINEW_MPIRUN" "${{SINEW_MPIRUN_FLAGS[@]}}" -n {args.ranks} -x PYTHONPATH ' \
          f'"{sys.executable}" "{os.path.abspath(__file__)}" --worker {impl} --model {model} --steps {args.steps} ' \
          f'--warmup {args.warmup} --batch {args.batch_of[model]} --port {free_port()} --metrics "{args.metrics}"'
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(args.build, "python")] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=1800)
    files = sorted(glob.glob(os.path.join(os.path.dirname(args.metrics), f"result-{impl}-*.json")))
    results = [json.load(open(f)) for f in files]
    if out.returncode != 0 or len(results) != args.ranks:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit(f"{impl} {model}: exit {out.returncode}, {len(results)} results")
    return results


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=12, help="timed steps per run (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--models", default="resnet18,transformer")
    p.add_argument("--out", default=os.path.join(ROOT, "hpc", "bench", "results"))
    p.add_argument("--build", default=os.environ.get("SINEW_BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--worker", choices=["ddp", "sinew", "loop"])
    p.add_argument("--model")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--metrics", default="")
    args = p.parse_args()
    if args.worker:
        args.impl = args.worker
        return worker(args)

    args.batch_of = {"resnet18": 32, "transformer": 8}
    rows = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            args.metrics = os.path.join(tmp, "metrics.jsonl")
            ddp = launch(args, "ddp", model)
            sinew_res = launch(args, "sinew", model)
            events = [json.loads(l) for l in open(args.metrics) if l.strip()]
            loop = launch(args, "loop", model)
        steps = [e for e in events if "step_ms" in e and "event" not in e and e["step"] > args.warmup]
        ddp_ms = statistics.median(t for r in ddp for t in r["step_ms"])
        sinew_ms = statistics.median(e["step_ms"] for e in steps)
        comm = sum(e["comm_ms"] for e in steps)
        exposed = sum(e["exposed_comm_ms"] for e in steps)
        loop_ms = statistics.median(t for r in loop for t in r["step_ms"])
        row = {"model": model, "ranks": args.ranks, "batch_per_rank": args.batch_of[model],
               "ddp_step_ms": ddp_ms, "sinew_step_ms": sinew_ms, "ratio": sinew_ms / ddp_ms,
               "ddp_rss_mb": max(r["rss_mb"] for r in ddp), "sinew_rss_mb": max(r["rss_mb"] for r in sinew_res),
               "loop_step_ms": loop_ms, "loop_ratio": loop_ms / ddp_ms, "loop_rss_mb": max(r["rss_mb"] for r in loop),
               "sinew_comm_ms": comm / len(steps), "sinew_exposed_comm_ms": exposed / len(steps),
               "hidden": 1 - exposed / comm if comm > 0 else 0.0}
        rows.append(row)
        print(f"{model}: DDP {ddp_ms:.0f} ms, Sinew {sinew_ms:.0f} ms per step ({row['ratio']:.2f}x DDP); "
              f"peak RSS DDP {row['ddp_rss_mb']:.0f} MB, Sinew {row['sinew_rss_mb']:.0f} MB; Sinew's communication "
              f"{row['sinew_comm_ms']:.0f} ms per step, {100 * row['hidden']:.0f} % hidden behind backward; the script's "
              f"own loop {loop_ms:.0f} ms ({row['loop_ratio']:.2f}x DDP), {row['loop_rss_mb']:.0f} MB", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "torch_bench.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "rows": rows}, f, indent=1)
    print()
    print(f"{'model':<12} {'DDP ms':>8} {'Sinew ms':>9} {'ratio':>6} {'loop ms':>8} {'ratio':>6} {'DDP MB':>7} "
          f"{'Sinew MB':>9} {'loop MB':>8} {'hidden':>7}")
    for r in rows:
        print(f"{r['model']:<12} {r['ddp_step_ms']:>8.0f} {r['sinew_step_ms']:>9.0f} {r['ratio']:>6.2f} "
              f"{r['loop_step_ms']:>8.0f} {r['loop_ratio']:>6.2f} {r['ddp_rss_mb']:>7.0f} {r['sinew_rss_mb']:>9.0f} "
              f"{r['loop_rss_mb']:>8.0f} {100 * r['hidden']:>6.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
