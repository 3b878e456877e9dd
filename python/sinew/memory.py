"""Whether the training state fits the memory this rank may use, checked when training starts, before the state
is made: a model too large for the limit fails with a message that names the stage it needs, instead of being
killed by the kernel in its first step.

The limit is the memory cgroup's this process is in (cgroup v2 memory.max, v1 memory.limit_in_bytes), as a
cluster's scheduler sets one per job or task; an address-space limit (ulimit -v) is not a memory limit (the
flat buffers of shard="parameters" reserve the whole model's addresses and use a fraction of them). Each rank
checks its own share: what it needs against the limit less what its cgroup uses now, so ranks that share one
cgroup are each checked against what is left when they check.

What a stage needs per rank, for P parameters of 4 bytes and an optimizer with k state tensors per parameter
(AdamW: 2), W ranks and R replicas (s = R / W):
    none         4P (parameters) + 4P (gradients) + 4kP (state)
    optimizer    4P + 4P + 4kP s
    gradients    4P + 4P + 4kP s        (the gradients are whole while backward writes them)
    parameters   (4P + 4P + 4kP) s + (8 + 4a) (largest unit) + 8 (root)   (a unit's parameters and gradients
                                                                     whole while it runs, the parameters of the
                                                                     a units prefetched (shard_prefetch); the
                                                                     root's for the step)
and with bytegrad's error feedback 4P more at every stage (its residual is a float per parameter).
Activations come on top of all of them: the check refuses only what cannot fit.

When training ends, a job at `parameters` gathers the model whole on every rank for what the script does with it
afterwards (its gradients given back first): 4P + 4kP s (+ the residual). With R = 1, or more than 4 ranks, that
is more than training needs. Where the limit leaves room for training but not for that, the model stays sharded
at the end instead (every rank agrees on it), its parameters in the end checkpoint, so the job needs a
checkpoint directory; rank 0 says so at start. The model's state_dict() and forward are refused after training
then. These figures are a lower bound (the libraries' own buffers, autograd's, a checkpoint's are not in them):
the runtime checks again when training ends, against what the rank uses then (train/session.cpp,
core/memory_limit.hpp), and keeps the model sharded where it lacks the room.

A recovery in place (R >= 2) makes the new layout's shards of the optimizer's state beside the old ones before
it lets the old go (a failure during the reshard then leaves the old intact): 4kP R'/W' more for a moment, at
W' = W - 1 ranks and R' = min(R, W'). Where the limit leaves room for the stage but not for that, the job trains,
and rank 0 says at start that a failure could end in a relaunch from the newest checkpoint instead.
"""
import os
import sys

import torch

from . import UsageError

STAGES = ("none", "optimizer", "gradients", "parameters")


def memory_cgroup():
    """(limit, usage, path) of this process's memory cgroup, or None where it has no limit."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):  # cgroup v1
            base = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        elif controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # cgroup v2
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            files = ("memory.max", "memory.current")
        else:
            continue
        try:
            limit = open(os.path.join(base, files[0])).read().strip()
            usage = int(open(os.path.join(base, files[1])).read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:
            continue
        return int(limit), usage, base
    return None


def state_tensors(opt):
    """How many tensors of the parameters' size `opt` keeps per parameter (AdamW 2, SGD with momentum 1)."""
    if opt is None:
        return 0
    from .optim import twin_state
    try:
        probe, made = twin_state(opt)
        return sum(1 for v in made.values() if torch.is_tensor(v) and v.shape == probe.shape)
    except Exception:  # noqa: BLE001 (an optimizer whose twin cannot be made: count as AdamW's)
        return 2


def need(stage, params, k, world, replicas, unit=0, root=0, residual=0, ahead=0):
    """Bytes per rank of the training state at `stage` (the table above); `residual`: floats per parameter of
    the algorithm's own (bytegrad's error feedback: 1); `ahead`: units prefetched."""
    s = min(replicas, world) / world
    extra = 4 * params * residual
    if stage == "none":
        return 4 * params * (2 + k) + extra
    if stage in ("optimizer", "gradients"):
        return 4 * params * (2 + k * s) + extra
    return 4 * params * (2 + k) * s + (8 + 4 * ahead) * unit + 8 * root + extra


def recovery_extra(stage, params, k, world, replicas):
    """Bytes per rank a recovery in place adds for a moment at `stage` (the docstring above); 0 where the job does
    not recover its shards in place (no sharding, one replica, one rank)."""
    if stage == "none" or replicas < 2 or world < 2:
        return 0
    w = world - 1
    return 4 * params * k * min(replicas, w) / w


def end_need(params, k, world, replicas, residual=0):
    """Bytes per rank when training ends at `parameters`: the model gathered whole beside the optimizer's shards
    (the gradients given back first)."""
    return 4 * params * (1 + residual) + 4 * params * k * min(replicas, world) / world


def check(job, model, opt):
    """Raises UsageError where this rank's stage cannot fit its cgroup's limit; names the stage that would."""
    cg = memory_cgroup()
    if cg is None:
        return
    limit, usage, where = cg
    core = job._job
    params = model._work.flat_params.numel()
    units = model._units
    # (An embedding unit gathers only the rows its indices name: not counted as a whole unit.)
    unit = max((sum(c for _, c in r) for r, t in zip(units.ranges, units.tables) if t is None),
               default=0) if units is not None else 0
    root = sum(c for _, c in units.root) if units is not None else 0
    k = state_tensors(opt)
    world, replicas = job.size, core.shard_replicas
    # The flat parameters are in memory already (the model was moved there): part of every stage's need.
    left = limit - usage + 4 * params
    stage = core.shard
    residual = core.residual_per_parameter
    ahead = core.shard_prefetch
    needs = {s: need(s, params, k, world, replicas, unit, root, residual, ahead) for s in STAGES}
    gib = 2 ** 30
    if needs[stage] <= left:
        if stage == "parameters":
            keep_sharded_at_end(job, end_need(params, k, world, replicas, residual), left, where)
        extra = recovery_extra(stage, params, k, world, replicas)
        if needs[stage] + extra > left and job.rank == 0:  # (one line per job: a scheduler gives ranks alike limits)
            print(f"[sinew] rank {job.rank}: warning: a recovery in place needs about {extra / gib:.2f} GiB more per "
                  f"rank for a moment (the new layout's shards of the optimizer state beside the old) than the "
                  f"{(left - needs[stage]) / gib:.2f} GiB the memory cgroup ({where}) leaves beside "
                  f"shard='{stage}''s {needs[stage] / gib:.2f} GiB: a failure could end in a relaunch from the newest "
                  "checkpoint instead; ask for more memory or run on more ranks to recover in place",
                  file=sys.stderr, flush=True)
        return
    fits = [s for s in STAGES if needs[s] <= left]
    name = type(opt).__name__ if opt is not None else "no optimizer"
    if fits:
        hint = (f"shard='{fits[0]}' needs about {needs[fits[0]] / gib:.2f} GiB per rank at {world} ranks "
                f"(shard_replicas={replicas})")
    else:
        hint = (f"even shard='parameters' needs {needs['parameters'] / gib:.2f} GiB per rank at {world} ranks "
                f"(shard_replicas={replicas}): run on more ranks, or ask for more memory")
    raise UsageError(
        f"the training state of this model ({params / 1e6:.1f} M parameters, {name}) needs "
        f"{needs[stage] / gib:.2f} GiB per rank with shard='{stage}', more than this rank may use: its memory "
        f"cgroup ({where}) allows {limit / gib:.2f} GiB and uses {usage / gib:.2f} GiB now; {hint}")


def keep_sharded_at_end(job, end, left, where):
    """At `parameters`: where the model gathered whole when training ends (`end` bytes) would not fit the `left`
    this rank may use, it stays sharded then (core.keep_sharded_at_end()); that needs a checkpoint directory."""
    if end <= left:
        return
    core = job._job
    gib = 2 ** 30
    why = (f"the trained model gathered whole beside the optimizer's shards needs about {end / gib:.2f} GiB per rank "
           f"when training ends, more than the {left / gib:.2f} GiB this rank's memory cgroup ({where}) leaves")
    if not core.checkpoint_dir:
        raise UsageError(f"{why}: Sinew then leaves it sharded after training, and the end checkpoint is where the "
                         "whole model is: give a checkpoint directory (sinew.init(checkpoint_dir=...), sinew-run "
                         "--checkpoint-dir), or ask for more memory per rank")
    core.keep_sharded_at_end()
    if job.rank == 0:
        print(f"[sinew] rank 0: {why}: it stays sharded after job.epochs() (its state_dict() and forward are refused "
              f"then, and its parameters read as each rank's shards and zeros); the trained model is the end "
              f"checkpoint in {core.checkpoint_dir}: sinew.checkpoint.state_dict(dir), or python3 -m sinew.checkpoint "
              "export dir model.pt", file=sys.stderr, flush=True)
