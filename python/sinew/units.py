"""shard="parameters" (ZeRO-3): each rank keeps its shards of the parameters, and a unit of the model (a
transformer layer: a wrap policy over submodules, as FSDP's) is gathered whole only while it runs.

    forward     unit k:  gather (before its forward) -> forward -> release. An nn.Embedding unit gathers only
                         the rows its indices name (a language model's largest unit: a few rows of it a step)
    backward    unit k:  gather (when the gradient of its output arrives) -> backward; released when a unit
                         that ran before it in this forward is gathered (its backward is over: backward runs
                         the forward's order in reverse) or when backward ends. A unit that is an
                         nn.Embedding is not gathered for backward: its gradient does not read its weight
    the root    the parameters in no unit (the last norm, the head), in two, or tied to a module outside their
                unit (a head that shares the embedding's weight): gathered at the model's forward, released
                when backward ends (or after the forward, without gradients)
    prefetch    the next shard_prefetch units (default 1) are gathered while a unit runs: in forward the units
                after it in the order the last forward ran them, in backward those before it in this forward's
                order (each unit ahead holds its parameters whole meanwhile). A prediction that misses costs
                memory until backward ends, never a wrong value: every rank predicts alike, from its own hooks

A unit is a list of ranges of the flat parameter buffer (its parameters, merged where adjacent). The gather is a
collective of the runtime (train/shards.hpp: an all-gather of each range from the shards' owners, run between the
gradient buckets' reduce-scatters in the same order on every rank; a prefetch hands it to the communication
thread and waits for it when the unit runs); the release gives the memory of what this
rank does not hold back to the system. Every rank must therefore run the model's forward as often as the others:
in training the loop sees to it; an evaluation must run on every rank, on as many batches (not on rank 0 alone).

Before training starts and after it ended (the model is whole again then) nothing is gathered or released. A model
that does not fit a rank whole stays sharded when training ends (the runtime checks each rank's memory limit then;
memory.py already at start where its figures show it): its state_dict() and forward are refused then, and the
end checkpoint holds it. An
iteration that a recovery voided gathers nothing: its results are dropped.
"""
import torch

from . import CommFailure, Error, UsageError


def _default_units(module):
    """The elements of the model's nn.ModuleList and nn.Sequential containers that hold parameters, outermost
    first (a transformer's layers): FSDP's usual wrapping of one unit per block; and each nn.Embedding outside
    them (its forward gathers only the rows its indices name, its backward nothing)."""
    units = []
    inside = set()

    def visit(m):
        for child in m.children():
            if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
                for el in child.children():
                    if any(p.requires_grad for p in el.parameters()) and id(el) not in inside:
                        units.append(el)
                        inside.update(id(x) for x in el.modules())
            elif isinstance(child, torch.nn.Embedding) and child.weight.requires_grad and id(child) not in inside:
                units.append(child)
                inside.add(id(child))
            if id(child) not in inside:
                visit(child)

    if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
        units = [el for el in module.children() if any(p.requires_grad for p in el.parameters())]
    else:
        visit(module)
    return units


def select_units(module, policy):
    """The unit modules of `module` for `policy`: None (the default above), a module class or a tuple/set of them
    (FSDP's ModuleWrapPolicy: every submodule of those classes, outermost), or a list of submodules."""
    if policy is None:
        return _default_units(module)
    if isinstance(policy, type) or (isinstance(policy, (tuple, set, frozenset)) and
                                    all(isinstance(c, type) for c in policy)):
        classes = tuple(policy) if not isinstance(policy, type) else (policy,)
        out, inside = [], set()
        for m in module.modules():
            if m is not module and isinstance(m, classes) and id(m) not in inside:
                out.append(m)
                inside.update(id(x) for x in m.modules())
        if not out:
            raise UsageError(f"units={policy}: the model has no submodule of {'/'.join(c.__name__ for c in classes)}")
        return out
    if isinstance(policy, (list, tuple)):
        mods = set(id(m) for m in module.modules())
        for m in policy:
            if not isinstance(m, torch.nn.Module) or id(m) not in mods:
                raise UsageError("units=[...]: every unit must be a submodule of the wrapped model")
        return list(policy)
    raise UsageError("units= takes a module class, a tuple of classes, or a list of submodules of the model")


def _runs(spans):
    """Sorted, merged (offset, count) ranges."""
    out = []
    for o, c in sorted(spans):
        if out and out[-1][0] + out[-1][1] == o:
            out[-1] = (out[-1][0], out[-1][1] + c)
        else:
            out.append((o, c))
    return out


class Units:
    """The units of one wrapped model and their hooks (installed by job.wrap when the job shards parameters)."""

    def __init__(self, model, policy):
        self.model = model
        self.job = model._job
        module = model.module
        units = select_units(module, policy)
        flat = model._work.flat_params
        base, size = flat.data_ptr(), flat.element_size()

        def span(p):
            return ((p.data_ptr() - base) // size, p.numel())

        flat_ids = {id(p) for _, p in model._named_params}
        holders = {}  # parameter -> the modules that hold it as their own
        for m in module.modules():
            for p in m.parameters(recurse=False):
                holders.setdefault(id(p), set()).add(id(m))
        owner = {}
        for i, u in enumerate(units):
            inside = {id(x) for x in u.modules()}
            for p in u.parameters():
                if id(p) in flat_ids:
                    # A weight tied to a module outside the unit (a language model's head to its embedding) is
                    # read outside it too: no unit's (-1).
                    owner.setdefault(id(p), set()).add(i if holders[id(p)] <= inside else -1)
        self.ranges = []
        for i, u in enumerate(units):
            mine = {id(p): p for p in u.parameters() if owner.get(id(p)) == {i}}
            self.ranges.append(_runs(span(p) for p in mine.values()))
        # Parameters in no unit, in two, or tied to a module outside their unit: the root's, whole for the step.
        self.root = _runs(span(p) for _, p in model._named_params if owner.get(id(p), {-1}) == {-1} or
                          len(owner[id(p)]) != 1)
        self.modules = units
        # Units whose backward reads none of their parameters: an nn.Embedding's gradient is its output's
        # gradient summed by index, the weight plays no part. They are not gathered again for backward (a
        # language model's largest unit, vocabulary x width: its memory and its all-gather saved each step).
        self.weightless_backward = [_weightless_backward(u) for u in units]
        # Their gradient is also written where it is kept, the rows of this step's indices only (see _IndexedGrad).
        # Their forward reads the rows its indices name and nothing else: only those are gathered, point to point
        # from their owners (table: (offset, count, width) of the weight in the flat buffer; None: gathered whole).
        self.tables = [_row_table(u, self.ranges[i], span) for i, u in enumerate(units)]
        self.row_gathers = 0  # forwards of an embedding unit that gathered only its rows
        self.flat_grads = model._work.flat_grads
        self.indexed_grads = 0  # backward passes that wrote an embedding's gradient in place
        self.resident = set()  # unit indices gathered now; -1 the root
        self.failed = None     # a CommFailure seen inside backward (raised to the loop when backward ends)
        self.ahead = self.job._job.shard_prefetch  # units prefetched
        self.pending = {}      # unit index -> ticket of its prefetched gather, not yet waited for
        self.order = []        # the units as this forward ran them
        self.last_order = []   # ... and as the last complete forward did (forward's prediction)
        self.back_at = 0       # backward's place in self.order (it runs it in reverse)
        self.prefetched = 0    # gathers prefetched, and of them waited for when their unit ran (hits)
        self.prefetch_hits = 0
        self.most_in_backward = 0  # the most units held whole at once in backward (gathered or being gathered)
        self.handles = []
        for i, u in enumerate(units):
            self.handles.append(u.register_forward_pre_hook(self._pre_forward(i)))
            self.handles.append(u.register_forward_hook(self._post_forward(i)))
        # state_dict() of the module or any submodule (DDP's habit is model.module.state_dict()) would hold this
        # rank's shards and zeros: refused while the parameters are sharded.
        for m in module.modules():
            self.handles.append(m.register_state_dict_pre_hook(self._refuse_state_dict))

    # ---- state ------------------------------------------------------------------------------------------------
    def active(self):
        """Whether the parameters are sharded now: training started and is not over."""
        loop = self.job._loop
        if loop is None or not loop.started or loop.done or self.job.summary is not None:
            return False
        return self.job._job.sharded_parameters

    def kept_sharded(self):
        """Whether training ended with the model left sharded (it did not fit a rank whole)."""
        return self.job.summary is not None and self.job._job.kept_sharded

    def _refuse_after_end(self, what):
        if not self.kept_sharded():
            return
        where = self.job._job.checkpoint_dir
        kept = (f"the trained model is the end checkpoint in {where}: sinew.checkpoint.state_dict(dir) in a process "
                "with the memory for it, or python3 -m sinew.checkpoint export dir model.pt" if where else
                "with no checkpoint directory the trained model was kept nowhere else: give one "
                "(sinew.init(checkpoint_dir=...)) to keep it")
        raise UsageError(f"{what} after training: the model stayed sharded when job.epochs() ended (it does not fit "
                         "a rank whole beside what the rank holds: the log says how much), so each rank holds only "
                         f"its shards of the parameters and the rest reads as zeros; {kept}")

    def reset(self):
        """After a recovery: the reshard left this rank its new shards only."""
        self.resident.clear()
        self.pending.clear()  # (the recovery cancelled them)
        self.order = []
        self.failed = None

    def _refuse_state_dict(self, module, prefix, keep_vars):
        self._refuse_after_end("state_dict()")
        if self.active():
            raise UsageError("state_dict() during training with shard='parameters' (model.state_dict(), "
                             "model.module.state_dict(), a submodule's): each rank holds only its shards of the "
                             "parameters, the rest reads as zeros; save with Sinew's checkpoints (checkpoint_dir=, "
                             "checkpoint_every=: they load at any size and stage, sinew.checkpoint exports them for "
                             "torch.load), or after job.epochs() ends, when the model is whole again")

    # ---- gather and release ----------------------------------------------------------------------------------
    def _gather(self, i, in_backward=False, hit=True, indices=None):
        ticket = self.pending.pop(i, 0)
        if i in self.resident or not self.active():
            return
        loop = self.job._loop
        if loop.void or self.failed is not None:
            return  # an iteration that updates nothing: its results are dropped (its recovery cancels prefetches)
        ranges = self.root if i < 0 else self.ranges[i]
        training = in_backward or (torch.is_grad_enabled() and self.model.training)  # (backward runs without)
        if ticket and hit:
            self.prefetch_hits += 1
        try:
            if indices is not None:
                offset, count, width = self.tables[i]
                idx = indices.detach().reshape(-1)
                # Rows outside the table are torch's to refuse (its forward raises), not a collective's.
                rows = torch.unique(idx[(idx >= 0) & (idx < count // width)])
                self.job._job.gather_rows((offset, count), width, rows.tolist())
                self.row_gathers += 1
            else:
                self.job._job.gather_params(ranges, ticket)
        except CommFailure as e:
            if training:
                self._failure(e, in_backward)
                return
            if "did not complete within" in str(e):
                raise UsageError("a gather of the model's parameters timed out outside training: with "
                                 "shard='parameters' the model's forward is a collective, so every rank must run "
                                 "it as often as the others (evaluate on every rank, on as many batches; not on "
                                 f"rank 0 alone) ({e})") from None
            raise  # a rank lost in an evaluation: the run ends for a relaunch from its newest checkpoint
        except Error as e:  # (not a failure: the ranks' collectives differ, as MPI_ERR_TRUNCATE says)
            raise UsageError("the ranks gathered different parts of the model: with shard='parameters' the model's "
                             "forward is a collective, so every rank must run it as often as the others, in the same "
                             "order (evaluate on every rank, on as many batches; not on rank 0 alone) "
                             f"({e})") from None
        self.resident.add(i)

    def _prefetch(self, units):
        """Hands the gathers of `units` (the next ones to run, nearest first) to the communication thread."""
        loop = self.job._loop
        if loop.void or self.failed is not None or not self.active():
            return
        for j in units:
            if j not in self.resident and j not in self.pending and self.tables[j] is None:
                self.pending[j] = self.job._job.prefetch_params(self.ranges[j])
                self.prefetched += 1

    def _next_in_forward(self, i):
        """The units after i in the last forward's order, where this forward has followed it so far."""
        k = len(self.order) - 1
        if not self.ahead or k >= len(self.last_order) or self.last_order[k] != i:
            return []
        return _distinct(self.last_order[k + 1:], i, self.ahead)

    def _backward_at(self, i):
        """Where backward is in this forward's order as unit i's backward begins: i's nearest place before the last
        one backward reached (it runs the order in reverse); None where i is not there (an autograd order that is
        not the forward's reversed: then nothing is released early and nothing prefetched)."""
        k = self.back_at - 1
        while k >= 0 and self.order[k] != i:
            k -= 1
        if k < 0:
            return None
        self.back_at = k
        return k

    def _done_in_backward(self, k):
        """The units whose backward is over at place k: those that ran after it in this forward, and not before."""
        return set(self.order[k + 1:]) - set(self.order[:k + 1])

    def _next_in_backward(self, i, k):
        """The units backward reaches after i at place k: those before it in this forward's order, in reverse (a
        unit whose backward reads no parameter is not gathered for it)."""
        if not self.ahead or k is None:
            return []
        return _distinct((j for j in reversed(self.order[:k]) if not self.weightless_backward[j]), i, self.ahead)

    def _failure(self, e, in_backward):
        if in_backward:
            self.failed = e  # autograd goes on (nothing is gathered any more); the loop recovers when it ends
        else:
            self.job._loop._recover()

    def _release(self, i):
        if i not in self.resident:
            return
        self.resident.discard(i)
        if self.active():
            self.job._job.release_params(self.root if i < 0 else self.ranges[i])

    def release_all(self, in_backward=False):
        # A prefetch whose unit did not run (the prediction missed) is waited for: it was posted on every rank.
        for i in list(self.pending):
            self._gather(i, in_backward, hit=False)
        for i in list(self.resident):
            self._release(i)

    # ---- hooks ------------------------------------------------------------------------------------------------
    def begin_forward(self):
        self._refuse_after_end("the model's forward")
        self.order = []
        self._gather(-1)

    def end_forward(self):
        self.last_order = self.order
        self.back_at = len(self.order)
        if not (torch.is_grad_enabled() and self.model.training):
            self.release_all()

    def _pre_forward(self, i):
        def hook(module, args):
            self._refuse_after_end("a unit's forward")
            if self.root and -1 not in self.resident and self.active() and not self.job._loop.void:
                # The root is gathered by the wrapper's forward: this unit runs without it (zeros, not the model).
                raise UsageError("a unit of a model with sharded parameters ran outside the wrapper's forward: "
                                 "call model(x), the Model that job.wrap() returned, not the module inside it")
            rows = self.tables[i] is not None and args and isinstance(args[0], torch.Tensor)
            self._gather(i, indices=args[0] if rows else None)
            if self.active():
                self.order.append(i)
                self._prefetch(self._next_in_forward(i))
        return hook

    def _post_forward(self, i):
        def hook(module, args, output):
            if torch.is_grad_enabled() and self.active():
                if self.weightless_backward[i] and module.weight.requires_grad and not module.scale_grad_by_freq:
                    output = _IndexedGrad.apply(output.detach(), args[0], module.weight, module.padding_idx, self)
                fired = [False]

                def pre_backward(grad):
                    if not fired[0]:
                        fired[0] = True
                        # Backward runs the forward's order in reverse: the units after this one there are done
                        # (whatever their index: a forward may call its units in any order).
                        k = self._backward_at(i)
                        done = self._done_in_backward(k) if k is not None else set()
                        for j in [j for j in self.resident if j in done]:
                            self._release(j)
                        if not self.weightless_backward[i]:
                            self._gather(i, in_backward=True)
                        self._prefetch(self._next_in_backward(i, k))
                        held = len((self.resident | set(self.pending)) - {-1})
                        self.most_in_backward = max(self.most_in_backward, held)
                    return grad

                for t in _tensors(output):
                    if t.requires_grad:
                        t.register_hook(pre_backward)
            self._release(i)
            return output
        return hook


class _IndexedGrad(torch.autograd.Function):
    """An nn.Embedding's output whose backward adds the output's gradient into the rows of the weight's gradient
    that this step's indices name, where the gradient is kept (the flat buffer's range, .grad's view), instead
    of torch's: that one makes a dense vocabulary x width tensor and adds it to .grad, so a step held the
    gradient twice and wrote every page of it. Here only the rows used take memory until the reduce-scatter
    (the rest of the range reads as zero), and the sums are torch's: in the order of the indices, onto zero.

    The weight's .grad is handed back as its own gradient with .grad set to None, so that autograd's
    accumulation takes the tensor as it is (no copy) and its hooks run as for any parameter. Where .grad is not
    the flat buffer's view (a script replaced it), the gradient is torch's dense one."""

    @staticmethod
    def forward(ctx, output, indices, weight, padding_idx, units):
        ctx.save_for_backward(indices)
        ctx.weight, ctx.padding_idx, ctx.units = weight, padding_idx, units
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        weight = ctx.weight
        rows = grad_output.reshape(-1, weight.shape[1])
        idx = indices.reshape(-1)
        if ctx.padding_idx is not None:  # torch's: the padding row gets no gradient
            keep = idx != ctx.padding_idx
            idx, rows = idx[keep], rows[keep]
        grad = weight.grad
        flat = ctx.units.flat_grads
        start = flat.data_ptr()
        end = start + flat.numel() * flat.element_size()
        if grad is None or not (start <= grad.data_ptr() < end) or not grad.is_contiguous():
            return None, None, torch.zeros_like(weight).index_add_(0, idx, rows), None, None
        grad.index_add_(0, idx, rows.to(grad.dtype))
        weight.grad = None
        ctx.units.indexed_grads += 1
        return None, None, grad, None, None


def _row_table(module, ranges, span):
    """(offset, count, width) of an nn.Embedding unit's weight in the flat buffer, where its forward reads only the
    rows its indices name (torch's own forward, no max_norm: that one renormalises the rows it reads in place) and
    the weight is the unit's only range; None otherwise."""
    if not _weightless_backward(module) or module.max_norm is not None or not module.weight.requires_grad:
        return None
    offset, count = span(module.weight)
    if ranges != [(offset, count)]:
        return None
    return (offset, count, module.embedding_dim)


def _distinct(units, current, n):
    """The first n distinct units of `units`, other than `current`."""
    out = []
    for j in units:
        if j != current and j not in out:
            out.append(j)
            if len(out) == n:
                break
    return out


def _weightless_backward(module):
    """Whether the module's backward reads none of its parameters: an nn.Embedding as torch defines it (dense
    gradients; a subclass with a forward of its own may read its weight otherwise)."""
    return (isinstance(module, torch.nn.Embedding) and type(module).forward is torch.nn.Embedding.forward
            and not module.sparse)


def _tensors(output):
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (list, tuple)):
        for o in output:
            yield from _tensors(o)
    elif isinstance(output, dict):
        for o in output.values():
            yield from _tensors(o)


_sharded_models = []  # weak enough: one job per process, its model lives as long as the process trains


def route_clipping(model):
    """torch.nn.utils.clip_grad_norm_ over a model whose parameters are sharded would see this rank's shards and
    zeros, and clip by a wrong norm without a word: over such a model it is model.clip_grad_norm_ (the norm over
    the group, each shard once); over part of its parameters it is refused; over anything else it is torch's.
    (A reference to torch's function taken before sinew.init(), `from torch.nn.utils import clip_grad_norm_`, is
    torch's own: call it through torch.nn.utils, or call model.clip_grad_norm_.)"""
    import torch.nn.utils as utils
    import torch.nn.utils.clip_grad as clip_grad
    _sharded_models.append(model)
    if getattr(utils.clip_grad_norm_, "_sinew", False):
        return
    torch_clip = utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        ids = {id(p) for p in params}
        for m in _sharded_models:
            ours = {id(p) for _, p in m._named_params}
            if ids & ours and m._units.active():
                if not ours <= ids:
                    raise UsageError("clip_grad_norm_ over part of a model whose parameters are sharded "
                                     "(shard='parameters'): clip all of them, model.clip_grad_norm_(max_norm)")
                return m.clip_grad_norm_(max_norm, norm_type)
        return torch_clip(params, max_norm, norm_type, error_if_nonfinite, foreach)

    clip_grad_norm_._sinew = True
    clip_grad_norm_.__doc__ = torch_clip.__doc__
    utils.clip_grad_norm_ = clip_grad_norm_
    clip_grad.clip_grad_norm_ = clip_grad_norm_
