"""What an archive's units hold in memory as the worker runs them, measured
at export for the coordinator's check at submit (coordinator/README.md,
"Budgets at submit"): each unit's own memory forward and backward
(ArchiveUnitMemory), and what loading each TorchScript module keeps
(ArchiveUnit.loaded_bytes).

The figures come from torch.profiler's record of every CPU allocation and
free (profile_memory=True): the same allocator the worker's memory meter
counts. The points between nodes are marked in that record by allocations
of sizes no model tensor has (_MARK_BYTES + k bytes of uint8), so no clock
has to agree with another."""

import contextlib
import io
import itertools
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from tandem.export._common import ArchiveError, _seeded
from tandem.export.archive import call_unit, interpreted
from tandem.export.glue import _glue_serving

# Odd byte counts: a model's float and integer tensors are multiples of 2.
_MARK_BYTES = 1_000_003
_DEAD = -1


class _Marks:
    """Marks points in the allocation record, each with a label."""

    def __init__(self):
        self.labels = []

    def __call__(self, label):
        t = torch.empty(_MARK_BYTES + 2 * len(self.labels), dtype=torch.uint8)
        self.labels.append(label)
        del t


def _allocations(prof):
    """The bytes of every CPU allocation (+) and free (-) in the profile,
    in the order they happened."""
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]"]
    if events and hasattr(events[0], "start_ns"):
        events.sort(key=lambda e: e.start_ns())
    else:
        events.sort(key=lambda e: e.start_us())
    return [e.nbytes() for e in events]


def _levels_at_marks(allocations, count):
    """For each of `count` marks: (the allocated level there, the highest
    level from there to the next mark), relative to the record's start,
    the marks' own allocations left out. None when a mark is missing."""
    level, out, peak = 0, [], None
    pending = None  # the mark whose free comes next
    for b in allocations:
        size = abs(b)
        k = (size - _MARK_BYTES) // 2
        if size >= _MARK_BYTES and (size - _MARK_BYTES) % 2 == 0 and k < count:
            if b > 0 and k == len(out):
                if out:
                    out[-1] = (out[-1][0], peak)
                out.append((level, level))
                peak = level
                pending = k
                continue
            if b < 0 and k == pending:
                pending = None
                continue
        level += b
        if peak is not None:
            peak = max(peak, level)
    if len(out) != count:
        return None
    out[-1] = (out[-1][0], peak)
    return out


class _Recompute(torch.autograd.Function):
    """A unit run without keeping its activations, as the worker's
    RecomputeFunction runs it (worker/runtime/executor.cc): forward with
    grad disabled, keeping the unit's inputs; backward runs the unit again
    on detached inputs and params and takes the gradients with
    torch.autograd.grad, which returns them without accumulating them
    into the detached tensors first (torch.utils.checkpoint's reentrant
    backward accumulates them there and returns those). Measured through
    torch.utils.checkpoint, a unit recomputed inside a glue (seq2seq's
    nn.Transformer layers) read a backward net its param gradients above
    what the worker measures (2026-12-02); through this, every figure the
    worker measures matches. The random generator is put back as forward
    found it for the recompute and restored after, the state saved for
    that freed before the gradients are taken, as the worker's is."""

    @staticmethod
    def forward(ctx, run, inputs, *args):
        ctx.run = run
        ctx.rng = torch.get_rng_state()
        ctx.save_for_backward(*args[:inputs])
        ctx.params = args[inputs:]
        ctx.set_materialize_grads(False)
        return tuple(run(*args))

    @staticmethod
    def backward(ctx, *grads):
        args, targets, where = [], [], []
        for a, t in enumerate(list(ctx.saved_tensors) + list(ctx.params)):
            t = t.detach()
            if ctx.needs_input_grad[2 + a]:
                t.requires_grad_()
                targets.append(t)
                where.append(a)
            args.append(t)
        result = [None] * len(args)
        now = torch.get_rng_state()
        torch.set_rng_state(ctx.rng)
        try:
            with torch.enable_grad():
                outputs = ctx.run(*args)
        finally:
            torch.set_rng_state(now)
            del now  # as the worker's, gone before the gradients are taken
        roots = [(o, g) for o, g in zip(outputs, grads)
                 if g is not None and torch.is_tensor(o) and o.requires_grad]
        if roots and targets:
            got = torch.autograd.grad([o for o, _ in roots], targets,
                                      [g for _, g in roots],
                                      allow_unused=True)
            for a, g in zip(where, got):
                result[a] = g
        return (None, None, *result)


def _run_marked(archive, mods, batch, recompute, profiled=True):
    """Runs the units forward and backward once as the worker's executor
    does: values no later unit reads dropped after each unit, the values
    crossing each boundary hooked, one loss.backward(), a backward node from
    one boundary's gradients to the next; units but the last under
    `recompute` run through _Recompute, as the worker recomputes them. A
    glue runs whole, interpreted, its units served as it calls them; the
    boundary after a unit inside it sits on that unit's own outputs, and
    the one after its last unit on what the glue returns
    (worker/runtime/executor.cc, RunGlue). Returns the mark labels, in
    order, with the profile (None unless `profiled`)."""
    m = archive.manifest
    n = len(m.units)
    weights = archive.weights()
    params = {p.name: weights[p.name].clone().requires_grad_(p.requires_grad)
              for p in m.params}
    buffers = {b.name: weights[b.name] for b in m.buffers}
    glue_at = {g.first_unit: g for g in m.glues}
    # Loaded before the record starts: what loading keeps is counted apart
    # (measure_loaded_bytes).
    glue_mods = {g.first_unit: archive.glue_module(g) for g in m.glues}
    # What each step of the outer run reads and writes: a unit outside
    # glue, or a glue standing at its last unit.
    steps = []
    k = 0
    while k < n:
        g = glue_at.get(k)
        if g is None:
            steps.append((k, None, m.units[k].inputs, m.units[k].outputs))
            k += 1
        else:
            last = g.first_unit + g.unit_count - 1
            steps.append((last, g, g.inputs, g.outputs))
            k = last + 1
    last_reader = {}
    for at, _, reads, _ in steps:
        for v in reads:
            last_reader[v] = at
    mark = _Marks()
    # Hooks not yet fired per boundary; _DEAD for one no gradient crosses
    # (a frozen prefix), which fires once loss.backward() returned.
    pending = [0] * max(n - 1, 0)
    boundary = [n - 2]  # the next boundary to fire (last first)

    def fired(b):
        pending[b] -= 1
        while boundary[0] >= 0 and pending[boundary[0]] == 0:
            mark(("backward", boundary[0]))
            boundary[0] -= 1

    def hook(b, tensors):
        """Boundary b on `tensors`: those carrying a gradient come back as
        views whose hook counts toward it."""
        out = []
        for t in tensors:
            if torch.is_tensor(t) and t.requires_grad:
                t = t.view_as(t)
                t.register_hook(lambda g, b=b: fired(b))
                pending[b] += 1
            out.append(t)
        if pending[b] == 0:
            pending[b] = _DEAD
        return out

    def run_unit(k, args):
        u = m.units[k]
        if recompute and k + 1 < n:
            # The params go in as inputs, as the worker's RecomputeFunction
            # takes them: the gradients reach them through the recompute.
            def run(*a, u=u, mod=mods[k], inputs=len(args)):
                bound = dict(params)
                bound.update(zip(u.params, a[inputs:]))
                return tuple(call_unit(u, mod, list(a[:inputs]), bound,
                                       buffers))
            return list(_Recompute.apply(
                run, len(args), *args, *[params[name] for name in u.params]))
        return call_unit(u, mods[k], args, params, buffers)

    recording = (profile(activities=[ProfilerActivity.CPU],
                         profile_memory=True) if profiled
                 else contextlib.nullcontext())
    # As the worker runs units: interpreted (the optimizing executor would
    # differentiate subgraphs of its own, which save other tensors).
    with recording as p, interpreted(), _seeded(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = dict(batch)
        for at, g, reads, writes in steps:
            args = [values[v] for v in reads]
            if g is None:
                mark(("forward", at))
                out = run_unit(at, args)
            else:
                expected = [g.first_unit]

                def call(k, inputs, g=g, expected=expected, last=at):
                    if k != expected[0] or k > last:
                        raise ArchiveError(
                            "glue %s called unit %d where unit %d was next"
                            % (g.name, k, expected[0]))
                    expected[0] += 1
                    mark(("forward", k))
                    o = run_unit(k, inputs)
                    mark(("forward-end", k))
                    return hook(k, o) if k < last else o

                outer = getattr(_glue_serving, "call", None)
                _glue_serving.call = call
                try:
                    out = list(glue_mods[g.first_unit](*args))
                finally:
                    _glue_serving.call = outer
            del args
            for name, v in zip(writes, out):
                values[name] = v
            del out
            for v in [v for v in values
                      if last_reader.get(v, -1) <= at and v != m.loss]:
                del values[v]
            if g is None:
                # Inside a glue, each unit ends where it returns (the worker
                # measures it there, before the glue's own code goes on).
                mark(("forward-end", at))
            if at + 1 == n:
                break
            names = [v for v in values if v != m.loss]
            for v, t in zip(names, hook(at, [values[v] for v in names])):
                values[v] = t
        loss = values.pop(m.loss)
        values.clear()
        mark(("backward", n - 1))
        loss.backward()
        del loss
        while boundary[0] >= 0:
            mark(("backward", boundary[0]))
            boundary[0] -= 1
        mark(("end", -1))
    return mark.labels, p


def _unit_memory(archive, mods, batch, recompute):
    """[(forward rise, forward net, backward rise, backward net)] per unit,
    in bytes, or None when the record lacks a mark."""
    labels, prof = _run_marked(archive, mods, batch, recompute)
    levels = _levels_at_marks(_allocations(prof), len(labels))
    if levels is None:
        return None
    n = len(archive.manifest.units)
    got = [[0, 0, 0, 0] for _ in range(n)]
    for i, (kind, k) in enumerate(labels[:-1]):
        start, peak = levels[i]
        end = levels[i + 1][0]
        if kind == "forward":
            got[k][0], got[k][1] = peak - start, end - start
        elif kind == "backward":
            got[k][2], got[k][3] = peak - start, end - start
    return [tuple(g) for g in got]


def _doubled(batch):
    """The batch twice over along dim 0, or None when its inputs do not all
    share a leading batch dim."""
    sizes = {t.shape[0] if torch.is_tensor(t) and t.dim() > 0 else None
             for t in batch.values()}
    if len(sizes) != 1 or None in sizes:
        return None
    return {k: torch.cat([t, t]) for k, t in batch.items()}


def measure_unit_memory(archive, batch):
    """Fills each ArchiveUnit.memory of `archive`'s manifest: the units'
    own memory on `batch` and on it doubled, with and without activation
    checkpointing; units inside a glue as the glue calls them. Leaves them
    empty when the profiler's record misses a mark."""
    m = archive.manifest
    for u in m.units:
        del u.memory[:]
    if not m.units:
        return
    mods = [archive.unit_module(u) for u in m.units]
    batches = [batch]
    doubled = _doubled(batch)
    if doubled is not None:
        batches.append(doubled)
    measured = []
    for b in batches:
        size = next(iter(b.values())).shape[0]
        for recompute in (False, True):
            # The first run of a TorchScript module profiles it; the
            # worker's profile comes from later steps.
            _run_marked(archive, mods, b, recompute, profiled=False)
            got = _unit_memory(archive, mods, b, recompute)
            if got is None:
                return
            measured.append((size, recompute, got))
    for size, recompute, got in measured:
        for k, (u, g) in enumerate(zip(m.units, got)):
            u.memory.add(micro_batch=size,
                         recompute=recompute and k + 1 < len(m.units),
                         forward_rise_bytes=g[0], forward_net_bytes=g[1],
                         backward_rise_bytes=g[2], backward_net_bytes=g[3])


def measure_loaded_bytes(archive):
    """Fills ArchiveUnit.loaded_bytes and ArchiveGlue.loaded_bytes: what
    loading each TorchScript module keeps allocated."""
    m = archive.manifest
    for entry in itertools.chain(m.units, m.glues):
        data = archive.entries[entry.file]
        with profile(activities=[ProfilerActivity.CPU],
                     profile_memory=True) as p:
            mod = torch.jit.load(io.BytesIO(data))
        entry.loaded_bytes = max(0, sum(_allocations(p)))
        del mod
