#!/usr/bin/env python3
"""Sharded optimizer state on a PyTorch transformer with AdamW: Sinew against DDP, ZeroRedundancyOptimizer and
FSDP2, in one run.

    python3 hpc/bench/shard_torch_bench.py [--ranks 4] [--steps 4] [--layers 8] [--width 1024] [--vocab 32000]

The same 4-rank job (a torch.nn transformer encoder, AdamW with weight decay on the matrices only, the same
synthetic token batches, one torch thread per rank) as the script's own loop, each way:
  ddp        DistributedDataParallel over gloo, torch.optim.AdamW (the whole state on every rank);
  zero       DDP + torch.distributed.optim.ZeroRedundancyOptimizer(AdamW) (ZeRO-1, no redundancy);
  fsdp2      torch.distributed.fsdp.fully_shard on the embedding, per encoder layer and the root, over gloo on the
             CPU (ZeRO-3);
  sinew      Sinew's own loop (sinew.init, job.wrap, job.sampler), --shard none;
  sinew-r1   --shard optimizer --shard-replicas 1;
  sinew-r2   --shard optimizer --shard-replicas 2 (each shard on two ranks: a kill is recovered in place);
  sinew-g1, sinew-g2   --shard gradients (ZeRO-2: the gradients reduce-scattered to the holders), R = 1 and 2;
  sinew-p1, sinew-p2   --shard parameters (ZeRO-3), the same units as FSDP2's (job.wrap(units=[embedding, *layers])),
             R = 1 and 2, each unit's gather started while the unit before it runs (shard_prefetch=1);
  sinew-p1-pf0, sinew-p2-pf0   the same without the prefetch (shard_prefetch=0).
Reports the peak resident memory per rank (the largest over the ranks), over the whole run and until the last
step (Sinew's sharded parameters are gathered whole when job.epochs() ends, for the script's use after training),
as a ratio of DDP's, and the median step time (after --warmup steps), as a ratio of DDP's; and per step the page
faults and the CPU time the kernel spent for the rank (getrusage: a released range written again is a fault per
page). A way that cannot run here is reported with its error, not left out. Writes shard_torch_bench.json to --out. Run with the venv's python (mpi_scripts/setup.sh installs it).
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
WAYS = ["ddp", "zero", "fsdp2", "sinew", "sinew-r1", "sinew-r2", "sinew-g1", "sinew-g2", "sinew-p1", "sinew-p2",
        "sinew-p1-pf0", "sinew-p2-pf0"]
SEQ = 32


def build(a):
    import torch
    import torch.nn as nn
    torch.manual_seed(0)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(a.vocab, a.width)
            self.layers = nn.ModuleList(nn.TransformerEncoderLayer(a.width, 8, 4 * a.width, dropout=0.0,
                                                                   batch_first=True) for _ in range(a.layers))
            self.head = nn.Linear(a.width, 10)

        def forward(self, x):
            h = self.embed(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h.mean(1))
    return Encoder()


def adamw(params_of, lr=1e-4):
    import torch
    ps = list(params_of)
    return [{"params": [p for p in ps if p.ndim > 1], "weight_decay": 0.01},
            {"params": [p for p in ps if p.ndim <= 1], "weight_decay": 0.0}], torch.optim.AdamW, {"lr": lr}


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(a):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    total = a.warmup + a.steps
    # torch.optim's first optimizer imports much of torch (dynamo's modules): before the baseline, in every way.
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, a.vocab, (total * a.batch * size, SEQ), generator=g)
    y = torch.randint(0, 10, (len(x),), generator=g)
    times = []
    kernel = []  # per step: (page faults, ms of CPU time in the kernel) of this rank
    in_training = []

    def timed_loop(model, opt, batches):
        for xb, yb in batches:
            t = time.perf_counter()
            u = resource.getrusage(resource.RUSAGE_SELF)
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            times.append((time.perf_counter() - t) * 1e3)
            v = resource.getrusage(resource.RUSAGE_SELF)
            kernel.append((v.ru_minflt + v.ru_majflt - u.ru_minflt - u.ru_majflt, (v.ru_stime - u.ru_stime) * 1e3))
        # The peak so far: training's, before what ends it (Sinew's end of job.epochs() gathers a model with
        # sharded parameters whole, for what the script does after training; DDP's is whole all along).
        in_training.append(rss_mb())

    if a.worker in ("ddp", "zero", "fsdp2"):
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=size)
        base = resident_mb()
        net = build(a)
        if a.worker == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            fully_shard(net.embed)
            for layer in net.layers:
                fully_shard(layer)
            model = fully_shard(net)
            groups, cls, kw = adamw(model.parameters())
            opt = cls(groups, **kw)
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            groups, cls, kw = adamw(model.parameters())
            if a.worker == "zero":
                from torch.distributed.optim import ZeroRedundancyOptimizer
                opt = ZeroRedundancyOptimizer(groups, optimizer_class=cls, **kw)
            else:
                opt = cls(groups, **kw)
        batches = ((x[i:i + a.batch], y[i:i + a.batch])
                   for i in ((s * size + rank) * a.batch for s in range(total)))
        timed_loop(model, opt, batches)
        dist.barrier()
        dist.destroy_process_group()
        out = {"rank": rank, "step_ms": times[a.warmup:], "rss_mb": rss_mb(), "train_rss_mb": in_training[-1],
               "base_mb": base, "kernel": kernel[a.warmup:]}
    else:
        import sinew
        from torch.utils.data import DataLoader, TensorDataset
        shard = {"sinew": {}, "sinew-r1": {"shard": "optimizer", "shard_replicas": 1},
                 "sinew-r2": {"shard": "optimizer", "shard_replicas": 2},
                 "sinew-g1": {"shard": "gradients", "shard_replicas": 1},
                 "sinew-g2": {"shard": "gradients", "shard_replicas": 2},
                 "sinew-p1": {"shard": "parameters", "shard_replicas": 1},
                 "sinew-p2": {"shard": "parameters", "shard_replicas": 2},
                 "sinew-p1-pf0": {"shard": "parameters", "shard_replicas": 1, "shard_prefetch": 0},
                 "sinew-p2-pf0": {"shard": "parameters", "shard_replicas": 2, "shard_prefetch": 0}}[a.worker]
        # With a checkpoint directory, as a job has: the end checkpoint (the only one here) is what lets ZeRO-3 give
        # its optimizer state back before the model is gathered whole at the end.
        job = sinew.init(max_steps=total, progress=False, log_level="warn",
                         checkpoint_dir=os.path.join(a.dir, f"ckpt-{a.worker}"), **shard)
        base = resident_mb()
        net = build(a)
        units = {"units": [net.embed, *net.layers]} if a.worker.startswith("sinew-p") else {}
        model = job.wrap(net, "transformer", **units)
        groups, cls, kw = adamw(model.parameters())
        opt = cls(groups, **kw)
        data = TensorDataset(x, y)
        loader = DataLoader(data, sampler=job.sampler(data), batch_size=a.batch)
        for _ in job.epochs(1):
            timed_loop(model, opt, loader)
        rank = job.rank
        out = {"rank": rank, "step_ms": times[a.warmup:], "rss_mb": rss_mb(), "train_rss_mb": in_training[-1],
               "base_mb": base, "kernel": kernel[a.warmup:]}
    with open(os.path.join(a.dir, f"result-{a.worker}-{rank}.json"), "w") as f:
        json.dump(out, f)
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a, way, d):
    env_sh = os.path.join(ROOT, "mpi_scripts", "env.sh")
    cmd = (f'. "{env_sh}" && "$SINEW_MPIRUN" "${{SINEW_MPIRUN_FLAGS[@]}}" -n {a.ranks} -x PYTHONPATH '
           f'"{sys.executable}" "{os.path.abspath(__file__)}" --worker {way} --steps {a.steps} --warmup {a.warmup} '
           f'--batch {a.batch} --layers {a.layers} --width {a.width} --vocab {a.vocab} --port {free_port()} '
           f'--dir "{d}"')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(a.build, "python")] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=1800)
    res = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, f"result-{way}-*.json")))]
    if out.returncode != 0 or len(res) != a.ranks:
        lines = [l for l in (out.stdout + out.stderr).splitlines() if "Error" in l or "error" in l]
        return {"error": (lines[-1] if lines else f"exit {out.returncode}")[:300]}
    return {"step_ms": statistics.median(t for r in res for t in r["step_ms"]),
            "rss_mb": max(r["rss_mb"] for r in res),
            "train_rss_mb": max(r["train_rss_mb"] for r in res),
            "state_mb": max(r["rss_mb"] - r["base_mb"] for r in res),
            # the page faults and the kernel's CPU time of a step, the median over the ranks' steps
            "faults": statistics.median(k[0] for r in res for k in r["kernel"]),
            "kernel_ms": statistics.median(k[1] for r in res for k in r["kernel"])}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank and step")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--out", default=os.path.join(ROOT, "hpc", "bench", "results"))
    p.add_argument("--build", default=os.environ.get("SINEW_BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--worker", choices=WAYS)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--dir", default="")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    import torch
    params = sum(t.numel() for t in build(a).parameters())
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for way in a.ways.split(","):
            rows[way] = launch(a, way, d)
            print(f"{way}: {rows[way]}", flush=True)
    base = rows.get("ddp", {})
    print(f"\ntransformer {a.layers}x{a.width}, vocab {a.vocab}: {params / 1e6:.1f} M parameters, AdamW, "
          f"{a.ranks} ranks, batch {a.batch}x{SEQ} tokens per rank, torch {torch.__version__}")
    fsdp = rows.get("fsdp2", {})
    print("peak RSS: the largest rank's, over the whole run and until the last step (in training); training memory: "
          "its peak RSS less its RSS before the model was built (torch, the process group: the same libraries "
          "whatever the way)")
    print(f"{'':13}{'peak RSS MB':>12}{'x DDP':>7}{'in training':>12}{'x DDP':>7}{'training MB':>12}{'x DDP':>7}"
          f"{'step ms':>9}{'x DDP':>7}{'x FSDP2':>8}{'faults':>9}{'kernel ms':>10}")
    nan = float("nan")
    for way, r in rows.items():
        if "error" in r:
            print(f"{way:13}  could not run here: {r['error']}")
            continue
        rx = r["rss_mb"] / base["rss_mb"] if "rss_mb" in base else nan
        ix = r["train_rss_mb"] / base["train_rss_mb"] if "train_rss_mb" in base else nan
        tx = r["state_mb"] / base["state_mb"] if "state_mb" in base else nan
        sx = r["step_ms"] / base["step_ms"] if "step_ms" in base else nan
        fx = r["step_ms"] / fsdp["step_ms"] if "step_ms" in fsdp else nan
        print(f"{way:13}{r['rss_mb']:12.0f}{rx:7.2f}{r['train_rss_mb']:12.0f}{ix:7.2f}{r['state_mb']:12.0f}{tx:7.2f}"
              f"{r['step_ms']:9.0f}{sx:7.2f}{fx:8.2f}{r['faults']:9.0f}{r['kernel_ms']:10.0f}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "shard_torch_bench.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "params": params, "ranks": a.ranks,
                   "layers": a.layers, "width": a.width, "vocab": a.vocab, "batch": a.batch, "seq": SEQ,
                   "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
