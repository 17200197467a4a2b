"""The checks before anything is written: the module itself, eagerly, against
the saved units (loss and every gradient, at other shapes too), the
activations they save, and each low-precision dtype."""

import warnings

import torch
import torch.nn as nn

from tandem.export._common import (_allclose, _dtype_name, ExportError,
                                   _first_line, _GRAD_TOL, _LOSS_RTOL, _ROOT,
                                   _seeded, _strip, _where)
from tandem.export.archive import run_archive
from tandem.export.batch import _shrunk_batch
from tandem.export.units import _all_tensor_names


def _eager_loss_and_grads(root, batch, param_names, user_files,
                          what="the example batch"):
    try:
        with _seeded():
            out = root(**batch)
    except Exception as e:  # noqa: BLE001 -- the user's own error
        where = _where(e, user_files)
        raise ExportError("the module fails on %s: %s: %s%s" %
                          (what, type(e).__name__, e,
                           "\n  at " + where if where else ""), usage=True)
    if not isinstance(out, torch.Tensor):
        raise ExportError(
            "forward returns a %s, not the scalar loss; pass loss=lambda "
            "outputs, batch: ... (CLI: make build() return a module whose "
            "forward returns the loss)" % type(out).__name__, usage=True)
    if out.dim() != 0 or not out.is_floating_point():
        raise ExportError(
            "the loss must be a scalar floating-point tensor (the mean over "
            "the batch's tokens or samples), got a %s tensor of shape %s; "
            "reduce it with .mean() or pass loss=" %
            (_dtype_name(out.dtype), list(out.shape)), usage=True)
    trainable = [(n, p) for n, p in param_names if p.requires_grad]
    grads = {}
    if trainable and out.requires_grad:
        gs = torch.autograd.grad(out, [p for _, p in trainable],
                                 allow_unused=True)
        for (n, p), g in zip(trainable, gs):
            grads[n] = torch.zeros_like(p) if g is None else g
    return out.detach(), grads


def _probe_dynamic(root, batch, inputs, explicit, param_names, user_files):
    """Runs the module on the example batch with its dynamic dims >= 1
    shortened, and with a smaller micro-batch: the references the exported
    units must reproduce. When the module itself refuses other sizes on dims
    >= 1 (an image model checking its resolution), inputs whose dims were not
    given explicitly keep only dim 0 dynamic. Returns (inputs, checks)."""
    checks = []
    for micro_batch in (False, True):
        small = _shrunk_batch(batch, inputs, micro_batch)
        if small is None:
            continue
        shapes = ", ".join("%s %s" % (k, list(v.shape))
                           for k, v in small.items())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loss, grads = _eager_loss_and_grads(
                    root, small, param_names, user_files,
                    "a batch of shapes " + shapes)
        except ExportError as e:
            if micro_batch:
                raise ExportError(
                    "%s\n  dim 0 of every input is the micro-batch and must "
                    "be free to vary" % e.message, usage=True)
            if any(n in explicit and len(d) > 1 for n, _, d, _ in inputs):
                raise ExportError(
                    "dynamic_dims says %s may vary, but %s" %
                    (", ".join("%s %s" % (n, d[1:]) for n, _, d, _ in inputs
                               if len(d) > 1), e.message), usage=True)
            inputs = [(n, t, [0], r) for n, t, _, r in inputs]
            continue
        checks.append(("a batch of shapes " + shapes, small, loss, grads))
    return inputs, checks


def _verify(archive, batch, ref_loss, ref_grads, checks):
    """The saved units, run in order, against the module itself: the loss
    and every trainable param's gradient, on the example batch and on the
    probes of _probe_dynamic."""
    checks = [("the example batch", batch, ref_loss, ref_grads)] + checks
    for what, b, want_loss, want_grads in checks:
        params = {}
        for p in archive.manifest.params:
            t = archive.weights()[p.name].clone()
            params[p.name] = t.requires_grad_(p.requires_grad)
        try:
            with _seeded():
                got = run_archive(archive, b, params=params)
        except Exception as e:  # noqa: BLE001
            raise ExportError("the exported units fail on %s: %s: %s. A unit "
                              "may have baked in a shape; mark fixed dims "
                              "with dynamic_dims= (CLI: --dynamic)" %
                              (what, type(e).__name__, _first_line(e)))
        if not _allclose(got.detach(), want_loss, _LOSS_RTOL, 0):
            raise ExportError(
                "the exported units compute loss %.8g on %s, the module "
                "%.8g: a unit baked in a shape or a Python value. Mark fixed "
                "dims with dynamic_dims= (CLI: --dynamic), or move the "
                "shape-dependent code into a unit kept whole with wrap=" %
                (got.item(), what, want_loss.item()))
        names = [n for n in want_grads]
        if names and got.requires_grad:
            gs = torch.autograd.grad(got, [params[n] for n in names],
                                     allow_unused=True)
            for n, g in zip(names, gs):
                g = torch.zeros_like(params[n]) if g is None else g
                w = want_grads[n]
                tol = _GRAD_TOL * max(1.0, w.abs().max().item())
                if (g - w).abs().max().item() > tol:
                    raise ExportError(
                        "the exported units' gradient of %r differs from "
                        "the module's on %s (max abs difference %.3g)" %
                        (n, what, (g - w).abs().max().item()))


def _saved_activation_bytes(archive, batch):
    """(total, [per unit]): the bytes the archive's units save for backward
    on ``batch``: every tensor autograd keeps from the forward to the
    backward, each storage counted once (for the unit that saved it first),
    the params, buffers and batch excluded. What a rank holds at the end of
    its forward, beyond its weights, when it runs the units at this batch's
    shape (no activation checkpointing)."""
    params = {p.name: archive.weights()[p.name].clone().requires_grad_(
        p.requires_grad) for p in archive.manifest.params}
    buffers = {b.name: archive.weights()[b.name]
               for b in archive.manifest.buffers}
    owned = {t.storage().data_ptr()
             for t in list(params.values()) + list(buffers.values()) +
             list(batch.values()) if t.numel() > 0}
    saved = {}      # storage -> (bytes, the unit that saved it first)
    unit = [0]      # the unit running (run_archive's on_unit)

    def pack(t):
        if t.numel() > 0:
            s = t.storage()
            ptr = s.data_ptr()
            if ptr not in owned:
                size, by = saved.get(ptr, (0, unit[0]))
                saved[ptr] = (max(size, s.size() * t.element_size()), by)
        return t

    def on_unit(k):
        unit[0] = k

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            _seeded():
        run_archive(archive, batch, params=params, buffers=buffers,
                    on_unit=on_unit)
    per_unit = [0] * len(archive.manifest.units)
    for size, by in saved.values():
        per_unit[by] += size
    return sum(per_unit), per_unit


def _cast_floating(t, dtype):
    return t.to(dtype) if t.is_floating_point() else t


def _check_precision(archive, root, batch, dtype, loss_rtol, grad_tol):
    """Runs the archive's units in ``dtype`` as the worker does for a
    model.dtype other than f32 (params, floating buffers and floating batch
    inputs cast to it) against the module itself in ``dtype`` (its params
    and buffers swapped for cast copies, the same inputs), on the example
    batch: the loss, and every trainable param's gradient. Returns None when
    they agree, else what went wrong: the module's own error in ``dtype``
    (a constant it makes in float32, an op with no kernel for the dtype),
    or where the units differ from it. Nothing is raised: a model that does
    not run in ``dtype`` still exports, and the job spec refuses that dtype
    for it, quoting this."""
    from torch.nn.utils import stateless

    name = _dtype_name(dtype)
    inputs = {k: _cast_floating(v, dtype) for k, v in batch.items()}
    # One cast copy per tensor, under every name it has (tied params).
    by_id, swapped = {}, {}
    for n, t in _all_tensor_names(root):
        if id(t) not in by_id:
            c = _cast_floating(t.detach(), dtype)
            if isinstance(t, nn.Parameter):
                c.requires_grad_(t.requires_grad)
            by_id[id(t)] = c
        swapped[n] = by_id[id(t)]
    trainable = [(_strip(_ROOT + "." + n), by_id[id(p)])
                 for n, p in getattr(root, _ROOT).named_parameters()
                 if p.requires_grad]
    try:
        with _seeded(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = stateless.functional_call(root, swapped, (), inputs)
            want_grads = (torch.autograd.grad(
                want, [p for _, p in trainable], allow_unused=True)
                if trainable and want.requires_grad else ())
    except Exception as e:  # noqa: BLE001 -- the module's own error
        return "the module fails in %s: %s: %s" % (
            name, type(e).__name__, _first_line(e))
    weights = archive.weights()
    params = {p.name: _cast_floating(weights[p.name], dtype).requires_grad_(
        p.requires_grad) for p in archive.manifest.params}
    buffers = {b.name: _cast_floating(weights[b.name], dtype)
               for b in archive.manifest.buffers}
    try:
        with _seeded(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = run_archive(archive, inputs, params=params, buffers=buffers)
            got_grads = (torch.autograd.grad(
                got, [params[n] for n, _ in trainable], allow_unused=True)
                if trainable and got.requires_grad else ())
    except Exception as e:  # noqa: BLE001
        return "the exported units fail in %s: %s: %s" % (
            name, type(e).__name__, _first_line(e))
    if got.dtype != want.dtype or not torch.allclose(
            got.detach().double(), want.detach().double(), rtol=loss_rtol,
            atol=0):
        return ("the exported units compute loss %.6g (%s) in %s, the module "
                "%.6g (%s)" % (got.item(), _dtype_name(got.dtype), name,
                               want.item(), _dtype_name(want.dtype)))
    for (n, _), g, w in zip(trainable, got_grads, want_grads):
        g = torch.zeros(()) if g is None else g.detach().double()
        w = torch.zeros(()) if w is None else w.detach().double()
        tol = grad_tol * max(1e-30, w.abs().max().item())
        if (g - w).abs().max().item() > tol:
            return ("the exported units' gradient of %r differs from the "
                    "module's in %s (max abs difference %.3g, largest "
                    "element %.3g)" % (n, name, (g - w).abs().max().item(),
                                       w.abs().max().item()))
    return None
