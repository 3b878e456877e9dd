"""The script's own loop: DDP's habits, elastic.

    for epoch in job.epochs(range(1, args.epochs + 1)):
        for x, y in loader:                     # DataLoader(dataset, sampler=job.sampler(dataset), ...)
            optimizer.zero_grad()
            loss = criterion(model(x), y)         # model = job.wrap(net)
            loss.backward()
            optimizer.step()
        scheduler.step()

How Sinew sees the steps of a loop it does not own:
- A step begins at the model's first forward in training mode with gradients on after the last step ended
  (settle(): the last step's boundary, its checkpoint, a resize). The batch in that forward is the oldest one
  the sampler handed the DataLoader (the loader keeps the order); it must be the step's plan (Session.peek),
  else the group changed after the loader fetched it (its worker processes fetch ahead): the iteration is
  dropped (forward and backward run, nothing is reduced or stepped) and the loader is restarted on the new plan.
- backward(): the gradient hooks feed the bucketed reduction; when backward is over (autograd's final
  callback) the reduction is complete and .grad holds the global mean.
- optimizer.step(): the algorithm's update (Sinew calls the optimizer's real step, with --lr-scaling's factor).
- A failure seen in any of these is recovered in place where it surfaced; the rest of that iteration is a
  no-op, and at the next step's beginning the registered state (the LR scheduler, the optimizer's settings,
  registered objects, integer buffers) goes back to the last completed step, taken from the most advanced
  member, so that a redone step advances nothing twice. A script's own local counters (enumerate's index)
  do count the dropped iteration: count with the job's step (job.step) or a registered object instead.
"""
import base64
import collections
import copy
import gc
import pickle
import sys
import weakref

import torch
from torch.utils.data import BatchSampler
from torch.utils.data.dataloader import DataLoader, _BaseDataLoaderIter

from . import CommFailure, Error, Left, RelaunchRequest, UsageError
from .optim import adopt, replaced_grads

# Options that belong to the step-function APIs: in the script's loop the optimizer, its learning rate and
# schedule, the batch and the epochs are the script's own.
_NOT_IN_OWN_LOOP = {
    "--lr": "the learning rate is the optimizer's (torch.optim.X(model.parameters(), lr=...))",
    "--lr-schedule": "the schedule is the script's lr_scheduler",
    "--warmup-steps": "the schedule is the script's lr_scheduler",
    "--optimizer": "the optimizer is the script's torch.optim one",
    "--momentum": "the optimizer's settings are its own",
    "--weight-decay": "the optimizer's settings are its own",
    "--nesterov": "the optimizer's settings are its own",
    "--global-batch": "each DataLoader batch is one step",
}


_AS_SAMPLER = ("job.sampler() yields sample indices: give it to the DataLoader as sampler=, with batch_size=B "
               "(the batch per rank), not as batch_sampler=")


def caller(kind, depth=12):
    """The `self` of the nearest calling frame that is a `kind` (None): who iterates a sampler."""
    f = sys._getframe(2)
    for _ in range(depth):
        if f is None:
            return None
        me = f.f_locals.get("self")
        if isinstance(me, kind):
            return me
        f = f.f_back
    return None


def _live(kind):
    """The live objects of type `kind` (by their type: isinstance() would ask lazy modules for attributes)."""
    return [o for o in gc.get_objects() if issubclass(type(o), kind)]


def _referrers(obj, kind):
    """Objects of type `kind` that refer to `obj` (instances, also through their __dict__)."""
    out = []
    for r in gc.get_referrers(obj):
        if isinstance(r, kind):
            out.append(r)
        elif isinstance(r, dict):
            out.extend(o for o in gc.get_referrers(r) if isinstance(o, kind) and getattr(o, "__dict__", None) is r)
    return out


class Loop:
    def __init__(self, job):
        self.job = job
        self.core = job._job
        self.sampler = None
        self.registered = {}
        self.on_resize = []
        self.optimizer = None
        self.model = None
        self.started = False
        self.done = False
        self.settled = False
        self.void = False          # this iteration is not a step (recovered, or a stale batch)
        self.stepped = False       # the optimizer stepped in this step
        self.error = None          # an error seen inside backward, raised at optimizer.step()
        self.snap = None           # the registered state at the last step boundary
        self.snap_step = -1
        self.loaded = None         # the registered state of a checkpoint resumed from
        self.restore_pending = False
        self.synced_epoch = None
        self.resetting = False
        self.epochs_total = None
        self.batch_size = None
        self.fifo = collections.deque()  # plans of the batches handed to the loader, oldest first
        self.plan_gen = 0                # + 1 at every restart of the loaders
        self.plan_skip = 0               # steps the restarted plan skips (begun on a batch in hand)
        self.replan = False              # the group changed at the boundary: restart the loaders
        self.planning = False            # a loader's first pull is settling (its iterator is being made)
        self.rewind_at_forward = False   # a replacement: the group's state again at its first step
        self.iters = weakref.WeakSet()   # DataLoader iterators that draw from the sampler
        self.loaders = weakref.WeakSet()
        self.dropped = 0           # iterations dropped: stale batches after a change of the group
        self.recoveries = 0

    # ---- set-up ------------------------------------------------------------------------------------------
    def add_sampler(self, sampler):
        if self.started:
            raise UsageError("job.sampler() after training started: make the DataLoader before the epoch loop")
        if self.sampler is not None:
            raise UsageError("a second job.sampler(): one training set per job (evaluate on every rank, or on "
                             "a shard of your own: the test set needs no Sinew sampler)")
        self.sampler = sampler

    def register(self, *objects, **named):
        if self.started:
            raise UsageError("job.register() after training started: register before the epoch loop")
        for i, o in enumerate(objects):
            named[f"{type(o).__name__}#{len(self.registered) + i}"] = o
        for name, o in named.items():
            if not (callable(getattr(o, "state_dict", None)) and callable(getattr(o, "load_state_dict", None))):
                raise UsageError(f"job.register(): {name} ({type(o).__name__}) has no state_dict()/load_state_dict()")
            if isinstance(o, torch.optim.Optimizer):
                self.optimizer = o
            else:
                self.registered[name] = o

    def _find_optimizer(self, params):
        ids = {id(p) for _, p in params}
        if self.optimizer is not None:
            return self.optimizer
        found = [o for o in _live(torch.optim.Optimizer)
                 if any(id(p) in ids for g in o.param_groups for p in g["params"])]
        if len(found) > 1:
            raise UsageError(f"{len(found)} optimizers update the model's parameters: use one optimizer (with "
                             "param groups for different settings)")
        return found[0] if found else None

    def _find_schedulers(self):
        if self.optimizer is None:
            return
        known = {id(o) for o in self.registered.values()}
        kinds = tuple(k for k in (getattr(torch.optim.lr_scheduler, "LRScheduler", None),
                                  getattr(torch.optim.lr_scheduler, "ReduceLROnPlateau", None)) if k)
        for s in _live(kinds):
            if getattr(s, "optimizer", None) is self.optimizer and id(s) not in known:
                self.registered[f"{type(s).__name__}#{len(self.registered)}"] = s

    def _find_batch_size(self):
        """The DataLoader's batch size (the batch per rank) and drop_last, from the loader over the sampler."""
        batchers = _referrers(self.sampler, BatchSampler)
        loaders = _referrers(self.sampler, DataLoader)
        if any(d.batch_sampler is self.sampler for d in loaders):
            raise UsageError(_AS_SAMPLER)
        self.loaders = weakref.WeakSet(loaders)
        sizes = {(b.batch_size, b.drop_last) for b in batchers}
        if len(sizes) > 1:
            raise UsageError(f"DataLoaders with different batch sizes over one job.sampler(): {sorted(sizes)}")
        given = self.job._given
        option = None
        if "--batch-size" in given:
            option = int(self.job._job.batch_size)
        if not sizes:
            if option is None:
                raise UsageError("job.sampler(dataset) is in no DataLoader: give it one "
                                 "(DataLoader(dataset, sampler=job.sampler(dataset), batch_size=B)), or give "
                                 "sinew.init(batch_size=B) when the script takes indices from sampler.batches()")
            return option
        (size, drop_last), = sizes
        if drop_last:
            raise UsageError("DataLoader(drop_last=True) with job.sampler(): Sinew trains every sample once per "
                             "epoch, the last step with fewer; leave drop_last out")
        if option is not None and option != size:
            raise UsageError(f"batch_size={option} for Sinew but {size} for the DataLoader: the DataLoader's is the "
                             "batch per rank; leave Sinew's out")
        return size

    def ensure_started(self):
        if self.started:
            return
        job = self.job
        if len(job._models) != 1:
            raise UsageError(f"the script's loop trains one model: job.wrap() was called {len(job._models)} times")
        if self.sampler is None:
            raise UsageError("no job.sampler(): give the DataLoader Sinew's sampler, "
                             "DataLoader(dataset, sampler=job.sampler(dataset), batch_size=B)")
        if self.epochs_total is None:
            if "--epochs" not in job._given:
                raise UsageError("Sinew needs the number of epochs: loop with `for epoch in job.epochs(N)` (or "
                                 "job.epochs(range(1, N + 1))), so that a replacement joins at the right one")
            self.epochs_total = int(job._job.epochs)
        for option, why in _NOT_IN_OWN_LOOP.items():
            if option in job._given:
                raise UsageError(f"{option} is for Job.run/Job.state; in the script's own loop {why}")
        self.model = model = job._models[0]
        if model.optimizer is not None:
            # (Adopted at wrap for Sinew's own steps, its step() now refuses: say why, whatever the stage.)
            raise UsageError("job.wrap(module, optimizer=...) is for Job.run/Job.state, where Sinew steps the "
                             "optimizer; in the script's own loop make the optimizer after job.wrap(module), over "
                             "model.parameters(), and step it yourself: drop optimizer= from job.wrap()")
        self.batch_size = self._find_batch_size()
        params = model._named_params
        self.optimizer = self._find_optimizer(params)
        work = model._work
        from .memory import check as check_memory
        check_memory(job, model, self.optimizer)  # before the state is made: a model too large says which stage fits
        if self.optimizer is not None:
            self._find_schedulers()
            job._adopted.add(id(self.optimizer))
            adopt(self.optimizer, work, params, own_loop=True, step_gate=self.optimizer_step)
        else:
            # Updates by hand (p.data.add_(p.grad, ...)): Sinew's update does nothing.
            work.use_optimizer("none (the script's own update)", [], lambda factor: None, lambda: 0,
                               lambda n: None, None)
        self.frozen = [(n, p) for n, p in model.module.named_parameters() if not p.requires_grad]
        self.other_buffers = [(n, b) for n, b in model.module.named_buffers() if b.dtype != torch.float32]
        work.set_backward_done(self._backward_done)
        work.set_extra_state(self._extra_state)
        work.set_extra_loader(self._load_extra)
        shuffle = self.sampler.shuffle and self.job._job.shuffle  # (sinew.init(shuffle=False) too)
        if not self.core.start_loop(work, self.sampler.dataset_size, self.batch_size, self.epochs_total, shuffle):
            self.started = True
            self._finish()  # a hot spare dismissed at the end: it never trained
            return
        self.started = True
        if self.loaded is not None:
            self.snap = self.loaded
        elif not self.core.joined:
            self._take_snapshot()
        self.snap_step = self.core.step
        while True:
            try:
                self._sync()  # rank 0's frozen parameters, buffers and registered state everywhere (DDP does so)
                break
            except CommFailure:
                self._recover(sync=False)
        # A replacement runs the script's code up to its first step (making its loader draws a seed): the group's
        # state is put back there, where the others' is.
        self.rewind_at_forward = self.core.joined

    # ---- the state beside the flat buffers -----------------------------------------------------------------
    def _take_snapshot(self):
        opt = self.optimizer
        self.snap = {
            "registered": {n: copy.deepcopy(o.state_dict()) for n, o in self.registered.items()},
            "groups": [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
            if opt is not None else [],
            "buffers": {n: b.detach().clone() for n, b in self.other_buffers},
        }
        self.snap_step = self.core.step

    def _apply(self, snap):
        with torch.no_grad():
            for n, o in self.registered.items():
                if n in snap["registered"]:
                    o.load_state_dict(copy.deepcopy(snap["registered"][n]))
            if self.optimizer is not None:
                for g, s in zip(self.optimizer.param_groups, snap["groups"]):
                    g.update(copy.deepcopy(s))
            for n, b in self.other_buffers:
                _copy_checked(b, snap["buffers"].get(n), "buffer", n)

    def _extra_state(self):
        return base64.b64encode(pickle.dumps(self.snap)).decode("ascii") if self.snap is not None else ""

    def _load_extra(self, text):
        self.loaded = pickle.loads(base64.b64decode(text)) if text else None

    def _sync(self):
        """Collective, after every change of membership: the registered state of the most advanced member
        (the lowest rank whose state is of the group's step), with the frozen parameters, everywhere."""
        have = self.snap is not None and self.snap_step == self.core.step
        blob = pickle.dumps({"snap": self.snap, "frozen": {n: p.detach() for n, p in self.frozen}}) if have else b""
        got = self.core.share(blob, have)
        if got:
            d = pickle.loads(got)
            self.snap = d["snap"]
            self.snap_step = self.core.step
            with torch.no_grad():
                for n, p in self.frozen:
                    _copy_checked(p, d["frozen"].get(n), "frozen parameter", n)
            self._apply(self.snap)
        self.synced_epoch = self.core.group_epoch

    # ---- failures ------------------------------------------------------------------------------------------
    def _recover(self, sync=True):
        """In place, after a CommFailure out of a core call: the rest of this iteration does nothing, and the
        next step begins from the last completed step's state (the most advanced member's)."""
        while True:
            try:
                self.core.recover()
                if sync:
                    self._sync()
                break
            except CommFailure:
                continue
        self.recoveries += 1
        if self.model is not None and self.model._units is not None:
            self.model._units.reset()
        self.void = True
        self.settled = False
        self.restore_pending = True
        self._reset_loaders()
        self._resized()

    def _resized(self):
        for fn in self.on_resize:
            fn(self.job)

    def _reset_loaders(self, skip=0):
        """The batches the loaders fetched ahead were planned for the old group: drop them, fetch the new plan
        (from the step `skip` steps after the next one: 1 when the next one has begun on a batch in hand)."""
        self.fifo.clear()
        self.plan_gen += 1
        self.plan_skip = skip
        if self.planning:
            return  # inside a loader's first pull (its start): it plans from here, nothing was fetched ahead
        self.resetting = True
        try:
            for it in list(self.iters):
                if getattr(it, "_shutdown", False):  # an iterator whose epoch ended (its workers are gone)
                    self.iters.discard(it)
                    continue
                loader = next((d for d in self.loaders if d.batch_sampler is getattr(it, "_index_sampler", None)),
                              None)
                if loader is None or not hasattr(it, "_reset"):
                    raise UsageError("Sinew cannot restart this DataLoader's iterator after a change of the group "
                                     f"({type(it).__name__}): use torch.utils.data.DataLoader with job.sampler()")
                it._reset(loader)
        finally:
            self.resetting = False

    def _guarded(self, fn):
        """fn() (a core call); a failure is recovered from and the iteration becomes a no-op (None)."""
        try:
            return fn()
        except CommFailure:
            self._recover()
            return None

    # ---- the steps -----------------------------------------------------------------------------------------
    def settle(self):
        """Between two steps (idempotent): the last step's update if the script made it by hand, its boundary
        (agreement, checkpoint, resize), the epoch's end. True: a step comes; False: training is over."""
        if self.settled or self.done:
            return self.settled
        while True:
            try:
                if self.restore_pending:
                    # The iteration that was no step ran forward passes: the buffers go back to the last completed
                    # step's (C++ kept them), the registered state to the snapshot's.
                    self.model._work.restore_buffers()
                    self._apply(self.snap)
                    self.restore_pending = False
                if self.core.phase != 0:
                    if self.optimizer is not None:
                        raise UsageError(
                            f"step {self.core.step + 1}: backward() ran but optimizer.step() was not called before "
                            "the next step began: call it once per batch (to accumulate gradients over several "
                            "batches, sum their losses and call backward() once)")
                    self.core.update(float("nan"))  # (the script's loss is its own)
                self._take_snapshot()
                more = self.core.settle()
                if more and self.core.group_epoch != self.synced_epoch:  # grown or shrunk at the boundary
                    self._sync()
                    self.replan = True  # the loaders' plans were the old group's (on_forward restarts them)
                    self._resized()
                break
            except CommFailure:
                self._recover()
        self.settled = more
        self.done = not more
        return more

    def on_forward(self, model):
        """The model's forward in training mode with gradients on: the first of a step begins it."""
        if self.error is not None:
            e, self.error = self.error, None
            raise e
        if self.started and self.core.phase == 1 and not self.void:
            return  # a further forward in the same step, before its backward
        self.ensure_started()
        self.void = False
        if not self.fifo:
            raise UsageError("the model was called in training mode with gradients on outside the batches of "
                             "job.sampler()'s DataLoader: evaluate under model.eval() and torch.no_grad()")
        # The batch in this forward is the oldest the loader took from the sampler, whatever settle() does to
        # the loaders (a resize at the boundary restarts them).
        expected = self.fifo.popleft()
        if not self.settle():
            if self.job.summary is not None:
                raise UsageError("the model was called for training after training ended (job.epochs() is over)")
            # The run ended inside the loader's epoch (--max-steps, a stop): Left or RelaunchRequest here, else
            # this batch is no step and the loaders run dry.
            self._finish()
            self.void = True
            self.restore_pending = True
            self._reset_loaders()
            return
        replan, self.replan = self.replan, False
        if _standin(self.core.peek(0)) != expected:
            # Fetched for the group as it was: dropped, and the loader restarted on the new plan.
            self.void = True
            self.restore_pending = True
            self.settled = False  # the next forward settles again: the restore, the snapshot
            self.dropped += 1
            self._reset_loaders()
            return
        if self.restore_pending or self.rewind_at_forward:  # (settle() had settled before: a dropped batch; a
            self.model._work.restore_buffers()             # replacement's first step)
            self._apply(self.snap)
            self.restore_pending = self.rewind_at_forward = False
        # The state a failure in this step goes back to, and a replacement starts from: as it is now, after the
        # script's code between the steps and the loader's draws at an epoch's start (settle() took the one the
        # boundary's checkpoint holds).
        self._take_snapshot()
        if self._guarded(self.core.begin) is None:
            return
        # A step: also where settle() recovered from a failure on the way here (its recovery voided the
        # iteration as it then was; this batch is the new plan's and the step has begun).
        self.void = False
        self.settled = False
        self.stepped = False
        if replan:
            # The group changed and this batch is still this rank's share of the step: trained; what the loaders
            # fetched after it was planned for the old group, and they restart from the next step.
            self._reset_loaders(skip=1)

    def _backward_done(self):
        """Autograd's final callback of the step's backward: the reduction is complete."""
        units = self.model._units
        if units is not None:
            units.release_all(in_backward=True)
            if units.failed is not None:  # a unit's gather failed inside backward: nothing of it counts
                units.failed = None
                self._recover()
                return
        try:
            self.core.reduce()
            # A .grad set to None before backward made autograd allocate a new tensor; the hooks took its value
            # into the flat buffer, which was reduced: .grad is that view again.
            _repoint(self.model)
        except CommFailure:
            self._recover()
        except Error as e:
            self.error = e
            self.void = True

    def optimizer_step(self):
        """The adopted optimizer's step() (the script's call)."""
        if self.error is not None:
            e, self.error = self.error, None
            raise e
        if self.void:
            return None  # this iteration is not a step: nothing is updated
        if self.core.phase == 0:
            if self.stepped:
                raise UsageError(f"optimizer.step() twice in step {self.core.step}: once per batch")
            raise UsageError("optimizer.step() before the model's forward in this step (call model(x) and "
                             "loss.backward() first)")
        bad = replaced_grads(self.model._work, self.model._named_params)
        if bad and self.core.phase == 2:
            raise UsageError(f"the .grad of '{bad[0]}' was replaced by another tensor after backward(): the reduced "
                             "gradient is in the view it replaced; change .grad in place (p.grad.mul_(...), "
                             "clip_grad_norm_) instead")
        self._check_sharded_gradients()
        # The script's loss is its own (NaN: the progress line leaves it out); its optimizer's learning rate is
        # what the metrics report.
        lr = float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else float("nan")
        self._guarded(lambda: self.core.update(float("nan"), lr))
        self.stepped = True
        return None

    def step_sum(self, value, op="sum"):
        """A sum (or max) over the group inside a step, between backward() and step() (model.clip_grad_norm_):
        None where this iteration is not a step (a recovery in it, or one inside this sum: the group changed
        and a replacement is not in this step, so the sum is not made again, unlike job.all_reduce)."""
        if self.void:
            return None
        try:
            return self.core.allreduce([float(value)], op == "max")[0]
        except CommFailure:
            self._recover()
            return None

    def _check_sharded_gradients(self):
        """shard="gradients": the rest of the gradients is NaN on this rank (it holds only its shards); a NaN in
        its own shards means they were read and written back through it, as torch.nn.utils.clip_grad_norm_
        over all parameters does (its norm becomes NaN): say so instead of stepping into NaN."""
        held = self.core.sharded_gradients()
        if not held:
            return
        flat = self.model._work.flat_grads
        # A sum per range: NaN if any element is, one pass and no temporary (torch.isfinite made two of the
        # range's size: +77 MB per rank on shard_torch_bench's transformer).
        if not any(bool(torch.isnan(flat[o:o + c].sum())) for o, c in held):
            return
        raise UsageError("non-finite gradients in this rank's shards before optimizer.step(): with "
                         "shard='gradients' each rank holds only its shards of the reduced gradients (the rest is "
                         "NaN), so a function over all of them (torch.nn.utils.clip_grad_norm_, a gradient norm "
                         "for the log) sees NaN; clip with model.clip_grad_norm_(max_norm) instead, or use "
                         "shard='optimizer' (or the loss diverged: lower the learning rate)")

    # ---- data --------------------------------------------------------------------------------------------------
    def sampler_iter(self, sampler):
        it = caller(_BaseDataLoaderIter)
        if it is not None:
            self.iters.add(it)
            if caller(BatchSampler) is None:
                raise UsageError(_AS_SAMPLER)
        return self._plans()

    def _plans(self, whole=False):
        """This rank's plans of the epoch's steps from the next one on, as the group is now (its indices one by
        one, or `whole` lists); each goes into the FIFO that forward() takes the steps' batches from."""
        self.ensure_started()
        if not self.resetting:
            self.planning = True
            try:
                more = self.settle()
            finally:
                self.planning = False
            if not more:
                return
        self.fifo.clear()
        gen, base, handed = self.plan_gen, self.core.step, self.plan_skip
        self.plan_skip = 0
        while True:
            if gen != self.plan_gen:  # the group changed (the loaders were restarted): plan from here again
                gen, base, handed = self.plan_gen, self.core.step, self.plan_skip
                self.plan_skip = 0
            idx = self.core.peek(max(handed - (self.core.step - base), 0))
            if idx is None:
                return
            idx = _standin(idx)
            self.fifo.append(idx)
            handed += 1
            if whole:
                yield list(idx)
            else:
                yield from idx

    def sampler_len(self, sampler):
        world = self.job.size
        b = self.batch_size or (int(self.job._job.batch_size) if "--batch-size" in self.job._given else 1)
        n = sampler.dataset_size
        full, rest = divmod(n, world * b)
        mine = rest // world + (1 if self.job.rank < rest % world else 0)
        return full * b + (max(mine, 1) if rest else 0)

    def batches(self, sampler):
        """Without a DataLoader: this rank's indices of every step of the epoch, a list per step."""
        del sampler
        return self._plans(whole=True)

    # ---- epochs and the end -----------------------------------------------------------------------------------
    def epochs(self, epochs):
        items = list(range(epochs)) if isinstance(epochs, int) else list(epochs)
        if not items:
            raise UsageError("job.epochs(): no epochs to train")
        if self.epochs_total not in (None, len(items)):
            raise UsageError(f"job.epochs(): {len(items)} epochs, but {self.epochs_total} were given before")
        if "--epochs" in self.job._given and int(self.job._job.epochs) != len(items):
            raise UsageError(f"epochs={self.job._job.epochs} for Sinew but job.epochs() has {len(items)}: leave "
                             "Sinew's out")
        self.epochs_total = len(items)
        return self._epochs(items)

    def _epochs(self, items):
        self.ensure_started()
        last = None
        while self.settle():
            e = self.core.session_epoch
            if e == last:
                raise UsageError(f"epoch {items[e]} is not over: the loop left the DataLoader before the end of the "
                                 "epoch (break?); Sinew's epoch is every sample once, so let the loader run out "
                                 "(sinew.init(max_steps=N) stops early)")
            last = e
            yield items[e]
        self._finish()

    def _finish(self):
        if self.job.summary is not None:
            return
        if self.restore_pending:  # a batch that was no step ran forward passes after the last step
            self.model._work.restore_buffers()
            self._apply(self.snap)
            self.restore_pending = False
        s = self.core.finish()
        self.job.summary = s
        if s["left"]:
            raise Left("this process left the group (on request or by the job server's schedule)")
        if s["stopped_by_signal"] or s["below_min_ranks"]:
            why = "a stop signal" if s["stopped_by_signal"] else "fewer ranks than --min-ranks"
            e = RelaunchRequest(f"training stopped at step {s['steps']} by {why}, after a checkpoint: relaunch "
                                "with --resume auto (sinew-run does)")
            e.exit_code = s["exit_code"]
            raise e
        self.job.exit_code = s["exit_code"]

    # ---- the script's collectives ---------------------------------------------------------------------------
    def all_reduce(self, values, op="sum"):
        if op not in ("sum", "mean", "max"):
            raise UsageError(f"job.all_reduce(op='{op}'): use 'sum', 'mean' or 'max'")
        self.ensure_started()
        t = torch.as_tensor(values, dtype=torch.float64)
        flat = t.reshape(-1).tolist()
        while True:
            try:
                out = self.core.allreduce(flat, op == "max")
                break
            except CommFailure:
                self._recover()
        r = torch.tensor(out, dtype=torch.float64).reshape(t.shape)
        if op == "mean":
            r /= self.job.size
        if torch.is_tensor(values):
            return r.to(values.dtype)
        return r.item() if r.dim() == 0 else r.tolist()


def _standin(indices):
    """A step's indices for this rank; a rank without samples in it runs it on one that weighs nothing."""
    if indices is None:
        return None
    return list(indices) if len(indices) else [0]


def _copy_checked(dst, src, what, name):
    if src is None:
        raise UsageError(f"{what} '{name}' is missing on the rank the state comes from: build the same model "
                         "everywhere")
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise UsageError(f"{what} '{name}' is {src.dtype} {list(src.shape)} on the rank the state comes from and "
                         f"{dst.dtype} {list(dst.shape)} here: build the same model everywhere")
    dst.copy_(src)


def _repoint(model):
    """Every .grad the view of its range of the flat gradient buffer again, values kept."""
    work = model._work
    grads, flat = work.flat_grads, work.flat_params
    for _, p in model._named_params:
        at = (p.data_ptr() - flat.data_ptr()) // flat.element_size()
        view = grads[at:at + p.numel()].view_as(p)
        if p.grad is None or p.grad.data_ptr() != view.data_ptr():
            p.grad = view


__all__ = ["Loop", "caller"]
