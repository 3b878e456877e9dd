#!/usr/bin/python3
"""PyTorch DDP (gloo) peer of `sinew-bench train-step`: the same model, per-rank batch, optimiser and
data (Fashion-MNIST from the Debian package), one thread per rank, timed the same way (mean step time
of the timed steps after untimed warm-up steps; a step = sample, forward, backward + allreduce, update).

Run it through hpc/bench/train_step_vs_torch.sh, which runs Sinew in the same invocation and prints the
ratio. Needs Debian's python3-torch (use /usr/bin/python3) and, for a fair BLAS, libopenblas0 with
OPENBLAS_CORETYPE set (the driver does that).
"""
import argparse
import gzip
import json
import os
import socket
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def load_idx(images, labels, mean=0.2860, std=0.3530):
    with gzip.open(images, "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        assert magic == 0x803, f"{images}: bad magic"
        x = np.frombuffer(f.read(n * rows * cols), dtype=np.uint8).reshape(n, rows * cols)
    with gzip.open(labels, "rb") as f:
        magic, m = struct.unpack(">II", f.read(8))
        assert magic == 0x801 and m == n, f"{labels}: bad magic or count"
        y = np.frombuffer(f.read(m), dtype=np.uint8)
    x = (x.astype(np.float32) / 255.0 - mean) / std
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def mlp(hidden, inputs=784, classes=10):
    layers, last = [], inputs
    for h in hidden:
        layers += [nn.Linear(last, h), nn.ReLU()]
        last = h
    layers.append(nn.Linear(last, classes))
    return nn.Sequential(*layers)


def worker(rank, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    x, y = load_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"),
                    os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"))
    torch.manual_seed(args.seed)
    model = mlp([int(h) for h in args.hidden.split(",")])
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(x.shape[0], generator=g)
    b, n = args.batch, args.ranks

    def step(i):
        start = (i * n * b) % (x.shape[0] - n * b)
        idx = perm[start + rank * b: start + (rank + 1) * b]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xb), yb)
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    ms = torch.tensor([(time.perf_counter() - t0) * 1e3 / args.steps])
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    if rank == 0:
        res = {"impl": "torch-ddp", "ranks": n, "batch": b, "step_ms": ms.item(),
               "samples_per_s": n * b / (ms.item() / 1e3), "torch": torch.__version__}
        print(f"{'torch':<8} {n:6d} {b:6d} {ms.item():12.3f} {'-':>12} {res['samples_per_s']:14.0f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f)
                f.write("\n")
    # PyTorch 1.13's gloo teardown hung now and then at exit (spinning in one worker); the measurement is
    # complete here, so leave without it.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", default="512,512")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (0: a free one)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--json")
    args = p.parse_args()
    if not os.path.exists(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz")):
        sys.exit(f"error: Fashion-MNIST not found in {args.data_dir}; apt-get install dataset-fashion-mnist")
    if args.port == 0:
        # A fresh port per run: reusing one port in back-to-back runs hung a gloo rendezvous once.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    mp.spawn(worker, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
