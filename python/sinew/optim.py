"""A torch.optim optimizer inside Sinew's replicated state.

Its per-parameter state is created (one step with zero gradients and learning rate 0 changes no parameter),
then every state tensor of a parameter's shape is moved into a flat tensor per key ("momentum_buffer",
"exp_avg", ...) of the parameters' layout and replaced by a view of it; the optimizer's in-place updates then
write Sinew's buffers, which replacements receive and checkpoints hold (optim/<key>).
"""
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

        def gate(closure=None):
            if closure is not None:
                raise UsageError("optimizer.step(closure): Sinew makes one reduction per step; an optimizer that "
                                 "evaluates the loss again (LBFGS) is not supported in the script's loop")
            return step_gate()

        def zero_grad(set_to_none=True):
            del set_to_none  # .grad stays the view of the flat gradient buffer, zeroed in place
            zero_views(work, named_params)

        gate._wrapped_by_lr_sched = getattr(real_step, "_wrapped_by_lr_sched", None)  # its check at step 1
        opt.step = gate
        opt.zero_grad = zero_grad
    else:
        def step(lr):
            for g in opt.param_groups:
                g["lr"] = lr
            real_step()

        def sinew_steps_it(*args, **kwargs):
            raise UsageError("optimizer.step() in a Job.run/Job.state step function: Sinew steps this optimizer "
                             "itself after the step's reduction (a step here would use the local, unreduced "
                             "gradient); remove optimizer.step() and zero_grad(), or write the script's own loop "
                             "(docs/pytorch.md)")
        opt.step = sinew_steps_it
        opt.zero_grad = sinew_steps_it

    set_steps(0)  # the initialising step above did not happen
    work.use_optimizer(type(opt).__name__, state, step, steps, set_steps, relayout)


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
        probe = torch.nn.Parameter(torch.zeros(2, dtype=flat.dtype, device=flat.device))
        probe.grad = torch.zeros_like(probe)
        settings = {k: v for k, v in opt.defaults.items() if k not in ("differentiable", "fused", "capturable")}
        settings.update({k: 0.0 for k in ("lr", "weight_decay") if k in settings})
        twin = type(opt)([probe], **settings)
        twin.step()
        made = twin.state[probe]
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
        grads.zero_()
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
