"""Sinew's samplers as torch Samplers.

DistributedSampler (job.sampler(dataset)): for the script's own loop and its DataLoader, worker processes
included; see loop.py for how a step's samples reach the loop and what a resize costs.

ElasticSampler (job.state()): the Horovod-style API's.

Sinew's sampler chooses every step's samples: each training sample exactly once per epoch across the ranks,
also when the group shrinks or grows in the middle of an epoch, and (with --audit-dir) every sample used is
recorded for mpi_scripts/check-audit.py. ElasticSampler hands them out: iterating it yields this rank's indices
of each micro-batch, and between two of them Sinew ends the step (the reduction of the gradients the last
backward produced, the optimiser step, the step boundary) and evaluates when an epoch ends.
"""
import torch

from . import _core

__all__ = ["DistributedSampler", "ElasticSampler"]


class DistributedSampler(torch.utils.data.Sampler):
    """This rank's sample indices for the script's DataLoader (make it with job.sampler(dataset)):

        loader = DataLoader(dataset, sampler=job.sampler(dataset), batch_size=B, num_workers=K, ...)

    Each epoch the group uses every sample once; each of the loader's batches is one step of this rank (B
    samples; the epoch's last step may give fewer, and a rank with none in it gets one stand-in sample that
    weighs nothing, so that every rank runs every step). When the group changes (a failure, a resize), the
    batches the loader fetched ahead for the old group are dropped and the loader fetches the new plan.
    len() is this rank's share of an epoch at the group's current size.
    """

    def __init__(self, loop, dataset, shuffle=True):
        super().__init__()
        if isinstance(dataset, int):
            size = dataset
        else:
            try:
                size = len(dataset)
            except TypeError:
                raise _core.UsageError(
                    f"job.sampler() takes a map-style Dataset (with __len__ and __getitem__) or a number of "
                    f"samples, not {type(dataset).__name__}: for an IterableDataset or a stream, give the number of "
                    "samples an epoch has and index your data with the sampler's indices") from None
        if size <= 0:
            raise _core.UsageError(f"job.sampler(): the data set has {size} samples")
        self.dataset_size = size
        self.shuffle = bool(shuffle)
        self._loop = loop
        loop.add_sampler(self)

    def __iter__(self):
        return self._loop.sampler_iter(self)

    def __len__(self):
        return self._loop.sampler_len(self)

    def set_epoch(self, epoch):
        """Accepted for DDP scripts and not needed: the order of each epoch is the group's (seeded by
        --seed and the epoch Sinew counts, also across resizes and replacements)."""
        del epoch

    def batches(self):
        """For a script without a DataLoader: yields this rank's indices (a list) of every step of the epoch,
        as the DataLoader would see them."""
        return self._loop.batches(self)


class ElasticSampler(torch.utils.data.Sampler):
    """Yields this rank's sample indices (a list of ints) for each micro-batch until training is over.

    Made by Job.state(); builds the job's session (a hot spare waits there until it is promoted). Between two
    items the step the previous one belonged to may end: compute forward and one backward() of each batch
    before asking for the next. A rank failure raises sinew.CommFailure out of the iteration (Job.elastic
    recovers and iterates again from the lost step).
    """

    def __init__(self, job, model, train_size, evaluate=None, test_size=0, probe=None):
        self._job = job
        self._model = model
        self._loss = 0.0
        self.epoch = 0
        self.step = 0
        self.micro_batch = 0

        ev = model._evaluator(evaluate)
        model.module.train()
        train = None
        if probe is not None:
            def train(indices):
                return float(probe(indices))
        # With a probe (forward and backward of some samples), the buckets follow backward's order and
        # --algorithm auto can measure a step; without one, the module's order reversed is the bucket order
        # and auto is refused with a clear message.
        self._active = job._job.start(model._work, int(train_size), train, ev, int(test_size))

    def report(self, loss):
        """The mean loss over the last micro-batch (for the metrics and the progress line)."""
        self._loss = float(loss)

    def __iter__(self):
        from .loop import caller
        if caller(torch.utils.data.BatchSampler) is not None:
            raise _core.UsageError(
                "job.state()'s sampler yields whole batches (lists of indices): give it to a DataLoader as "
                "batch_sampler=state.sampler, not sampler=; or use job.sampler(dataset) with sampler= and the "
                "script's own loop")
        if not self._active:
            return
        while True:
            b = self._job._job.next(self._loss)
            self._loss = 0.0
            if b is None:
                return
            indices, self.micro_batch, _, self.step, self.epoch = b
            yield indices

    def __len__(self):
        raise TypeError("ElasticSampler has no length: the group's size, and with it the steps, may change")
