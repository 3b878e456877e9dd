"""The job: MPI, the elastic group, the wrapped model, and the two ways a script trains in it.

- The script's own loop (sinew.init(), job.wrap(), job.sampler(), job.epochs(): the DDP-style loop, see
  loop.py), which the README and docs/pytorch.md lead with.
- The step-function APIs: Job.run(model, n, train_step) and the Horovod-style Job.state/@Job.elastic.
"""
import atexit
import math
import os
import shlex
import sys

import torch

from . import CommFailure, Error, UsageError, _core

_job = None  # the process's one job (sinew.init())


def options_help():
    """The text of Sinew's options (sinew-train's; as keywords of sinew.init(), '-' becomes '_')."""
    return _core.Job(["--help"], []).help


def _usage(message):
    return UsageError(message)


def _option_words(kwargs):
    """Keyword options as sinew-train's words: checkpoint_every=200 -> ["--checkpoint-every", "200"]."""
    words = {}
    for key, value in kwargs.items():
        if value is None:
            continue
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        words[name] = [name, str(value)]
    return words


_REPEATABLE = {"--inject-fault"}  # sinew-train's options that may be given several times (they add up)


def _split(words):
    """sinew-train's words by option: {"--algorithm": ["--algorithm", "bytegrad"], "--overlap": ["--overlap"]}.
    A repeatable option given several times keeps every occurrence; any other, the last."""
    out, i = {}, 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            raise _usage(f"'{w}' in the options is not an option (options start with --)")
        if "=" in w:
            name, group = w.split("=", 1)[0], [w]
            i += 1
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            name, group = w, [w, words[i + 1]]
            i += 2
        else:
            name, group = w, [w]
            i += 1
        out[name] = out.get(name, []) + group if name in _REPEATABLE else group
    return out


def _merged_options(options, kwargs):
    """The job's options: the environment's (SINEW_OPTIONS, set by sinew-run), then `options` (a list of
    words), then keywords; a later source overrides an earlier one option by option. Never sys.argv."""
    merged = _split(shlex.split(os.environ.get("SINEW_OPTIONS", "")))
    merged.update(_split([str(o) for o in (options or [])]))
    merged.update(_option_words(kwargs))
    return merged


class Job:
    """MPI, the elastic group and the session of one training job (make it with sinew.init()).

    Options: keyword arguments (sinew.init(algorithm="bytegrad", checkpoint_dir="ckpt")), the launcher's
    (sinew-run ... --spares 1 -- python3 train.py: the environment's SINEW_OPTIONS), or, for the step-function
    APIs, `options`, a list of sinew-train's words; sinew.options_help() lists them. The script's command line
    is never read. A replacement is started as this same process: sys.executable with sys.argv.
    `defaults`: {"--epochs": 3, ...}, each used unless given otherwise.
    """

    def __init__(self, options=None, defaults=None, _from_init=False, **kwargs):
        global _job
        if _job is not None:
            raise _usage("a second sinew job in this process: call sinew.init() once")
        if options is None and not _from_init and not kwargs:
            # sinew.Job() read sys.argv before: a script that relied on it would now train with defaults
            # without a word. Loud instead.
            theirs = [a.split("=", 1)[0] for a in sys.argv[1:] if a.startswith("--")]
            known = [a for a in theirs if f"  {a} " in options_help()]
            if known:
                raise _usage(f"sinew.Job() does not read the command line ({', '.join(known)} are on it): give "
                             "sinew.Job(options) the list of Sinew's options, or use sinew.init(**keywords) and the "
                             "launcher's options")
        merged = _merged_options(options, kwargs)
        for key, value in (defaults or {}).items():
            merged.setdefault(key, [key, str(value)])
        self._given = set(merged)
        words = [w for ws in merged.values() for w in ws]
        script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        command = [sys.executable] + ([script] if script else []) + sys.argv[1:]
        # A replacement is started by the MPI runtime's daemons, whose environment is not this process's:
        # it must find this package (and whatever the script imports) where this process did, and the
        # launcher's options.
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
        env = ["PYTHONPATH=" + os.pathsep.join(path)]
        if os.environ.get("SINEW_OPTIONS"):
            env.append("SINEW_OPTIONS=" + os.environ["SINEW_OPTIONS"])
        try:
            self._job = _core.Job(words, ["/usr/bin/env"] + env + command)
        except UsageError as e:
            bad = [k for k in kwargs if f"--{k.replace('_', '-')}'" in str(e)]
            if bad and "unrecognised option" in str(e):
                raise _usage(f"sinew.init(): unknown keyword '{bad[0]}' (Sinew has no option "
                             f"--{bad[0].replace('_', '-')}); sinew.options_help() lists them, '-' as '_'") from None
            if bad:
                raise _usage(f"sinew.init(): keyword '{bad[0]}': {e}") from None
            raise
        if self._job.help:
            print(self._job.help, end="")
            raise SystemExit(0)  # --help asked for (the option's contract: print and exit 0)
        _job = self
        self._models = []
        self._adopted = set()  # ids of the optimizers Sinew steps or gates
        self._loop = None
        self._mode = None  # "loop" (the script's own loop) or "steps" (Job.run, Job.state)
        self.summary = None
        self.exit_code = 0
        _install_exit_handlers(self)

    # ---- where this process is -----------------------------------------------------------------------
    @property
    def rank(self):
        """This process's rank in the group (it changes when the group does)."""
        return self._job.rank

    @property
    def size(self):
        """The group's size now."""
        return self._job.size

    @property
    def step(self):
        """Optimizer steps the group has completed."""
        return self._job.step

    def dataset(self):
        """The data set of --dataset/--data-dir/--limit-train/--limit-test, loaded by Sinew (Fashion-MNIST
        from the Debian package by default; nothing is downloaded): (train_x, train_y, test_x, test_y,
        description), the features as float32 N x C x H x W tensors (normalised), the labels int64."""
        return self._job.dataset()

    def wrap(self, module, name=None, optimizer=None, units=None):
        """The module as a Model of this job: a torch.nn.Module whose forward is the module's, whose
        parameters and float buffers are views of Sinew's flat buffers, and whose state_dict() has the
        module's keys. In the script's own loop, the torch.optim optimizer over model.parameters() and its
        lr_scheduler are found when training starts (or give them to job.register()). For Job.run/Job.state,
        `optimizer` is a torch.optim optimizer whose steps Sinew makes (at Sinew's --lr), else Sinew's fused
        --optimizer. `units`, with shard="parameters": what is gathered whole while it runs (units.py): a module
        class or a tuple of them (every submodule of those classes, as FSDP's ModuleWrapPolicy), or a list of
        submodules; by default the elements of the model's nn.ModuleList and nn.Sequential containers."""
        if units is not None and self._job.shard != "parameters":
            raise _usage("job.wrap(units=...) is for shard='parameters' (sinew.init(shard='parameters')); this job "
                         f"shards {self._job.shard}")
        model = Model(self, module, name, optimizer, units)
        self._models.append(model)
        if optimizer is not None:
            self._adopted.add(id(optimizer))
        _guard_optimizers(self)
        return model

    # ---- the script's own loop (loop.py) -----------------------------------------------------------------
    def _own_loop(self):
        if self._mode == "steps":
            raise _usage("this job trains through Job.run/Job.state: its model, sampler and epochs are driven "
                         "by Sinew there; use one way per job")
        if self._loop is None:
            from .loop import Loop
            self._loop = Loop(self)
            self._mode = "loop"
        return self._loop

    def sampler(self, dataset, shuffle=True):
        """Sinew's sampler for the script's DataLoader: DataLoader(dataset, sampler=job.sampler(dataset),
        batch_size=B, num_workers=K, ...). Each epoch every sample is used exactly once by the whole group,
        also across failures and resizes; B is the batch per rank. `dataset`: a map-style Dataset, or the
        number of samples (a script that indexes its own data). shuffle=False keeps the data set's order."""
        from .data import DistributedSampler
        return DistributedSampler(self._own_loop(), dataset, shuffle)

    def epochs(self, epochs):
        """The script's epoch loop: `for epoch in job.epochs(range(1, args.epochs + 1))` (or an int n: 0..n-1).
        Starts training (a replacement and a promoted spare start at the group's current epoch); between two
        epochs the group completes the last step; after the last one the run is finished (self.summary)."""
        return self._own_loop().epochs(epochs)

    def register(self, *objects, **named):
        """Makes objects with state_dict()/load_state_dict() part of the replicated state: an optimizer or
        lr_scheduler found by other means, an EMA model, a GradScaler, sinew.Counter()s. They go back to the
        last completed step after a failure, replacements receive them, checkpoints hold them. Before training
        starts."""
        self._own_loop().register(*objects, **named)

    def on_resize(self, fn):
        """fn(job) runs after every change of the group's size or membership (Horovod's reset callbacks)."""
        self._own_loop().on_resize.append(fn)
        return fn

    def all_reduce(self, values, op="sum"):
        """The sum ("sum") or mean ("mean") or maximum ("max") over the group of a number, a list of
        numbers, or a tensor (returned as a new one): for a metric the script combines over ranks. Survives
        failures: a rank lost on the way is recovered from and the reduction is made again over the group."""
        return self._own_loop().all_reduce(values, op)

    # ---- the step-function APIs ----------------------------------------------------------------------------
    def _steps_api(self, model):
        if self._mode == "loop":
            raise _usage("this job runs the script's own loop (job.epochs, job.sampler): Job.run/Job.state "
                         "are the other way; use one way per job")
        if self._job.shard == "parameters":
            raise _usage("shard='parameters' is for the script's own loop (job.sampler, job.epochs); Job.run and "
                         "Job.state lay the model out anew (their probe pass): use shard='gradients' with them")
        self._mode = "steps"
        if not isinstance(model, Model):
            raise TypeError(f"sinew: expected the Model of job.wrap(), got {type(model).__name__}")

    def run(self, model, train_size, train_step, evaluate=None, test_size=0):
        """Trains until done and returns the summary (a dict; "exit_code" is the process's code).

        train_step(indices): forward and backward of the training samples `indices` (a list of ints, never
        empty), returning the mean loss over them as a float. Call backward() once; do not step an optimizer
        or zero the gradients: Sinew does both. Before training it is called once more, on the first
        --batch-size samples, to learn the order in which backward produces the gradients (the buckets follow
        it); that call's gradients are dropped and the module's buffers restored.
        evaluate(first, last): (sum of the losses, number correct) over test samples [first, last).
        """
        self._steps_api(model)
        model.module.train()
        self.summary = self._job.run(model._work, int(train_size), model._probe_safe(train_step),
                                     model._evaluator(evaluate), int(test_size))
        return self.summary

    def state(self, model, train_size, evaluate=None, test_size=0, probe=None):
        """The Horovod-style elastic state of this job's training: model, optimizer, sampler, epoch, step.

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
        probe(indices), optional: forward and one backward() of the training samples `indices` (what
        train_step does in Job.run), run once before training to learn backward's order.
        """
        from .data import ElasticSampler
        self._steps_api(model)
        sampler = ElasticSampler(self, model, train_size, evaluate, test_size,
                                 model._probe_safe(probe) if probe is not None else None)
        return State(model, sampler)

    def elastic(self, fn):
        """Decorates a training function of a State: rank failures are recovered in place and the function
        is called again (Horovod elastic's hvd.elastic.run); returns the summary when training is over."""
        import functools

        @functools.wraps(fn)
        def run(*args, **kwargs):
            while True:
                try:
                    fn(*args, **kwargs)
                    break
                except CommFailure:
                    self._job.recover()
            self.summary = self._job.finish()
            return self.summary
        return run

    def exit(self, code=0):
        """Finalizes MPI (bounded: it cannot hang after a failure) and ends the process with `code`."""
        self.exit_code = int(code)
        sys.stdout.flush()
        sys.stderr.flush()
        self._job.exit(int(code))
        raise SystemExit(int(code))


class RandomState:
    """The random number generators of this process (torch's CPU one, and Python's and NumPy's global ones), as an
    object to register: job.register(sinew.RandomState()). Then every rank draws as rank 0 does (dropout masks,
    augmentations: as with the same seed everywhere under DDP), a replacement draws on from the group's state, and
    a redone step after a failure draws what the lost one drew: the run is the failure-free one, bit for bit
    where that one is deterministic."""

    def state_dict(self):
        import random
        import numpy
        return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy.random.get_state()}

    def load_state_dict(self, state):
        import random
        import numpy
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        numpy.random.set_state(state["numpy"])


def init(**options):
    """Starts Sinew in this process (MPI, the elastic group) and returns the Job. Options are keywords, as
    sinew-train's long options with '_' for '-': sinew.init(algorithm="bytegrad", spares=1,
    checkpoint_dir="ckpt", checkpoint_every=200, audit_dir="audit"); the launcher's (sinew-run --spares 1 --
    python3 train.py) come through the environment. Unknown keywords and bad values raise sinew.UsageError
    naming them. The script's own command line is never read."""
    _install_early_excepthook()
    return Job(_from_init=True, **options)


class Model(torch.nn.Module):
    """A torch.nn.Module trained by a Job (job.wrap(module)), as DDP's wrapper is one.

    forward is the module's; .module is the module; parameters(), state_dict() (the module's keys),
    train(), eval() are the module's. Its float32 parameters that require a gradient (module order) and its
    float32 buffers (BatchNorm's running statistics) are moved into Sinew's flat buffers; the tensors stay the
    module's own, now views. Frozen parameters and other buffers stay where they are and are made rank 0's at
    start (and sent to replacements), as DDP does. Move the module to its device before wrapping it.
    """

    def __init__(self, job, module, name=None, optimizer=None, units=None):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"sinew: expected a torch.nn.Module, got {type(module).__name__}")
        self.module = module
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        buffers = [(n, b) for n, b in module.named_buffers() if b.dtype == torch.float32]
        self.__dict__["_job"] = job  # not a submodule, not in state_dict
        self.__dict__["_named_params"] = params
        self.optimizer = optimizer
        self._work = _core.Workload(params, buffers, job._job, name or type(module).__name__)
        # Its other buffers (BatchNorm's num_batches_tracked) go back with the float ones after a failure.
        self._work.also_keep([b for _, b in module.named_buffers() if b.dtype != torch.float32])
        if optimizer is not None:
            from .optim import adopt
            adopt(optimizer, self._work, params, own_loop=False)
        self.__dict__["_units"] = None
        if job._job.shard == "parameters":
            from .units import Units, route_clipping
            self.__dict__["_units"] = Units(self, units)
            route_clipping(self)

    def forward(self, *args, **kwargs):
        job = self._job
        if job._mode != "steps" and self.training and torch.is_grad_enabled():
            job._own_loop().on_forward(self)
        units = self._units
        if units is None:
            return self.module(*args, **kwargs)
        units.begin_forward()
        out = self.module(*args, **kwargs)
        units.end_forward()
        return out

    def state_dict(self, *args, **kwargs):
        """The module's state_dict (its own keys, as torch.save and load_state_dict expect them)."""
        return self.module.state_dict(*args, **kwargs)  # (refused in training with shard="parameters": Units)

    def load_state_dict(self, state_dict, strict=True, **kwargs):
        return self.module.load_state_dict(state_dict, strict, **kwargs)

    def zero_grad(self, set_to_none=True):
        """Zeroes the gradients in place: .grad stays the view of Sinew's flat gradient buffer."""
        del set_to_none
        from .optim import zero_views
        zero_views(self._work, self._named_params)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """torch.nn.utils.clip_grad_norm_ over the module's parameters, for a job whose gradients are sharded
        (shard="gradients": each rank holds only its shards of the reduced gradients, so torch's own function
        would see NaN in the rest): the norm over the group, each shard counted once, and the held gradients
        scaled. Also right for any other job (it is then torch's function). Call it between backward() and
        step(), as torch's; returns the total norm."""
        held = self._job._job.sharded_gradients()
        if not held:
            return torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm, norm_type)
        p = float(norm_type)
        flat = self._work.flat_grads
        ours = {id(q) for _, q in self._named_params}
        # Gradients outside the flat buffer (parameters of another dtype) are whole and equal on every rank:
        # counted by rank 0 alone.
        others = [q.grad.detach() for q in self.module.parameters() if q.grad is not None and id(q) not in ours]
        if self._job.rank != 0:
            others = []
        offset, count = held[0]  # this rank's own shard: the shards partition the buffer
        parts = [flat[offset:offset + count].detach()] + others
        loop = self._job._own_loop()
        if p == math.inf:
            local = max((float(t.abs().max()) for t in parts if t.numel()), default=0.0)
            total = loop.step_sum(local, op="max")
        else:
            local = sum(float(torch.linalg.vector_norm(t, p) ** p) for t in parts if t.numel())
            total = loop.step_sum(local)
            total = None if total is None else total ** (1.0 / p)
        if total is None:  # a recovery in this iteration: it updates nothing, so there is nothing to clip
            return torch.tensor(0.0)
        coef = float(max_norm) / (total + 1e-6)
        if coef < 1.0:
            with torch.no_grad():
                for o, c in held:
                    flat[o:o + c].mul_(coef)
                for q in self.module.parameters():
                    if q.grad is not None and id(q) not in ours:
                        q.grad.mul_(coef)
        return torch.tensor(total)

    def _apply(self, fn, *args, **kwargs):
        raise _usage("the model was moved or converted after job.wrap() (.to(), .cuda(), .double(), ...): its "
                     "parameters are views of Sinew's buffers; move or convert the module first, then wrap it")

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

    def _probe_safe(self, step):
        """step(indices) as Sinew calls it, as a float; the first call is the probe of backward's order, which
        must leave no trace in the module's buffers, integer ones included (BatchNorm's num_batches_tracked):
        they are put back after it (Sinew restores its float buffers itself)."""
        others = [b for _, b in self.module.named_buffers() if b.dtype != torch.float32]
        first = [True]

        def call(indices):
            if not first[0]:
                return float(step(indices))
            first[0] = False
            kept = [b.clone() for b in others]
            try:
                return float(step(indices))
            finally:
                with torch.no_grad():
                    for b, k in zip(others, kept):
                        b.copy_(k)
        return call

    @property
    def flat_params(self):
        """All parameters as one float32 tensor (the memory the module's parameters are views of)."""
        return self._work.flat_params

    @property
    def flat_grads(self):
        return self._work.flat_grads


class State:
    """What training is: the model (and its optimizer), the sampler with its epoch and step. Everything in
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


# ---- optimizers Sinew does not know ---------------------------------------------------------------------------
_guarded = False


def _guard_optimizers(job):
    """Any torch.optim optimizer that steps a wrapped model's parameters without Sinew (one made after
    training started, a second one, one stepped inside Job.run's step) would step on a local, unreduced
    gradient and the replicas would drift apart: its step raises UsageError before it changes anything."""
    global _guarded
    if _guarded:
        return
    _guarded = True
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def hook(optimizer, args, kwargs):
        if id(optimizer) in job._adopted:
            return
        ids = {id(p) for m in job._models for _, p in m._named_params}
        if any(id(p) in ids for g in optimizer.param_groups for p in g["params"]):
            raise UsageError(
                f"a {type(optimizer).__name__} that Sinew does not know steps the model's parameters: in the "
                "script's own loop make one optimizer before the epoch loop (Sinew finds it when training starts); "
                "with Job.run/Job.state give it to job.wrap(module, optimizer=...) and leave the stepping to Sinew")
    register_optimizer_step_pre_hook(hook)


# ---- the end of the process -----------------------------------------------------------------------------
_installed = False


def _install_exit_handlers(job):
    """MPI finalized (bounded) whatever happens, and an uncaught sinew.Error ends the process with its exit
    code and one line instead of a traceback per rank."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        if isinstance(value, Error):
            code = int(getattr(value, "exit_code", 1))
            if code != 0:
                print(f"[sinew] rank {_safe_rank(job)}: error: {value}", file=sys.stderr, flush=True)
            _finalize(job, code)
            os._exit(code)
        previous(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(_at_exit, job)


def _install_early_excepthook():
    """Before the job exists (a bad option is refused before MPI starts): an uncaught sinew.Error still
    ends the process with one line and its exit code (2 for a usage error), as it does later."""
    if _installed or getattr(sys.excepthook, "_sinew_early", False):
        return
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        if isinstance(value, Error) and not _installed:
            code = int(getattr(value, "exit_code", 1))
            print(f"[sinew] error: {value}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(code)
        previous(kind, value, tb)

    excepthook._sinew_early = True
    sys.excepthook = excepthook


def _safe_rank(job):
    try:
        return job.rank
    except Exception:  # noqa: BLE001 (the rank is for the message only)
        return "?"


def _finalize(job, code):
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        job._job.exit(int(code))
    except Exception:  # noqa: BLE001 (finalizing at exit: nothing left to tell)
        pass


def _at_exit(job):
    """At the interpreter's exit: MPI finalized; a run that ended without finishing (a stop signal, fewer
    than --min-ranks, a failed checkpoint) keeps its exit code even if the script returned normally."""
    code = job.exit_code
    _finalize(job, code)
    if code != 0:
        os._exit(code)
