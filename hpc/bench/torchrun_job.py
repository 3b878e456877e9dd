#!/usr/bin/env python3
"""The torchrun peer of torch_recovery_bench.py: what a PyTorch user writes for an elastic job today.

    torchrun --nproc-per-node 4 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        torchrun_job.py --steps N --batch B --ckpt FILE --ckpt-every S --record FILE [--fail-rank R --fail-step K]

DDP over gloo, the benchmark's ResNet-18 (torch_bench.build) on the same synthetic inputs, torch.optim.SGD. Rank 0
saves model, optimiser and step with torch.save every S steps (to a temporary file, then renamed: a kill during
the save never leaves a torn file); every start loads the file if it is there (torchrun restarts every worker
when one dies). Rank 0 appends JSON lines to --record: {"event": "resume", "step": s} at each start, {"event":
"step", "step": s, "restart": r, "unix_time": t} after each step; rank R of the first start appends {"event":
"kill", "unix_time": t} and kills itself with SIGKILL before step K.
"""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402


def log(path, **record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--record", required=True)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    a = p.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # Each start's keys under a prefix of their own: the agent's store outlives a restart, and the restarted
    # workers' gloo rendezvous otherwise read the dead round's addresses and fail with "Connection refused"
    # (seen here with torch 2.15 on every restart; pytorch/pytorch#167288 reports the same with NCCL).
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"start{restart}", store), rank=rank, world_size=world)
    model = DDP(torch_bench.build("resnet18"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if os.path.exists(a.ckpt):
        state = torch.load(a.ckpt, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    if rank == 0:
        log(a.record, event="resume", step=start, restart=restart, unix_time=time.time())
    x, y = torch_bench.batches("resnet18", (a.steps + 1) * a.batch * world, a.batch)
    for step in range(start + 1, a.steps + 1):
        if restart == 0 and rank == a.fail_rank and step == a.fail_step:
            log(a.record, event="kill", rank=rank, step=step, unix_time=time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        idx = torch.arange(((step - 1) * world + rank) * a.batch, ((step - 1) * world + rank + 1) * a.batch)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        if rank == 0:
            log(a.record, event="step", step=step, restart=restart, unix_time=time.time())
            if step % a.ckpt_every == 0:
                tmp = a.ckpt + ".tmp"
                torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, a.ckpt)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
