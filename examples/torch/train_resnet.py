#!/usr/bin/env python3
"""torchvision's ResNet-18 on Fashion-MNIST in a PyTorch script's own loop, elastic with Sinew.

    sinew-run -n 4 [Sinew options] -- python3 examples/torch/train_resnet.py [--epochs 3 --lr 0.05 ...]

The loop is the one a DDP script has (zero_grad, backward, step, a DataLoader, a scheduler); Sinew's part is
sinew.init(), job.wrap(), job.sampler() and job.epochs(). The model is torchvision's, adapted to 1x28x28
inputs: a 3x3 stride-1 stem for one channel (the max-pool stays), 10 classes. The data: Fashion-MNIST from
Debian's dataset-fashion-mnist, read by Sinew's loader (nothing is downloaded). If a rank dies, the others
recover in place inside the loop, redo the step and start a replacement running this same script. Sinew's
options (--checkpoint-dir, --spares, --algorithm, ...) come from the launcher or SINEW_OPTIONS, never from
this script's command line.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, TensorDataset

import sinew


def resnet18_fashion_mnist():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1, bias=False)
    return m


def evaluate(model, job, test_x, test_y, chunk=500):
    """Test accuracy of the group's model: each rank its share of the test set, the counts summed."""
    model.eval()
    first, last = len(test_x) * job.rank // job.size, len(test_x) * (job.rank + 1) // job.size
    correct = 0
    with torch.no_grad():
        for s in range(first, last, chunk):
            x, y = test_x[s:min(s + chunk, last)], test_y[s:min(s + chunk, last)]
            correct += int((model(x).argmax(1) == y).sum())
    return job.all_reduce(correct) / len(test_x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--cuda", action="store_true",
                   help="train on a GPU (the local rank's, modulo the GPUs visible): gradients reduced by NCCL")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    job = sinew.init()
    train_x, train_y, test_x, test_y, about = job.dataset()
    net = resnet18_fashion_mnist()
    if args.cuda:
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
        device = torch.device("cuda", local % torch.cuda.device_count())
        net = net.to(device)
        train_x, train_y, test_x, test_y = (t.to(device) for t in (train_x, train_y, test_x, test_y))
    model = job.wrap(net, "resnet18")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    train_set = TensorDataset(train_x, train_y)
    loader = DataLoader(train_set, sampler=job.sampler(train_set), batch_size=args.batch_size)
    if job.rank == 0:
        print(f"[train_resnet] {about}; {model.describe()}", flush=True)

    for epoch in job.epochs(range(1, args.epochs + 1)):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        accuracy = evaluate(model, job, test_x, test_y)
        if job.rank == 0:
            print(f"[train_resnet] epoch {epoch}: test accuracy {100 * accuracy:.2f}% (lr "
                  f"{scheduler.get_last_lr()[0]:.4g}, {job.size} ranks, step {job.step})", flush=True)
        scheduler.step()

    s = job.summary
    if job.rank == 0:
        print(f"[train_resnet] done: test accuracy {100 * accuracy:.2f}% after {args.epochs} epochs ({s['steps']} "
              f"steps, {s['wall_s']:.0f} s, {s['failures']} failures recovered, {s['world_size']} ranks at the end)",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
