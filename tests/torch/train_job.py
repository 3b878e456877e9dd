#!/usr/bin/env python3
"""A torch training job through the sinew package, for the torch.* tests (tests/torch/CMakeLists.txt).

    python3 train_job.py [--model mlp|cnn|resnet18] [--params-out FILE] [--threads N] -- [sinew options]

Models: "mlp" (no BatchNorm: the equivalence test), "cnn" (convolutions with BatchNorm), "resnet18"
(torchvision's, with a 1-channel stem). --params-out: rank 0 writes the final parameters there (.pt, a dict by name).
"""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import sinew


def build(name, channels, height, width, classes, hidden=64):
    torch.manual_seed(1234)  # the same initial weights everywhere (Sinew also broadcasts rank 0's)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, hidden), nn.ReLU(),
                             nn.Linear(hidden, 32), nn.Tanh(), nn.Linear(32, classes))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))
    if name == "resnet18":
        import torchvision
        m = torchvision.models.resnet18(num_classes=classes)
        m.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return m
    raise SystemExit(f"unknown --model {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--params-out", default="")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--width-on-rank", default="", help="R:W: rank R builds its hidden layer W wide (a mismatch)")
    p.add_argument("--double", action="store_true", help="the model in float64 (refused)")
    p.add_argument("--torch-optimizer", default="", help="sgd | adam: a torch.optim optimiser instead of Sinew's")
    p.add_argument("--api", default="run", help="run (job.run with a step function) | sampler (Horovod style: "
                   "job.state, job.elastic, sinew.data.ElasticSampler) | sampler-probe (the same, with the "
                   "step as the probe of backward's order)")
    p.add_argument("--misuse", default="", help="opt-step (optimizer.step() in the step function) | foreign-step "
                   "(an optimizer Sinew does not know, stepped there) | sampler-arg (DataLoader(sampler=state.sampler))")
    args, sinew_options = p.parse_known_args()
    if sinew_options and sinew_options[0] == "--":
        sinew_options = sinew_options[1:]
    torch.set_num_threads(args.threads)

    job = sinew.Job(sinew_options)
    train_x, train_y, test_x, test_y, about = job.dataset()
    _, c, h, w = train_x.shape
    hidden = 64
    if args.width_on_rank:
        r, wide = (int(x) for x in args.width_on_rank.split(":"))
        hidden = wide if job.rank == r else hidden
    net = build(args.model, c, h, w, int(max(train_y.max(), test_y.max())) + 1, hidden)
    if args.double:
        net = net.double()
    opt = None
    if args.torch_optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    elif args.torch_optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=0.1)
    model = job.wrap(net, args.model, optimizer=opt)
    if job.rank == 0:
        print(f"[train_job] {about}; {model.describe()}", flush=True)

    foreign = torch.optim.SGD(net.parameters(), lr=0.1) if args.misuse == "foreign-step" else None

    def train_step(indices):
        idx = torch.tensor(indices)
        loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
        loss.backward()
        if args.misuse == "opt-step":
            opt.step()
        if foreign is not None:
            foreign.step()
        return loss.item()

    def evaluate(first, last):
        out = model(test_x[first:last])
        y = test_y[first:last]
        return F.cross_entropy(out, y, reduction="sum").item(), int((out.argmax(1) == y).sum())

    if args.api in ("sampler", "sampler-probe"):
        probe = train_step if args.api == "sampler-probe" else None
        state = job.state(model, len(train_x), evaluate, len(test_x), probe=probe)
        if args.misuse == "sampler-arg":
            from torch.utils.data import DataLoader, TensorDataset
            for _ in DataLoader(TensorDataset(train_x, train_y), sampler=state.sampler, batch_size=16):
                pass

        @job.elastic
        def train(state):
            for indices in state.sampler:
                state.sampler.report(train_step(indices))

        summary = train(state)
    else:
        summary = job.run(model, len(train_x), train_step, evaluate, len(test_x))
    if job.rank == 0 and not summary["left"]:
        print(f"[train_job] done: {summary['steps']} steps, test accuracy {100 * summary['test_accuracy']:.2f}%, "
              f"{summary['failures']} failures, world {summary['world_size']}", flush=True)
        counts = [int(b) for n, b in net.named_buffers() if n.endswith("num_batches_tracked")]
        if counts:
            print(f"[train_job] num_batches_tracked {counts}", flush=True)
        if args.params_out:
            # By name: the flat layout follows backward's order where it was probed, the module's elsewhere.
            torch.save({k: v.detach().clone() for k, v in net.named_parameters()}, args.params_out)
    job.exit(summary["exit_code"])


if __name__ == "__main__":
    main()
