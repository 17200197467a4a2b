"""The example batch: its checks, the inputs' dynamic dims, roles and synthetic
descriptions, and the root module whose forward takes exactly its names."""

import inspect
import math

import torch
import torch.nn as nn

from tandem.export._common import (_dtype_name, ExportError, ROLE_NAMES, _ROOT,
                                   _TARGET_NAMES, _TOKEN_NAMES)


def _make_root(module, names, forward_names, loss):
    """A module whose forward takes exactly the batch's names as arguments,
    calls ``module`` with forward_names of them by keyword and returns the
    loss: module's output, or loss(output, batch)."""
    for n in names:
        if not n.isidentifier() or n in ("self",) or n.startswith("_tandem"):
            raise ExportError("example batch key %r is not a valid keyword "
                              "argument name" % n, usage=True)
    args = ", ".join(names)
    call = "self.%s(%s)" % (_ROOT, ", ".join("%s=%s" % (n, n)
                                             for n in forward_names))
    if loss is None:
        body = "    return %s\n" % call
    else:
        batch = "{%s}" % ", ".join("%r: %s" % (n, n) for n in names)
        body = "    return self._tandem_loss(%s, %s)\n" % (call, batch)
    src = "def forward(self, %s):\n%s" % (args, body)
    ns = {}
    exec(compile(src, "<tandem export root>", "exec"), ns)  # noqa: S102

    class ExportRoot(nn.Module):
        forward = ns["forward"]

    root = ExportRoot()
    setattr(root, _ROOT, module)
    if loss is not None:
        root._tandem_loss = loss
    return root


def _check_batch(module, example_batch, loss_given):
    """(every batch name, the names forward takes), forward's first. With a
    loss function, entries forward does not take go to the loss only."""
    if not isinstance(module, nn.Module):
        raise ExportError("export() takes a torch.nn.Module, got %s" %
                          type(module).__name__, usage=True)
    if not isinstance(example_batch, dict) or not example_batch:
        raise ExportError("example_batch must be a non-empty dict of named "
                          "tensors (forward's keyword arguments), got %s" %
                          type(example_batch).__name__, usage=True)
    for k, v in example_batch.items():
        if not isinstance(k, str):
            raise ExportError("example_batch keys must be strings, got %r" %
                              (k,), usage=True)
        if not isinstance(v, torch.Tensor):
            raise ExportError("example_batch[%r] is a %s; every batch entry "
                              "must be a tensor" % (k, type(v).__name__),
                              usage=True)
        if v.dim() == 0:
            raise ExportError("example_batch[%r] is a scalar; dim 0 of every "
                              "input is the micro-batch" % k, usage=True)
    sig = inspect.signature(module.forward)
    params = sig.parameters
    shown = "forward(%s)" % ", ".join(params)
    if any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        raise ExportError("%s takes *args; tandem passes the batch by keyword "
                          "only: name forward's arguments" % shown,
                          usage=True)
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    forward_names = []
    for k in example_batch:
        p = params.get(k)
        if (p is None and not var_kw) or (
                p is not None and p.kind == p.POSITIONAL_ONLY):
            if loss_given:
                continue  # read by the loss function only
            raise ExportError("example_batch has %r, which %s does not take "
                              "by keyword (with loss=, the batch may hold "
                              "entries for the loss function only)" %
                              (k, shown), usage=True)
        forward_names.append(k)
    for name, p in params.items():
        if (p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and
                p.default is p.empty and name not in example_batch):
            raise ExportError("example_batch lacks %r, which %s requires" %
                              (name, shown), usage=True)
    names = [k for k in params if k in example_batch] + \
        [k for k in example_batch if k not in params]
    return names, [k for k in names if k in forward_names]


def _synthetic_spec(batch, inputs, input_ranges):
    """{input name: ArchiveSynthetic fields} for the inputs of no role: what
    ``data.kind: synthetic`` draws for them."""
    ranges = dict(input_ranges or {})
    by_name = {n: (t, role) for n, t, _, role in inputs}
    for k, r in ranges.items():
        if k not in by_name:
            raise ExportError("input_ranges names %r, which is not in the "
                              "example batch (%s)" % (k, ", ".join(by_name)),
                              usage=True)
        t, role = by_name[k]
        if role:
            raise ExportError("input_ranges[%r]: the input has role %s, "
                              "which the token stream feeds (model.vocab "
                              "sets its range)" % (k, role), usage=True)
        if t.is_floating_point() or t.is_complex():
            raise ExportError("input_ranges[%r]: the input is %s; a range "
                              "is for integer and bool inputs (floating ones "
                              "are drawn with the example's mean and std)" %
                              (k, _dtype_name(t.dtype)), usage=True)
        try:
            low, high = (int(v) for v in r)
        except (TypeError, ValueError):
            raise ExportError("input_ranges[%r] = %r; give (low, high), both "
                              "included" % (k, r), usage=True)
        info = torch.iinfo(t.dtype) if t.dtype != torch.bool else None
        lo, hi = (info.min, info.max) if info else (0, 1)
        if not lo <= low <= high <= hi:
            raise ExportError("input_ranges[%r] = (%d, %d); it must be "
                              "non-empty and within %s's [%d, %d]" %
                              (k, low, high, _dtype_name(t.dtype), lo, hi),
                              usage=True)
        ranges[k] = (low, high)
    out = {}
    for n, t, _, role in inputs:
        if role:
            continue
        if t.is_floating_point():
            v = t.detach().to(torch.float64)
            std = float(v.std(unbiased=False)) if v.numel() else 0.0
            mean = float(v.mean()) if v.numel() else 0.0
            if not (math.isfinite(mean) and math.isfinite(std)):
                raise ExportError("example batch input %r holds values that "
                                  "are not finite (NaN or inf); give an "
                                  "example batch of real values" % n,
                                  usage=True)
            out[n] = {"mean": mean, "std": std}
        elif t.is_complex():
            continue  # the worker refuses it at submit with synthetic data
        elif n in ranges:
            out[n] = {"low": ranges[n][0], "high": ranges[n][1]}
        elif t.numel():
            out[n] = {"low": int(t.min()), "high": int(t.max())}
        else:
            out[n] = {"low": 0, "high": 0}
    return out


def _inputs_spec(batch, names, dynamic_dims, roles):
    dynamic_dims = dict(dynamic_dims or {})
    for k, dims in dynamic_dims.items():
        if k not in batch:
            raise ExportError("dynamic_dims names %r, which is not in the "
                              "example batch (%s)" % (k, ", ".join(names)),
                              usage=True)
        if isinstance(dims, int):
            dynamic_dims[k] = dims = [dims]
        for d in dims:
            if not isinstance(d, int) or not 0 <= d < batch[k].dim():
                raise ExportError("dynamic_dims[%r]: dim %r is out of range "
                                  "for shape %s" % (k, d, list(batch[k].shape)),
                                  usage=True)
    roles = dict(roles or {})
    for k, r in roles.items():
        if k not in batch:
            raise ExportError("roles names %r, which is not in the example "
                              "batch (%s)" % (k, ", ".join(names)), usage=True)
        if r not in ROLE_NAMES:
            raise ExportError("roles[%r] = %r; a role is \"tokens\", "
                              "\"targets\" or \"\"" % (k, r), usage=True)
    if not roles:
        tok = [n for n in names if n in _TOKEN_NAMES]
        tgt = [n for n in names if n in _TARGET_NAMES]
        if len(tok) == 1 and len(tgt) == 1:
            a, b = batch[tok[0]], batch[tgt[0]]
            if (a.dtype == torch.int64 and b.dtype == torch.int64 and
                    a.shape == b.shape):
                roles = {tok[0]: "tokens", tgt[0]: "targets"}
    out = []
    for n in names:
        t = batch[n]
        dims = dynamic_dims.get(n, range(1, t.dim()))
        out.append((n, t, sorted(set([0] + list(dims))), roles.get(n, "")))
    return out


def _shrunk_batch(batch, inputs, micro_batch):
    """The example batch with its dynamic dims >= 1 shortened by a quarter
    (micro_batch False) or its micro-batch by one (True), or None when
    nothing shrinks."""
    out, changed = {}, False
    for name, t, dims, _ in inputs:
        x = batch[name]
        for d in dims:
            n = x.shape[d]
            if (d == 0) != micro_batch:
                continue
            m = n - 1 if d == 0 else n - max(1, n // 4)
            m = max(m, 1)
            if m != n:
                x = x.narrow(d, 0, m)
                changed = True
        out[name] = x.contiguous()
    return out if changed else None
