"""A torch.optim optimizer inside Sinew's replicated state.

Its per-parameter state is created (one step with zero gradients and learning rate 0 changes no parameter),
then every state tensor of a parameter's shape is moved into a flat tensor per key ("momentum_buffer",
"exp_avg", ...) of the parameters' layout and replaced by a view of it; the optimizer's in-place updates then
write Sinew's buffers, which replacements receive and checkpoints hold (optim/<key>).
"""
import inspect
import mmap
import types

import torch

from . import UsageError


def adopt(opt, work, named_params, own_loop, step_gate=None):
    """Makes `opt` Sinew's optimizer of `work` (named_params: the model's trained parameters).

    own_loop False (Job.run, Job.state): Sinew steps it, at Sinew's learning rate (--lr, its schedule).
    own_loop True (the script's loop): the script steps it; opt.step becomes step_gate(closure), which makes
    the step Sinew's (the reduction waited for, the algorithm, the step boundary) and calls the real step with
    the optimizer's own learning rates, times --lr-scaling's factor after a resize; opt.zero_grad zeroes the
    gradients in place (.grad stays the view of the flat gradient buffer).
    """
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"sinew: optimizer must be a torch.optim.Optimizer, got {type(opt).__name__}")
    ours = {id(p): n for n, p in named_params}
    # Frozen parameters in the optimizer (model.parameters() of a fine-tuning job) get no gradient, and torch's
    # optimizers skip them: so does Sinew.
    theirs = [p for g in opt.param_groups for p in g["params"] if p.requires_grad or id(p) in ours]
    for p in theirs:
        if id(p) not in ours:
            raise UsageError("the optimizer has a parameter the model does not train (one that does not require "
                             "a gradient, or of another module): give it model.parameters()")
    if len({id(p) for p in theirs}) != len(ours):
        missing = [n for n, p in named_params if id(p) not in {id(q) for q in theirs}]
        raise UsageError(f"the optimizer does not update parameter '{missing[0]}': give it all of "
                         "model.parameters()")
    flat = work.flat_params
    base = flat.data_ptr()
    offset = {id(p): (p.data_ptr() - base) // flat.element_size() for _, p in named_params}
    if work.sharded:
        _adopt_sharded(opt, work, named_params, own_loop, step_gate)
        return
    real_step = opt.step  # (an lr_scheduler may have wrapped it: its bookkeeping stays)
    # The state is created by a step with zero gradients, learning rate 0 and no weight decay: no parameter
    # moves, and the state holds what it holds before a first step (zeros; Adagrad's initial accumulator),
    # so that the first real step is plain PyTorch's, bit for bit. Where the optimizer's kind allows, that state
    # is made in flat tensors first (learned on a two-element twin), so that the step updates them in place
    # instead of allocating a copy of the parameters per key.
    flats = _flat_state(opt, flat, named_params, offset)
    kept = [{k: g[k] for k in ("lr", "weight_decay") if k in g} for g in opt.param_groups]
    for g in opt.param_groups:
        g.update({k: 0.0 for k in ("lr", "weight_decay") if k in g})
    real_step()
    for g, k in zip(opt.param_groups, kept):
        g.update(k)
    keys = []
    for n, p in named_params:
        for k, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v) and v.shape == p.shape and v.dtype == torch.float32 and k not in keys:
                keys.append(k)
    state = []
    for k in keys:
        buf = flats.get(k)
        if buf is not None:  # the optimizer's state is already views of it
            state.append((k, buf))
            continue
        buf = torch.zeros_like(flat)
        for n, p in named_params:
            st = opt.state.get(p, {})
            if k not in st:
                raise UsageError(f"the optimizer keeps '{k}' for some parameters but not for '{n}': Sinew cannot "
                                 "hold its state in one buffer")
            view = buf[offset[id(p)]:offset[id(p)] + p.numel()].view_as(p)
            view.copy_(st[k])
            st[k] = view
        state.append((k, buf))

    def steps():
        for p in theirs:
            s = opt.state.get(p, {}).get("step")
            if s is not None:
                return int(s.item()) if torch.is_tensor(s) else int(s)
        return 0

    def set_steps(n):
        for p in theirs:
            st = opt.state.get(p, {})
            if "step" in st:
                if torch.is_tensor(st["step"]):
                    st["step"].fill_(n)
                else:
                    st["step"] = n

    def relayout():
        # Sinew moved the parameters within the flat buffer (backward's order, found before training) and
        # each state tensor's values with them: the per-parameter views follow.
        base = flat.data_ptr()
        for k, buf in state:
            for n, p in named_params:
                at = (p.data_ptr() - base) // flat.element_size()
                opt.state[p][k] = buf[at:at + p.numel()].view_as(p)

    _gate(opt, work, named_params, own_loop, step_gate, real_step)
    set_steps(0)  # the initialising step above did not happen
    work.use_optimizer(type(opt).__name__, state, step_of(opt, own_loop, real_step), steps, set_steps, relayout)


def step_of(opt, own_loop, real_step):
    """Sinew's update through `opt`: at the script's learning rates times a factor (own loop), or at Sinew's."""
    if own_loop:
        def step(factor):
            if factor == 1.0:
                real_step()
                return
            kept = [g["lr"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * factor
            try:
                real_step()
            finally:
                for g, lr in zip(opt.param_groups, kept):
                    g["lr"] = lr
        return step

    def step(lr):
        for g in opt.param_groups:
            g["lr"] = lr
        real_step()
    return step


def _gate(opt, work, named_params, own_loop, step_gate, real_step):
    """The script's opt.step and opt.zero_grad: Sinew's step in its own loop; refused in a Job.run step."""
    # Bound methods, as torch's own: an lr_scheduler made afterwards wraps opt.step through its __func__.
    if own_loop:
        def gate(self, closure=None):
            if closure is not None:
                raise UsageError("optimizer.step(closure): Sinew makes one reduction per step; an optimizer that "
                                 "evaluates the loss again (LBFGS) is not supported in the script's loop")
            return step_gate()

        def zero_grad(self, set_to_none=True):
            del set_to_none  # .grad stays the view of the flat gradient buffer, zeroed in place
            zero_views(work, named_params)

        gate._wrapped_by_lr_sched = getattr(real_step, "_wrapped_by_lr_sched", None)  # its check at step 1
        opt.step = types.MethodType(gate, opt)
        opt.zero_grad = types.MethodType(zero_grad, opt)
    else:
        def sinew_steps_it(self, *args, **kwargs):
            raise UsageError("optimizer.step() in a Job.run/Job.state step function: Sinew steps this optimizer "
                             "itself after the step's reduction (a step here would use the local, unreduced "
                             "gradient); remove optimizer.step() and zero_grad(), or write the script's own loop "
                             "(docs/pytorch.md)")
        opt.step = types.MethodType(sinew_steps_it, opt)
        opt.zero_grad = types.MethodType(sinew_steps_it, opt)


# The torch.optim optimizers whose update of an element depends on that element's parameter, gradient and
# state alone (and on scalars): the update of a range of the flat buffer is then the whole update's on that
# range, bit for bit, which --shard optimizer needs (LAMB, LARS, Adafactor use norms over a tensor: not so).
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD")


# The largest piece of a parameter a sharded optimizer steps at once (elements; 4 MiB of float32). The update is
# element-wise (ELEMENTWISE), so pieces change no bit of it.
STEP_CHUNK = 1 << 20
PAGE = mmap.PAGESIZE  # (a reshard places state buffers by their offset within a page)


def _adopt_sharded(opt, work, named_params, own_loop, step_gate):
    """--shard optimizer: `opt` is the script's settings, never stepped; Sinew makes an optimizer of its class per
    shard it holds, over views of that range of the flat buffers, with state for that range only (ZeRO-1).

    A model on a GPU: the shards are views of the flat buffers' host record (work.host_params, host_grads), where
    Sinew brings the held ranges' reduced gradients and steps them, and whence it copies the updated parameters
    to the GPU (ZeRO-Offload's placement; its state is in host memory). Settings for CUDA tensors only
    (capturable) are off there."""
    kind = type(opt).__name__
    if kind not in ELEMENTWISE or type(opt).__module__.split(".")[:2] != ["torch", "optim"]:
        raise UsageError(f"--shard optimizer: {kind} is not one of torch.optim's element-wise optimizers "
                         f"({', '.join(ELEMENTWISE)}), whose update of a shard equals the whole update's; use "
                         "shard='none'")
    if any(opt.state.get(p) for _, p in named_params):
        raise UsageError(f"--shard optimizer: {kind} already has state (a loaded state_dict?); Sinew's checkpoints "
                         "hold a sharded job's optimizer state: resume from one instead")
    probe, made = twin_state(opt, work.flat_params.dtype)  # the state a first step makes
    shaped, other = {}, {}
    for k, v in made.items():
        if torch.is_tensor(v) and v.shape == probe.shape:
            shaped[k] = v.reshape(-1)[0].item()
        else:
            other[k] = v
    group_of = {id(p): i for i, g in enumerate(opt.param_groups) for p in g["params"]}
    positions = [(n, p) for n, p in named_params]
    on_host = {"capturable": False} if work.flat_params.device.type != "cpu" else {}

    def settings(i):
        out = {k: v for k, v in opt.param_groups[i].items() if k != "params"}
        out.update({k: v for k, v in on_host.items() if k in out})
        if on_host and torch.is_tensor(out.get("lr")):
            out["lr"] = out["lr"].item()  # (a GPU tensor of the script's, for the host's step)
        return out

    def buffer(i, value, count, place):
        if place is None:
            return torch.full((count,), value, dtype=work.flat_params.dtype)
        # A reshard's: every element is written from the old layout's state before it is read, so nothing is
        # written now (no page taken), and element 0 lies at place[i] within a page, where the pages this rank
        # keeps of its old buffer move in instead of being copied (ShardedOptimizer::reshard).
        if i >= len(place):
            return torch.empty(count, dtype=work.flat_params.dtype)
        size = work.flat_params.element_size()
        big = torch.empty(count + PAGE // size, dtype=work.flat_params.dtype)
        pad = (place[i] - big.data_ptr()) % PAGE // size
        return big[pad:pad + count]

    def make(offset, count, place=None):
        flat, grads = work.host_params, work.host_grads  # (on the CPU: the flat buffers themselves)
        base = work.flat_params.data_ptr()
        size = work.flat_params.element_size()
        bufs = {k: buffer(i, v, count, place) for i, (k, v) in enumerate(shaped.items())}
        pieces = {}  # the script's group -> [(view parameter, its first element)]
        for _, p in positions:
            at = (p.data_ptr() - base) // size
            lo, hi = max(at, offset), min(at + p.numel(), offset + count)
            # Pieces of at most STEP_CHUNK elements: a step's temporaries (Adam's denominator: two of the piece's
            # size) are then a few MB, not twice a language model's embedding (the peak of a sharded step).
            for c in range(lo, hi, STEP_CHUNK):
                q = torch.nn.Parameter(flat.new_empty(0))
                q.data = flat[c:min(c + STEP_CHUNK, hi)]  # the optimizer's in-place update writes the flat buffer
                q.grad = grads[c:min(c + STEP_CHUNK, hi)]
                pieces.setdefault(group_of[id(p)], []).append((q, c))
        state = [(k, bufs[k]) for k in shaped]
        if not pieces:  # an empty shard (fewer elements than ranks)
            return state, lambda x: None, lambda: 0, lambda n: None
        order = sorted(pieces)
        shard = type(opt)([{**settings(i), "params": [q for q, _ in pieces[i]]} for i in order])
        views = []
        for i in order:
            for q, lo in pieces[i]:
                st = shard.state[q]
                for k, b in bufs.items():
                    st[k] = b[lo - offset:lo - offset + q.numel()]
                for k, v in other.items():
                    st[k] = v.clone() if torch.is_tensor(v) else v
                views.append(q)

        def step(x):
            # The script's settings now (its scheduler's learning rate), at Sinew's factor or learning rate.
            for g, i in zip(shard.param_groups, order):
                g.update(settings(i))
                g["lr"] = g["lr"] * x if own_loop else x
            shard.step()
            opt._opt_called = True  # what the script's step would have told its lr_scheduler

        def steps():
            s = shard.state[views[0]].get("step")
            if s is None:
                return 0
            return int(s.item()) if torch.is_tensor(s) else int(s)

        def set_steps(n):
            for q in views:
                st = shard.state[q]
                if "step" in st:
                    if torch.is_tensor(st["step"]):
                        st["step"].fill_(n)
                    else:
                        st["step"] = n
        return state, step, steps, set_steps

    _gate(opt, work, named_params, own_loop, step_gate, opt.step)

    def elsewhere(*args, **kwargs):
        raise UsageError(f"{kind}.state_dict()/load_state_dict() with --shard optimizer: the state is sharded "
                         "over the ranks; Sinew's checkpoints hold it (docs/sharding.md)")
    opt.state_dict = elsewhere
    opt.load_state_dict = elsewhere
    work.use_sharded_optimizer(kind, make)


def twin_state(opt, dtype=torch.float32, device=None):
    """The per-parameter state one step of `opt`'s kind makes, learned on a two-element twin with its settings:
    (the twin's probe parameter, {key: value}). Raises whatever the twin's construction or step raises."""
    probe = torch.nn.Parameter(torch.zeros(2, dtype=dtype, device=device))
    probe.grad = torch.zeros_like(probe)
    twin = type(opt)([probe], **_twin_settings(opt))
    twin.step()
    return probe, twin.state[probe]


def _twin_settings(opt):
    """The settings of a twin of `opt` that makes its first step's state without moving anything: its defaults
    at learning rate and weight decay 0, those its constructor takes only (a class's defaults can hold more:
    AdamW's decoupled_weight_decay, which AdamW(...) refuses)."""
    accepted = inspect.signature(type(opt).__init__).parameters
    settings = {k: v for k, v in opt.defaults.items()
                if k in accepted and k not in ("differentiable", "fused", "capturable")}
    settings.update({k: 0.0 for k in ("lr", "weight_decay") if k in settings})
    return settings


def _flat_state(opt, flat, named_params, offset):
    """The per-parameter state `opt` would create, made beforehand as views of one flat tensor per key: {key: flat}.

    A twin of the optimizer's kind over a two-element parameter shows the keys, which of them are parameter-shaped,
    and their values before a first step (each must be one constant); other state (a scalar "step") is the twin's,
    per parameter. Nothing ({}) when the twin cannot be made or shows something else: then the state is created
    by the optimizer itself and moved (which costs a copy of the parameters per key at that moment).
    """
    if any(opt.state.get(p) for _, p in named_params):
        return {}  # state exists already (Adagrad makes it in __init__, or a loaded state_dict): moved as it is
    try:
        probe, made = twin_state(opt, flat.dtype, flat.device)
    except Exception:  # noqa: BLE001 (any optimizer: the general way below then)
        return {}
    shaped, other = {}, {}
    for k, v in made.items():
        if torch.is_tensor(v) and v.shape == probe.shape and v.dtype == flat.dtype:
            if not bool((v == v.reshape(-1)[0]).all()):
                return {}
            shaped[k] = v.reshape(-1)[0].item()
        else:
            other[k] = v
    flats = {k: torch.full_like(flat, value) for k, value in shaped.items()}
    for _, p in named_params:
        st = opt.state[p]
        for k, buf in flats.items():
            st[k] = buf[offset[id(p)]:offset[id(p)] + p.numel()].view_as(p)
        for k, v in other.items():
            st[k] = v.clone() if torch.is_tensor(v) else v
    return flats


def zero_views(work, named_params):
    """Zeroes every gradient in place; a .grad the script set to None (or replaced) is the view again."""
    grads = work.flat_grads
    with torch.no_grad():
        work.zero_grads()  # with shard="parameters" by giving the gradients' memory back
        flat = work.flat_params
        for _, p in named_params:
            at = (p.data_ptr() - flat.data_ptr()) // flat.element_size()
            if p.grad is None or p.grad.data_ptr() != grads.data_ptr() + at * grads.element_size():
                p.grad = grads[at:at + p.numel()].view_as(p)


def replaced_grads(work, named_params):
    """The names of the parameters whose .grad is no longer the view of the flat gradient buffer."""
    grads, flat = work.flat_grads, work.flat_params
    out = []
    for n, p in named_params:
        at = (p.data_ptr() - flat.data_ptr()) // flat.element_size()
        if p.grad is None or p.grad.data_ptr() != grads.data_ptr() + at * grads.element_size():
            out.append(n)
    return out
