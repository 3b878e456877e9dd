"""Sinew for PyTorch: your own training script, elastic and fault-tolerant, by a few lines.

    import sinew
    job = sinew.init(checkpoint_dir="ckpt", checkpoint_every=200)   # or the launcher's options
    model = job.wrap(Net())                                          # an nn.Module, as DDP's wrapper
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr) # any torch.optim optimizer
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)             # any lr_scheduler
    loader = DataLoader(dataset, sampler=job.sampler(dataset), batch_size=64, num_workers=2)
    for epoch in job.epochs(range(1, args.epochs + 1)):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()          # .grad holds the global mean gradient when it returns
            optimizer.step()
        test(model)
        scheduler.step()

When a rank dies anywhere in that loop, the survivors recover in place inside the Sinew call that saw the
failure (backward, step, the next batch): the state comes from their memory, the optimizer, the scheduler
and the registered objects go back to the last completed step, the lost step's samples come again from the
loader (repartitioned over the survivors, every sample once per epoch), and a replacement started as this
same script joins at the current epoch and step. See docs/pytorch.md.

Errors are exceptions: sinew.Error and its kinds (UsageError, DataError, CheckpointError, CommFailure,
RelaunchRequest), each with the exit code of docs/usage.md; one that the script does not catch ends the
process with that code and one line, MPI finalized (bounded). Nothing here calls sys.exit.
"""

import os
import sys

import torch  # noqa: F401  (first: the extension module links libtorch, which torch loads)

# Open MPI loads its components as plugins that resolve symbols of libmpi: it must be loaded globally, as
# mpi4py does, or MPI_Init fails inside the extension module.
_flags = sys.getdlopenflags()
sys.setdlopenflags(_flags | os.RTLD_GLOBAL)
try:
    from . import _core
finally:
    sys.setdlopenflags(_flags)

Error = _core.Error                      # every Sinew error; .exit_code is the process's code for it
CommFailure = _core.CommFailure          # a rank failed (recovered in place by the loop; 5 if it cannot be)
UsageError = _core.UsageError            # a bad option, value or use of the API (2)
DataError = _core.DataError              # a data set missing or corrupt (3)
CheckpointError = _core.CheckpointError  # a checkpoint that cannot be used (4)
RelaunchRequest = _core.RelaunchRequest  # stopped for a relaunch by the launcher (75)
# Raised by the C++ core, an error carries its own exit code; raised here, its kind's.
for _kind, _code in ((Error, 1), (UsageError, 2), (DataError, 3), (CheckpointError, 4), (CommFailure, 5),
                     (RelaunchRequest, 75)):
    _kind.exit_code = _code


class Left(Error):
    """This process left the group (on request, SIGUSR2, or the job server's schedule): it has nothing more to
    train. Uncaught, the process ends with exit code 0, as sinew-train's leavers do."""

    def __init__(self, message):
        super().__init__(message)
        self.exit_code = 0


from .job import Job, Model, RandomState, State, init, options_help  # noqa: E402  (after _core and the errors)
from . import data  # noqa: E402,F401

__all__ = ["CheckpointError", "CommFailure", "DataError", "Error", "Job", "Left", "Model", "RelaunchRequest",
           "RandomState", "State", "UsageError", "data", "init", "options_help"]
