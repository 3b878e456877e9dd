"""Sinew for PyTorch: train your own torch.nn.Module with Sinew's elastic runtime.

    import sinew
    job = sinew.Job(sinew_options)          # sinew-train's options: --epochs, --batch-size, --algorithm, ...
    model = job.wrap(net)                    # parameters and gradients become views of Sinew's flat buffers

    def train_step(indices):                 # this rank's samples of the step (exactly once per epoch)
        x, y = train_x[indices], train_y[indices]
        loss = F.cross_entropy(model(x), y)
        loss.backward()                      # each gradient is reduced as soon as its bucket is complete
        return loss.item()

    summary = job.run(model, len(train_x), train_step, evaluate, len(test_x))
    job.exit(summary["exit_code"])

When a rank dies in forward, backward, the optimiser step or between steps, the survivors recover in place:
the state comes from their memory, the lost step is trained again (train_step is simply called again), and
the group grows back by starting this same script. See docs/pytorch.md.
"""

import os
import sys

import torch

# Open MPI loads its components as plugins that resolve symbols of libmpi: it must be loaded globally, as
# mpi4py does, or MPI_Init fails inside the extension module.
_flags = sys.getdlopenflags()
sys.setdlopenflags(_flags | os.RTLD_GLOBAL)
try:
    from . import _core
finally:
    sys.setdlopenflags(_flags)

Error = _core.Error
CommFailure = _core.CommFailure  # a rank failed: recovered in place by Job.run / Job.elastic

__all__ = ["CommFailure", "Error", "Job", "Model", "State", "data"]


class Model:
    """A torch.nn.Module trained by a Job: calling it calls the module.

    Its float32 parameters that require a gradient (module order) and its float32 buffers (BatchNorm's
    running statistics) are moved into Sinew's flat buffers; the tensors stay the module's own, now views.
    """

    def __init__(self, job, module, name=None, optimizer=None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"sinew: expected a torch.nn.Module, got {type(module).__name__}")
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        buffers = [(n, b) for n, b in module.named_buffers() if b.dtype == torch.float32]
        self.module = module
        self.optimizer = optimizer
        self._work = _core.Workload(params, buffers, job._job, name or type(module).__name__)
        if optimizer is not None:
            _adopt(optimizer, self._work, params)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def describe(self):
        return self._work.describe()

    def _evaluator(self, evaluate):
        """The user's evaluate(first, last) as Sinew calls it: the module in eval mode, without gradients."""
        if evaluate is None:
            return None

        def ev(first, last):
            self.module.eval()
            try:
                with torch.no_grad():
                    loss, correct = evaluate(first, last)
            finally:
                self.module.train()
            return float(loss), int(correct)
        return ev

    @property
    def flat_params(self):
        """All parameters as one float32 tensor (the memory the module's parameters are views of)."""
        return self._work.flat_params

    @property
    def flat_grads(self):
        return self._work.flat_grads


def _usage(message):
    """A Sinew error with the exit code of bad input (2)."""
    e = Error(message)
    e.exit_code = 2
    return e


def _adopt(opt, work, named_params):
    """Makes a torch.optim optimiser's per-parameter state part of Sinew's replicated state.

    Its state is created (one step with zero gradients and learning rate 0 changes no parameter), then every
    state tensor of a parameter's shape is moved into a flat tensor per key ("momentum_buffer", "exp_avg",
    ...) of the parameters' layout and replaced by a view of it; the optimiser's in-place updates then write
    Sinew's buffers, which replacements receive and checkpoints hold (optim/<key>). The learning rate of
    each step is Sinew's (--lr, its schedule and rescaling); the optimiser's other settings are its own.
    """
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"sinew: optimizer must be a torch.optim.Optimizer, got {type(opt).__name__}")
    ours = {id(p): n for n, p in named_params}
    theirs = [p for g in opt.param_groups for p in g["params"]]
    for p in theirs:
        if id(p) not in ours:
            raise _usage("the optimizer has a parameter the model does not train (one that does not require "
                         "a gradient, or of another module): give it model.parameters()")
    if len({id(p) for p in theirs}) != len(ours):
        missing = [n for n, p in named_params if id(p) not in {id(q) for q in theirs}]
        raise _usage(f"the optimizer does not update parameter '{missing[0]}': give it all of model.parameters()")
    flat = work.flat_params
    base = flat.data_ptr()
    offset = {id(p): (p.data_ptr() - base) // flat.element_size() for _, p in named_params}
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
    opt.step()  # the gradients are zero: the state is created, no parameter moves
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr
    keys = []
    for n, p in named_params:
        st = opt.state.get(p, {})
        for k, v in st.items():
            if torch.is_tensor(v) and v.shape == p.shape and v.dtype == torch.float32 and k not in keys:
                keys.append(k)
    state = []
    for k in keys:
        buf = torch.zeros_like(flat)
        for n, p in named_params:
            st = opt.state.get(p, {})
            if k not in st:
                raise _usage(f"the optimizer keeps '{k}' for some parameters but not for '{n}': Sinew cannot "
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

    def step(lr):
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()

    def relayout():
        # Sinew moved the parameters within the flat buffer (backward's order, found before training) and
        # each state tensor's values with them: the per-parameter views follow.
        base = flat.data_ptr()
        for k, buf in state:
            for n, p in named_params:
                at = (p.data_ptr() - base) // flat.element_size()
                opt.state[p][k] = buf[at:at + p.numel()].view_as(p)

    set_steps(0)  # the initialising step above did not happen
    work.use_optimizer(type(opt).__name__, state, step, steps, set_steps, relayout)


class State:
    """What training is: the model (and its optimiser), the sampler with its epoch and step. Everything in
    it lives in Sinew's replicated state, so after a recovery it is the survivors' (see Job.state)."""

    def __init__(self, model, sampler):
        self.model = model
        self.optimizer = model.optimizer
        self.sampler = sampler

    @property
    def epoch(self):
        return self.sampler.epoch

    @property
    def step(self):
        return self.sampler.step


class Job:
    """MPI, the elastic group and the session of one training job.

    options: sinew-train's options as a list of strings (default: sys.argv[1:]); `--help` prints them.
    defaults: the script's own defaults, {"--epochs": 3, ...}, each used unless `options` has it.
    A replacement is started as this same process: sys.executable with sys.argv.
    """

    def __init__(self, options=None, defaults=None):
        options = sys.argv[1:] if options is None else [str(o) for o in options]
        # The script's own defaults ({"--epochs": 3, ...}), each unless the options give it.
        given = {o.split("=", 1)[0] for o in options if o.startswith("--")}
        for key, value in (defaults or {}).items():
            if key not in given:
                options += [key, str(value)]
        script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        command = [sys.executable] + ([script] if script else []) + sys.argv[1:]
        # A replacement is started by the MPI runtime's daemons, whose environment is not this process's:
        # it must find this package (and whatever the script imports) where this process did.
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
        command = ["/usr/bin/env", "PYTHONPATH=" + os.pathsep.join(path)] + command
        try:
            self._job = _core.Job(options, command)
        except Error as e:
            print(f"sinew: {e}", file=sys.stderr)
            sys.exit(getattr(e, "exit_code", 2))
        if self._job.help:
            print(self._job.help, end="")
            sys.exit(0)

    @property
    def rank(self):
        return self._job.rank

    @property
    def size(self):
        return self._job.size

    @property
    def step(self):
        return self._job.step

    def dataset(self):
        """The data set of --dataset/--data-dir/--limit-train/--limit-test, loaded by Sinew (Fashion-MNIST
        from the Debian package by default; nothing is downloaded): (train_x, train_y, test_x, test_y,
        description), the features as float32 N x C x H x W tensors (normalised), the labels int64."""
        try:
            return self._job.dataset()
        except Error as e:
            self._fail(e)

    def wrap(self, module, name=None, optimizer=None):
        """The module as a Model of this job (see Model). The optimiser is Sinew's fused one of --optimizer
        (sgd | adam) over the flat buffers, or `optimizer`, a torch.optim optimiser over the module's
        parameters, whose state then becomes part of Sinew's replicated state (replacements receive it,
        checkpoints hold it); the learning rate is always Sinew's (--lr and its schedule)."""
        try:
            return Model(self, module, name, optimizer)
        except Error as e:
            self._fail(e)

    def run(self, model, train_size, train_step, evaluate=None, test_size=0):
        """Trains until done and returns the summary (a dict; "exit_code" is the process's code).

        train_step(indices): forward and backward of the training samples `indices` (a list of ints, never
        empty), returning the mean loss over them as a float. Call backward() once; do not step an optimiser
        or zero the gradients: Sinew does both. Before training it is called once more, on the first
        --batch-size samples, to learn the order in which backward produces the gradients (the buckets follow
        it); that call's gradients are dropped and BatchNorm's statistics restored.
        evaluate(first, last): (sum of the losses, number correct) over test samples [first, last).
        """
        def train(indices):
            return float(train_step(indices))

        model.module.train()
        try:
            return self._job.run(model._work, int(train_size), train, model._evaluator(evaluate), int(test_size))
        except Error as e:
            self._fail(e)

    def _fail(self, e):
        """A Sinew error: its message, and the exit with its code (docs/usage.md), MPI finalized."""
        print(f"[sinew] rank {self.rank}: {e}", file=sys.stderr)
        self.exit(getattr(e, "exit_code", 1))

    def state(self, model, train_size, evaluate=None, test_size=0, probe=None):
        """The Horovod-style elastic state of this job's training: model, optimiser, sampler, epoch, step.

            state = job.state(model, len(train_x), evaluate, len(test_x))

            @job.elastic
            def train(state):
                for indices in state.sampler:          # sinew.data.ElasticSampler
                    loss = F.cross_entropy(model(train_x[indices]), train_y[indices])
                    loss.backward()
                    state.sampler.report(loss.item())  # (optional: the metrics' loss)

            summary = train(state)

        When a rank dies, the exception leaves train(); job.elastic recovers in place (the state comes
        from the survivors' memory) and calls train(state) again, which goes on at the lost step.

        probe(indices), optional: forward and one backward() of the training samples `indices`, returning
        the loss (what train_step does in Job.run). Sinew runs it once before training to learn the order in
        which backward produces the gradients (the buckets follow it, as DDP's do after its first
        iteration), and for --algorithm auto's measure of a step. Without it the buckets follow the
        module's order reversed.
        """
        from .data import ElasticSampler
        sampler = ElasticSampler(self, model, train_size, evaluate, test_size, probe)
        return State(model, sampler)

    def elastic(self, fn):
        """Decorates a training function of a State: rank failures are recovered in place and the function
        is called again (Horovod elastic's hvd.elastic.run); returns the summary when training is over."""
        import functools

        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                while True:
                    try:
                        fn(*args, **kwargs)
                        break
                    except CommFailure:
                        self._job.recover()
                return self._job.finish()
            except CommFailure as e:  # not recoverable (--elastic off), or a recovery failed
                self._fail(e)
            except Error as e:
                self._fail(e)
        return run

    def exit(self, code=0):
        """Finalizes MPI (bounded: it cannot hang after a failure) and exits with `code`."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._job.exit(int(code))
        sys.exit(int(code))
