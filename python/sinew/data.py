"""sinew.data.ElasticSampler: Sinew's sampler as a torch Sampler.

Sinew's sampler chooses every step's samples: each training sample exactly once per epoch across the ranks,
also when the group shrinks or grows in the middle of an epoch, and (with --audit-dir) every sample used is
recorded for mpi_scripts/check-audit.py. ElasticSampler hands them out: iterating it yields this rank's indices
of each micro-batch, and between two of them Sinew ends the step (the reduction of the gradients the last
backward produced, the optimiser step, the step boundary) and evaluates when an epoch ends.
"""
import torch

from . import _core

__all__ = ["ElasticSampler"]


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
        try:
            # With a probe (forward and backward of some samples), the buckets follow backward's order and
            # --algorithm auto can measure a step; without one, the module's order reversed is the bucket
            # order and auto is refused with a clear message.
            self._active = job._job.start(model._work, int(train_size), train, ev, int(test_size))
        except _core.Error as e:
            job._fail(e)

    def report(self, loss):
        """The mean loss over the last micro-batch (for the metrics and the progress line)."""
        self._loss = float(loss)

    def __iter__(self):
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
