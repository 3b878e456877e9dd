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

__all__ = ["Error", "Job", "Model"]


class Model:
    """A torch.nn.Module trained by a Job: calling it calls the module.

    Its float32 parameters that require a gradient (module order) and its float32 buffers (BatchNorm's
    running statistics) are moved into Sinew's flat buffers; the tensors stay the module's own, now views.
    """

    def __init__(self, job, module, name=None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"sinew: expected a torch.nn.Module, got {type(module).__name__}")
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        buffers = [(n, b) for n, b in module.named_buffers() if b.dtype == torch.float32]
        self.module = module
        self._work = _core.Workload(params, buffers, job._job, name or type(module).__name__)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def describe(self):
        return self._work.describe()

    @property
    def flat_params(self):
        """All parameters as one float32 tensor (the memory the module's parameters are views of)."""
        return self._work.flat_params

    @property
    def flat_grads(self):
        return self._work.flat_grads


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

    def wrap(self, module, name=None):
        """The module as a Model of this job (see Model)."""
        try:
            return Model(self, module, name)
        except Error as e:
            self._fail(e)

    def run(self, model, train_size, train_step, evaluate=None, test_size=0):
        """Trains until done and returns the summary (a dict; "exit_code" is the process's code).

        train_step(indices): forward and backward of the training samples `indices` (a list of ints, never
        empty), returning the mean loss over them as a float. Call backward() once; do not step an optimiser
        or zero the gradients: Sinew does both.
        evaluate(first, last): (sum of the losses, number correct) over test samples [first, last).
        """
        def train(indices):
            return float(train_step(indices))

        ev = None
        if evaluate is not None:
            def ev(first, last):
                model.module.eval()
                try:
                    with torch.no_grad():
                        loss, correct = evaluate(first, last)
                finally:
                    model.module.train()
                return float(loss), int(correct)

        model.module.train()
        try:
            return self._job.run(model._work, int(train_size), train, ev, int(test_size))
        except Error as e:
            self._fail(e)

    def _fail(self, e):
        """A Sinew error: its message, and the exit with its code (docs/usage.md), MPI finalized."""
        print(f"[sinew] rank {self.rank}: {e}", file=sys.stderr)
        self.exit(getattr(e, "exit_code", 1))

    def exit(self, code=0):
        """Finalizes MPI (bounded: it cannot hang after a failure) and exits with `code`."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._job.exit(int(code))
        sys.exit(int(code))
