#!/usr/bin/env python3
"""torchvision's ResNet-18 on Fashion-MNIST with Sinew's elastic runtime.

    mpirun -n 4 [mpi_scripts/env.sh's flags] python3 examples/torch/train_resnet.py [sinew options]

The model is torchvision's, adapted to 1x28x28 inputs: a 3x3 stride-1 stem for one channel (the max-pool
stays), 10 classes. Data: the Fashion-MNIST of Debian's dataset-fashion-mnist, loaded by Sinew (nothing is
downloaded). Any sinew-train option may be given (--epochs, --batch-size, --lr, --algorithm, --spares,
--checkpoint-dir, ...); the ones below are this script's defaults. If a rank dies, the others recover in
place, redo the step and start a replacement running this same script.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torchvision

import sinew
from sinew.steps import classifier

DEFAULTS = {"--epochs": 3, "--batch-size": 32, "--lr": 0.05, "--momentum": 0.9, "--weight-decay": 5e-4,
            "--lr-schedule": "cosine", "--warmup-steps": 100}


def resnet18_fashion_mnist():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1, bias=False)
    return m


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--cuda", action="store_true",
                   help="train on a GPU (the local rank's, modulo the GPUs visible): gradients reduced by NCCL")
    args, sinew_options = p.parse_known_args()
    torch.set_num_threads(args.threads)

    job = sinew.Job(sinew_options, defaults=DEFAULTS)
    train_x, train_y, test_x, test_y, about = job.dataset()
    net = resnet18_fashion_mnist()
    if args.cuda:
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
        device = torch.device("cuda", local % torch.cuda.device_count())
        net = net.to(device)
        train_x, train_y, test_x, test_y = (t.to(device) for t in (train_x, train_y, test_x, test_y))
    model = job.wrap(net, "resnet18")
    if job.rank == 0:
        print(f"[train_resnet] {about}; {model.describe()}", flush=True)

    train_step, evaluate = classifier(model, train_x, train_y, test_x, test_y)
    summary = job.run(model, len(train_x), train_step, evaluate, len(test_x))
    if job.rank == 0 and not summary["left"]:
        print(f"[train_resnet] done: test accuracy {100 * summary['test_accuracy']:.2f}% after "
              f"{summary['epochs']} epochs ({summary['steps']} steps, {summary['wall_s']:.0f} s, "
              f"{summary['failures']} failures recovered, {summary['world_size']} ranks at the end)", flush=True)
    job.exit(summary["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
