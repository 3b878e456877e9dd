#!/usr/bin/env python3
"""The script's own loop (the DDP-style one of docs/pytorch.md), for the torch.loop-* tests.

    python3 own_loop.py [--model mlp|cnn] [--workers K] [--epochs E] [--batch-size B] [--lr LR] [--out FILE]
                        [--trap NAME]

Its options are its own: Sinew's come from SINEW_OPTIONS (the tests set --dataset synthetic etc. there).
--out: rank 0 writes the final parameters and buffers (by name), the optimizer's learning rates and the
scheduler's state there (.pt). --trap: one of the habits that must fail loudly or work (see TRAPS).
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import sinew

TRAPS = ("none", "no-backward", "grad-replaced", "step-twice", "late-optimizer", "bad-keyword", "batch-sampler",
         "frozen", "clip", "no-optimizer", "break", "plain", "own-order", "rng", "state-dict",
                 "module-state-dict", "wrap-optimizer")


class Tokens(nn.Module):
    """An image as tokens, one per pixel: its position and its value in 16 levels (a language model's input)."""

    def forward(self, x):
        x = x.flatten(1)
        return torch.arange(x.shape[1]) * 16 + (x.clamp(-2, 2) * 4 + 8).long().clamp(0, 15)


class MeanTokens(nn.Module):
    def forward(self, h):
        return h.mean(1)


class Tied(nn.Module):
    """A language model's shape: an embedding, layers in a ModuleList, a head whose weight is the embedding's."""

    def __init__(self, vocab, width, classes):
        super().__init__()
        self.tokens = Tokens()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(2))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.out = nn.Linear(64, classes)

    def forward(self, x):
        h = self.embed(self.tokens(x))
        for layer in self.layers:
            h = F.relu(layer(h))
        return self.out(self.head(h.mean(1))[:, :64])


class Reversed(nn.Module):
    """Layers in a ModuleList that its forward calls last to first: the units' order is not their index order."""

    def __init__(self, inputs, classes):
        super().__init__()
        self.first = nn.Linear(inputs, 64)
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.out = nn.Linear(64, classes)

    def forward(self, x):
        h = F.relu(self.first(x.flatten(1)))
        for layer in reversed(self.layers):
            h = F.relu(layer(h))
        return self.out(h)


def build(name, channels, height, width, classes):
    torch.manual_seed(1234)
    if name == "embed":  # an nn.Embedding unit of 0.4 M parameters (its backward reads no weight), two Linear units
        return nn.Sequential(Tokens(), nn.Embedding(channels * height * width * 16, 32), MeanTokens(),
                             nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, classes))
    if name == "tied":  # the embedding's weight is also the head's: not a unit's (the root's)
        return Tied(channels * height * width * 16, 32, classes)
    if name == "reversed":  # 4 units called in reverse index order
        return Reversed(channels * height * width, classes)
    if name == "big":  # 25.3 M parameters: 101 MB, AdamW's whole training state 405 MB
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, 2048), nn.ReLU(),
                             *[m for _ in range(6) for m in (nn.Linear(2048, 2048), nn.ReLU())], nn.Linear(2048, classes))
    if name == "long":  # 17.6 M parameters in 18 small units: at shard="parameters" and R = 1, the model gathered
        # whole when training ends (4 + 2 bytes a parameter with AdamW) takes more than training (about 4.7)
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, 1024), nn.ReLU(),
                             *[m for _ in range(16) for m in (nn.Linear(1024, 1024), nn.ReLU())],
                             nn.Linear(1024, classes))
    if name == "deep":  # 0.56 M parameters: shards of many pages each (shard="parameters" gives pages back)
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, 512), nn.ReLU(), nn.Linear(512, 512),
                             nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, classes))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, 64), nn.ReLU(), nn.Linear(64, classes))
    return nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(16, classes))


class Cgroup:
    """A memory cgroup of this process's own (v1 or v2), for --mem-limit."""

    def __init__(self, path, v1):
        self.path, self.v1 = path, v1

    def _file(self, v1, v2):
        return os.path.join(self.path, v1 if self.v1 else v2)

    def usage(self):
        return int(open(self._file("memory.usage_in_bytes", "memory.current")).read())

    def peak(self):
        f = self._file("memory.max_usage_in_bytes", "memory.peak")
        return int(open(f).read()) if os.path.exists(f) else self.usage()

    def set_limit(self, limit):
        with open(self._file("memory.limit_in_bytes", "memory.max"), "w") as f:
            f.write(str(limit))


def own_cgroup():
    """Moves this process into a new memory cgroup (sinew-test-PID); exits 77 where none can be made here."""
    for root, v1 in (("/sys/fs/cgroup/memory", True), ("/sys/fs/cgroup", False)):
        control = os.path.join(root, "memory.limit_in_bytes" if v1 else "cgroup.subtree_control")
        if not os.path.exists(control) or (not v1 and "memory" not in open(control).read().split()):
            continue
        path = os.path.join(root, f"sinew-test-{os.getpid()}")
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            return Cgroup(path, v1)
        except OSError as e:
            print(f"[own_loop] SKIP: cannot make a memory cgroup under {root}: {e}", flush=True)
            sys.exit(77)
    print("[own_loop] SKIP: no writable memory cgroup controller on this machine", flush=True)
    sys.exit(77)


def _first_shown(batches, job):
    """The batches, the first one's indices printed by rank 0 (the order kept: 0, 1, 2, ...)."""
    for k, idx in enumerate(batches):
        if k == 0 and job.rank == 0 and job.step == 0:
            print(f"[own_loop] first indices {idx[:4]}", flush=True)
        yield idx


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"],
                   help="adamw: two parameter groups (weight decay on the matrices only), as transformer scripts do")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="")
    p.add_argument("--trap", default="none", choices=TRAPS)
    p.add_argument("--clip", type=float, default=0.0, help="clip the gradients' norm to this (0: no clipping)")
    p.add_argument("--mem-limit", type=float, default=0.0,
                   help="run in a memory cgroup of its own whose limit is what the process uses after sinew.init() "
                        "plus this many bytes per parameter of the model (as a scheduler's per-task limit); exit "
                        "77 where this machine cannot make one")
    p.add_argument("--clip-by", default="torch", choices=["torch", "model"],
                   help="torch.nn.utils.clip_grad_norm_ or the wrapper's model.clip_grad_norm_ (sharded gradients)")
    args = p.parse_args()  # all of argv: nothing of Sinew's is on it
    torch.set_num_threads(1)

    if args.trap == "bad-keyword":
        try:
            sinew.init(no_such_option=3)
        except sinew.UsageError as e:
            print(f"[own_loop] caught sinew.UsageError (exit code {e.exit_code}): {e}", flush=True)
            return 0
        print("[own_loop] no error for an unknown keyword", flush=True)
        return 1

    cgroup = own_cgroup() if args.mem_limit > 0 else None
    job = sinew.init()
    train_x, train_y, test_x, test_y, _ = job.dataset()
    if cgroup is not None:
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)])  # (torch.optim's first use imports much of torch)
        with torch.device("meta"):
            count = sum(q.numel() for q in build(args.model, train_x.shape[1], train_x.shape[2], train_x.shape[3],
                                                 int(train_y.max()) + 1).parameters())
        limit = cgroup.usage() + int(args.mem_limit * count)
        cgroup.set_limit(limit)
        if job.rank == 0:
            print(f"[own_loop] memory limit per rank: {limit / 2**20:.0f} MiB ({cgroup.path}), {count / 1e6:.1f} M "
                  f"parameters", flush=True)
    train = TensorDataset(train_x, train_y)
    net = build(args.model, train_x.shape[1], train_x.shape[2], train_x.shape[3], int(train_y.max()) + 1)
    if args.trap == "frozen":
        # DDP's habit: frozen layers and integer buffers are made rank 0's at start. Here each rank
        # initialises them differently; Sinew must make them equal (and give a replacement rank 0's).
        net[0].bias.requires_grad_(False)
        with torch.no_grad():
            net[0].bias.fill_(float(job.rank) + 0.5)
            net[1].num_batches_tracked.fill_(100 * job.rank)
    if args.trap == "rng":
        # Dropout drawn from torch's generator, seeded differently on every rank: registered, the generators are
        # rank 0's everywhere and stay equal (a replacement's too).
        net = nn.Sequential(nn.Dropout(0.2), *net)
        torch.manual_seed(1000 + job.rank)
        job.register(sinew.RandomState())
    if args.trap == "plain":  # one process: the same steps as plain PyTorch, bit for bit
        import copy
        plain = copy.deepcopy(net)
    if args.trap == "wrap-optimizer":  # Job.run's way of giving the optimizer, in the own loop: refused at start
        model = job.wrap(net, optimizer=torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9))
    else:
        model = job.wrap(net)
    backward_gathers = set()
    if args.model == "embed" and getattr(model, "_units", None) is not None:
        units, gather = model._units, model._units._gather

        def counting_gather(i, in_backward=False, **kw):  # which units are gathered again for their backward
            if in_backward and units.active() and not job._loop.void:
                backward_gathers.add(type(units.modules[i]).__name__)
            return gather(i, in_backward, **kw)

        units._gather = counting_gather
    opt = None
    if args.trap == "wrap-optimizer":
        opt = model.optimizer
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    elif args.trap != "no-optimizer":
        if args.optimizer == "adamw":
            matrices = [q for q in model.parameters() if q.ndim > 1]
            others = [q for q in model.parameters() if q.ndim <= 1]
            opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.01},
                                     {"params": others, "weight_decay": 0.0}], lr=args.lr / 10)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        if args.trap == "plain":
            plain_opt = torch.optim.SGD(plain.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
            plain_sched = torch.optim.lr_scheduler.StepLR(plain_opt, step_size=1, gamma=0.5)
    if args.trap == "batch-sampler":
        loader = DataLoader(train, batch_sampler=job.sampler(train), num_workers=args.workers)
    elif args.trap == "own-order":
        # A script that indexes its own tensors, in their order: the sampler's batches() are the indices.
        sampler = job.sampler(len(train_x), shuffle=False)
    else:
        loader = DataLoader(train, sampler=job.sampler(train), batch_size=args.batch_size,
                            num_workers=args.workers, persistent_workers=args.workers > 0)

    for epoch in job.epochs(range(1, args.epochs + 1)):
        model.train()
        if args.trap == "own-order":
            loader = ((train_x[idx], train_y[idx]) for idx in _first_shown(sampler.batches(), job))
        for i, (x, y) in enumerate(loader):
            if opt is not None:
                opt.zero_grad()
            else:
                model.zero_grad()
            loss = F.cross_entropy(model(x), y)
            if args.trap != "no-backward":
                loss.backward()
            if args.trap == "grad-replaced" and job.step >= 3:
                net[-1].weight.grad = net[-1].weight.grad.clone()
            if args.trap == "clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            if args.clip > 0 and args.clip_by == "torch":
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            elif args.clip > 0:
                model.clip_grad_norm_(args.clip)
            if opt is not None:
                opt.step()
                if args.trap == "step-twice" and job.step >= 3:
                    opt.step()
            else:
                with torch.no_grad():
                    for q in model.parameters():
                        q.add_(q.grad, alpha=-args.lr)
            if args.trap == "plain":
                plain.train()
                plain_opt.zero_grad()
                F.cross_entropy(plain(x), y).backward()
                plain_opt.step()
                for (k, a), b in zip(net.state_dict().items(), plain.state_dict().values()):
                    if not torch.equal(a, b):
                        print(f"[own_loop] step {job.step}: {k} differs from plain PyTorch's", flush=True)
                        return 1
            if args.trap == "state-dict" and i == 2:
                torch.save(model.state_dict(), "/dev/null")  # DDP's habit: save the model in the loop
            if args.trap == "module-state-dict" and i == 2:
                torch.save(model.module.state_dict(), "/dev/null")  # the same through DDP's .module
            if args.trap == "late-optimizer" and i == 2:
                torch.optim.SGD(model.parameters(), lr=0.1).step()
            if args.trap == "break" and i == 2:
                break
        model.eval()
        units = getattr(model, "_units", None)
        if units is None or not units.active():
            # Between steps the model is the updated one and the same on every rank (with sharded optimizer state
            # and gradients too: the shards are gathered when the step ends, not at the next forward).
            with torch.no_grad():
                total = float(sum(q.detach().double().sum() for q in net.parameters()))
            lo, hi = job.all_reduce([-total, total], op="max")
            if -lo != hi:
                print(f"[own_loop] epoch {epoch}: the model differs between ranks ({-lo!r} .. {hi!r})", flush=True)
                return 1
        with torch.no_grad():
            correct = int((model(test_x).argmax(1) == test_y).sum())
        accuracy = job.all_reduce(correct, op="max") / len(test_y)  # the same model everywhere: max == each
        if job.rank == 0:
            lr = opt.param_groups[0]["lr"] if opt is not None else args.lr
            print(f"[own_loop] epoch {epoch}: test accuracy {100 * accuracy:.2f}% lr {lr:g} world {job.size} "
                  f"step {job.step}", flush=True)
        if opt is not None:
            sched.step()
            if args.trap == "plain":
                plain_sched.step()

    loop = job._loop
    if args.trap == "rng":
        draw = torch.rand(1).item()  # the next number of each rank's generator
        lo, hi = job.all_reduce([-draw, draw], op="max")
        print(f"[own_loop] rank {job.rank}: next random number {draw:.6f}; equal on every rank: {-lo == hi}", flush=True)
        if -lo != hi:
            return 1
    if args.trap == "frozen":
        # Every rank holds rank 0's frozen bias and integer buffer (0.5 and its count): min == max.
        lo = job.all_reduce([-net[0].bias.sum().item(), -float(net[1].num_batches_tracked)], op="max")
        hi = job.all_reduce([net[0].bias.sum().item(), float(net[1].num_batches_tracked)], op="max")
        same = -lo[0] == hi[0] and -lo[1] == hi[1]
        print(f"[own_loop] rank {job.rank}: frozen bias sum {net[0].bias.sum().item():g} num_batches_tracked "
              f"{int(net[1].num_batches_tracked)}; equal on every rank: {same}", flush=True)
        if not same:
            return 1
    if args.model == "embed" and job.rank == 0:
        print(f"[own_loop] units gathered again for backward: {', '.join(sorted(backward_gathers)) or 'none'}",
              flush=True)
        if getattr(model, "_units", None) is not None:
            print(f"[own_loop] embedding gradients written in place: {model._units.indexed_grads}", flush=True)
            print(f"[own_loop] embedding forwards that gathered only their rows: {model._units.row_gathers}",
                  flush=True)
    units = getattr(model, "_units", None)
    if units is not None and units.kept_sharded():
        # The model did not fit a rank whole at the end (sinew/memory.py): left sharded, its state_dict refused.
        try:
            model.state_dict()
            print("[own_loop] the model stayed sharded after training, and its state_dict() was not refused",
                  flush=True)
            return 1
        except sinew.UsageError as e:
            if job.rank == 0:
                print(f"[own_loop] the model stayed sharded after training; state_dict() refused: {e}", flush=True)
    if units is not None and job.rank == 0:
        print(f"[own_loop] prefetched gathers: {units.prefetched}, {units.prefetch_hits} waited for by their unit",
              flush=True)
        print(f"[own_loop] units held whole at once in backward: at most {units.most_in_backward} of "
              f"{len(units.ranges)}", flush=True)
    if cgroup is not None:
        peak = job.all_reduce(cgroup.peak(), op="max")
        if job.rank == 0:
            print(f"[own_loop] peak memory of the ranks' cgroups: {peak / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB",
                  flush=True)
    if job.rank == 0:
        s = job.summary
        print(f"[own_loop] done: {s['steps']} steps, {s['failures']} failures, world {s['world_size']}, "
              f"{loop.dropped} batches dropped, {loop.recoveries} recoveries", flush=True)
        if args.out:
            state = {"params": {k: v.detach().clone() for k, v in net.named_parameters()},
                     "buffers": {k: v.detach().clone() for k, v in net.named_buffers()},
                     "lr": [g["lr"] for g in opt.param_groups] if opt is not None else [],
                     "sched": sched.state_dict() if opt is not None else {},
                     # (With --shard optimizer the script's optimizer holds no state: Sinew's shards do.)
                     "opt_step": [int(opt.state[q]["step"]) if "step" in opt.state[q] else 0
                                  for q in model.parameters()] if opt is not None and opt.state else [],
                     "steps": s["steps"]}
            torch.save(state, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
