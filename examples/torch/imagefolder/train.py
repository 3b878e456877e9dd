#!/usr/bin/env python3
"""ResNet-18 on an ImageFolder tree with DataLoader worker processes, elastic and fault-tolerant with Sinew.

    python3 make_images.py --out data/train                       # Fashion-MNIST as PNG files
    mpi_scripts/sinew-run -n 4 -- python3 train.py --data data

The script is a DDP script with Sinew's four calls (sinew.init, job.wrap, job.sampler, job.epochs). Sinew's
options (--inject-fault, --resize-schedule, --audit-dir, --metrics, ...) come from the environment
(SINEW_OPTIONS, which sinew-run sets), never from this command line. If a rank dies, the others recover in
place and a replacement starts as this same script; the batches the loader's workers fetched ahead for the
old group are dropped and the loader goes on with the new plan (every sample once per epoch).

Rank 0 prints a line per epoch and, at the end, `RESULT {json}` for scripts that read it (tests, benchmarks).
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms

import sinew


def build_model(arch):
    """torchvision's ResNet for 1x28x28 images and 10 classes: a 3x3 stride-1 stem (the 7x7 stride-2 one would
    leave 7x7 maps before the first block); the max-pool stays, which keeps a step cheap on a CPU."""
    net = getattr(torchvision.models, arch)(num_classes=10)
    net.conv1 = nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1, bias=False)
    return net


def evaluate(job, model, test_set, args):
    """Test accuracy over the whole test set: each rank counts its shard, the counts are summed over the group
    (the group's size may have changed since the last epoch, so the shards are made here)."""
    shard = Subset(test_set, range(job.rank, len(test_set), job.size))
    loader = DataLoader(shard, batch_size=256, num_workers=args.workers)
    model.eval()
    correct = 0
    with torch.no_grad():  # out of training mode and without gradients: no step of the job
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    correct, total = job.all_reduce([correct, len(shard)], op="sum")
    return correct / total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a directory with the ImageFolder trees train/ and test/")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank (default 2)")
    p.add_argument("--arch", default="resnet18", choices=["resnet18", "resnet34", "resnet50"])
    args = p.parse_args()

    job = sinew.init()
    # ImageFolder reads the PNG files as RGB: back to one channel, then Fashion-MNIST's mean and deviation.
    transform = transforms.Compose([transforms.Grayscale(1), transforms.ToTensor(),
                                    transforms.Normalize((0.2860,), (0.3530,))])
    train_set = datasets.ImageFolder(f"{args.data}/train", transform=transform)
    test_set = datasets.ImageFolder(f"{args.data}/test", transform=transform)

    torch.manual_seed(0)
    model = job.wrap(build_model(args.arch))  # on a GPU: move the module to its device before wrapping
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    loader = DataLoader(train_set, sampler=job.sampler(train_set), batch_size=args.batch_size,
                        num_workers=args.workers, pin_memory=False, persistent_workers=args.workers > 0)

    train_s = 0.0
    accuracy = 0.0
    for epoch in job.epochs(range(1, args.epochs + 1)):
        model.train()
        start = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        train_s += seconds
        accuracy = evaluate(job, model, test_set, args)
        if job.rank == 0:
            print(f"epoch {epoch}: test accuracy {100 * accuracy:.2f}% (world {job.size}, "
                  f"{len(train_set) / seconds:.0f} samples/s)", flush=True)
        scheduler.step()

    if job.rank == 0:
        # Samples per second of the training loops (the evaluations left out), the group's samples: each
        # epoch trains every sample once. dropped: iterations whose batch the loader had fetched for the group
        # as it was before a failure or a resize.
        print("RESULT " + json.dumps({
            "accuracy": accuracy, "steps": job.step, "epochs": args.epochs, "train_s": train_s,
            "samples_per_s": len(train_set) * args.epochs / train_s, "world_size": job.size,
            "workers": args.workers, "dropped": job._loop.dropped, "recoveries": job._loop.recoveries}),
            flush=True)


if __name__ == "__main__":
    main()
