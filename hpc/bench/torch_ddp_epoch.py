#!/usr/bin/python3
"""PyTorch DDP (gloo) peer of a Sinew epoch benchmark: trains E epochs over Fashion-MNIST, then evaluates
the test accuracy. One process per rank, started separately (one per test-bed host, see
hpc/bench/torch_ddp_epoch.sh), rendezvous over TCP at --master.

Matches Sinew's defaults (src/sinew/train/config.hpp): MLP 784-512-512-10 with ReLU and PyTorch's default
init (Sinew uses the same bounds), per-rank batch 64, SGD lr 0.05 momentum 0.9, linear warm-up over
min(50, total/2) steps then cosine decay to 0 (src/sinew/optim/lr_schedule.cpp), inputs (x/255 - 0.2860) /
0.3530, DDP gradient buckets of 4 MiB, one thread per rank. Sharding is torch's DistributedSampler
(drop_last=False): a permutation seeded by seed + epoch, rank r takes every world-th sample from r, so an
epoch has ceil(n / world / batch) steps, as Sinew's (235 for 4 x 64).

With --powersgd-rank R, DDP's gradients go through PyTorch's PowerSGD communication hook
(torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook: rank-R factors with error feedback and warm
start, Vogels et al. 2019), exact for the first --powersgd-warmup-steps steps (its start_powerSGD_iter), and
the JSON line says "impl": "torch-ddp-powersgd".

Rank 0 prints one JSON line: {"impl": "torch-ddp", "epochs", "epoch_s": [...], "test_accuracy", "steps",
...}. epoch_s is the slowest rank's time of each epoch (barrier, then steps; evaluation not included).
tx_bytes_per_step is what each host put on eth0 during the timed epochs, per step (mean over hosts),
read from the kernel's counter of the namespace the rank runs in.
Needs Debian's python3-torch (/usr/bin/python3).
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp_step import load_idx, mlp  # noqa: E402  (same data loading and model as the step peer)

TX = "/sys/class/net/eth0/statistics/tx_bytes"


def tx_bytes():
    # Under `ip netns exec` /sys is the namespace's own, so this is this host's eth0.
    try:
        with open(TX) as f:
            return int(f.read())
    except OSError:
        return 0


def shard(n, world, rank, epoch, seed):
    """torch.utils.data.DistributedSampler(shuffle=True, drop_last=False) without a Dataset object."""
    g = torch.Generator().manual_seed(seed + epoch)
    idx = torch.randperm(n, generator=g)
    per_rank = math.ceil(n / world)
    idx = torch.cat([idx, idx[: per_rank * world - n]])  # pad by wrapping around, as DistributedSampler does
    return idx[rank::world]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous (e.g. 10.77.0.1:29500)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--hidden", default="512,512")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--powersgd-rank", type=int, default=0, help="PowerSGD's rank (0: plain DDP)")
    p.add_argument("--powersgd-warmup-steps", type=int, default=10,
                   help="steps with the exact allreduce before PowerSGD compresses (>= 2, PyTorch's rule)")
    p.add_argument("--json", help="also write rank 0's JSON line to this file")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(minutes=10))
    rank, world = args.rank, args.world
    d = args.data_dir
    x, y = load_idx(os.path.join(d, "train-images-idx3-ubyte.gz"), os.path.join(d, "train-labels-idx1-ubyte.gz"))
    xt, yt = load_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz"), os.path.join(d, "t10k-labels-idx1-ubyte.gz"))

    torch.manual_seed(args.seed)
    model = mlp([int(h) for h in args.hidden.split(",")])
    if args.powersgd_rank > 0:
        # One bucket, as Sinew's 4 MiB bucket holds this model: with several, the hook's second allreduce
        # (issued from the first's completion callback) races with the next bucket's first allreduce
        # (issued by backward), gloo sees them in different orders on different ranks and aborts
        # ("op.preamble.length <= op.nbytes"). DDP documents this knob for its first bucket.
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.bucket_mb * 1024 * 1024)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)  # broadcasts rank 0's init
    impl = "torch-ddp"
    if args.powersgd_rank > 0:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        # Error feedback and warm start on (PyTorch's defaults), which need start_powerSGD_iter >= 2.
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                       start_powerSGD_iter=max(2, args.powersgd_warmup_steps))
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        impl = "torch-ddp-powersgd"
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    steps_per_epoch = math.ceil(math.ceil(x.shape[0] / world) / args.batch)
    total = steps_per_epoch * args.epochs
    if args.max_steps > 0:
        total = min(total, args.max_steps)
    warmup = min(args.warmup_steps, total // 2)

    def lr_factor(step):  # Sinew's warm-up + cosine (min_lr 0), as a factor of the base lr
        if step < warmup:
            return (step + 1) / warmup
        t, span = step - warmup, max(total - warmup, 1)
        return 0.0 if t >= span else 0.5 * (1 + math.cos(math.pi * t / span))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    loss_fn = nn.CrossEntropyLoss()

    epoch_s, step, loss_sum, loss_n = [], 0, 0.0, 0
    dist.barrier()
    tx0 = tx_bytes()
    for epoch in range(args.epochs):
        idx = shard(x.shape[0], world, rank, epoch, args.seed)
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(0, len(idx), args.batch):
            if step >= total:
                break
            b = idx[i: i + args.batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x[b]), y[b])
            loss.backward()  # DDP averages the gradients over the ranks here, bucket by bucket
            opt.step()
            sched.step()
            step += 1
            loss_sum, loss_n = loss_sum + loss.item(), loss_n + 1
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        epoch_s.append(t.item())
    tx = torch.tensor([float(tx_bytes() - tx0)], dtype=torch.float64)
    dist.all_reduce(tx)

    # Test accuracy: each rank evaluates a contiguous shard, the counts are summed (as Sinew does).
    t0 = time.perf_counter()
    lo, hi = rank * xt.shape[0] // world, (rank + 1) * xt.shape[0] // world
    with torch.no_grad():
        correct = (model(xt[lo:hi]).argmax(1) == yt[lo:hi]).sum()
    c = torch.tensor([float(correct)], dtype=torch.float64)
    dist.all_reduce(c)
    eval_s = time.perf_counter() - t0

    if rank == 0:
        res = {"impl": impl, "epochs": args.epochs, "epoch_s": [round(s, 4) for s in epoch_s],
               "test_accuracy": c.item() / xt.shape[0], "steps": step, "world": world, "batch": args.batch,
               "train_loss": loss_sum / max(loss_n, 1), "eval_s": round(eval_s, 4),
               "tx_bytes_per_step": tx.item() / world / max(step, 1),
               "params": sum(q.numel() for q in model.parameters()), "torch": torch.__version__}
        if args.powersgd_rank > 0:
            res["powersgd_rank"] = args.powersgd_rank
            res["powersgd_warmup_steps"] = max(2, args.powersgd_warmup_steps)
        line = json.dumps(res)
        print(line)
        if args.json:
            with open(args.json, "w") as f:
                f.write(line + "\n")
    # PyTorch 1.13's gloo teardown hung now and then at exit (see torch_ddp_step.py): leave without it.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
