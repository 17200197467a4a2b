"""Scripting units with TorchScript: FX units, leaf adapters (weight norm
included), and errors that name the submodule TorchScript refused."""

import collections
import copy
import inspect
import io
import linecache
import operator
import os
import re
import types
import typing
import warnings

import torch
import torch.fx as fx
import torch.nn as nn
from torch.nn.utils.weight_norm import WeightNorm as _WeightNorm

from tandem.export._common import _class_name, ExportError, _safe_name, _strip


def _subclass(base, cname, src, extra_globals=None):
    """Defines ``src`` (a class ``cname`` deriving from Base) where
    TorchScript can read its source back."""
    _leaf_counter[0] += 1
    fname = "<tandem %s %d>" % (cname, _leaf_counter[0])
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    ns = dict(extra_globals or {})
    ns.update({"Base": base, "torch": torch, "List": typing.List,
               "Optional": typing.Optional, "Tensor": torch.Tensor})
    exec(compile(src, fname, "exec"), ns)  # noqa: S102
    return ns[cname]


_leaf_counter = [0]


def _leaf_adapter(u, root, weight_norm=True):
    """A subclass of the leaf module's class whose forward takes the unit's
    inputs positionally, calls the original forward as the model did
    (keywords and constants included) and returns a tuple of the outputs.
    The instance shares the leaf's params, buffers and submodules, so they
    keep their names relative to the unit."""
    leaf = root.get_submodule(u.key)
    calls = [n for n in u.nodes if n.op == "call_module"]
    if len(calls) != 1 or any(
            n.op != "call_function" or n.target is not operator.getitem or
            n.args[0] is not calls[0] for n in u.nodes if n is not calls[0]):
        raise ExportError(
            "leaf module %r (%s) is called more than once in forward, or "
            "its result is unpacked in a way tandem cannot follow; call it "
            "once and use its result directly" %
            (_strip(u.key), _class_name(leaf)))
    call = calls[0]
    names = {a: "in_%d" % i for i, a in enumerate(u.inputs)}

    def render(v):
        if isinstance(v, fx.Node) and v in u.baked:
            return repr(u.baked[v])
        if isinstance(v, fx.Node):
            if v not in names:
                raise ExportError("leaf module %r takes a value tandem cannot "
                                  "pass: %s" % (_strip(u.key), v.name))
            return names[v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return repr(v)
        if isinstance(v, (tuple, list)):
            inner = ", ".join(render(x) for x in v)
            return "(%s,)" % inner if isinstance(v, tuple) else "[%s]" % inner
        raise ExportError("leaf module %r is called with a %s argument, "
                          "which tandem cannot pass to TorchScript; pass "
                          "tensors, numbers, strings or None" %
                          (_strip(u.key), type(v).__name__))

    args = [render(a) for a in call.args] + \
        ["%s=%s" % (k, render(v)) for k, v in call.kwargs.items()]
    outs = []
    for o in u.outputs:
        outs.append("result" if o is call else "result[%d]" % o.args[1])
    return _adapter(leaf, "Leaf", [names[a] for a in u.inputs], args, outs,
                    weight_norm)


def _adapter(module, kind, inputs, args, outs, weight_norm=True):
    """An instance of a subclass of ``module``'s class whose forward takes
    ``inputs`` (names) positionally, calls the original forward with
    ``args`` (source) as ``result`` and returns a tuple of ``outs`` (source).
    It shares the module's params, buffers and submodules, which keep their
    names relative to it; a submodule under weight norm is a copy without
    the hook, whose weight forward computes first from its _g and _v params
    (as the hook does). A glue's (weight_norm False) leaves weight norm to
    the units it calls."""
    cls = type(module)
    norms = _weight_norms(module) if weight_norm else []
    _leaf_counter[0] += 1
    cname = "Tandem%s_%s_%d" % (kind, _safe_name(cls.__name__),
                                _leaf_counter[0])
    src = ("class %s(Base):\n"
           "    def forward(self, %s):\n"
           "%s"
           "        result = self._tandem_leaf_forward(%s)\n"
           "        return (%s,)\n" %
           (cname, ", ".join(inputs),
            "".join("        self%s.%s = torch._weight_norm(self%s.%s_v, "
                    "self%s.%s_g, %d)\n" %
                    ((_attr_path(path), name) * 3 + (dim,))
                    for path, name, dim in norms),
            ", ".join(args), ", ".join(outs)))
    adapter_cls = _subclass(cls, cname, src)
    f = cls.forward
    inner = types.FunctionType(f.__code__, f.__globals__,
                               "_tandem_leaf_forward", f.__defaults__,
                               f.__closure__)
    inner.__kwdefaults__ = f.__kwdefaults__
    inner.__annotations__ = dict(getattr(f, "__annotations__", {}))
    inner.__qualname__ = cname + "._tandem_leaf_forward"
    adapter_cls._tandem_leaf_forward = inner
    # A module's own __prepare_scriptable__ may change it for TorchScript
    # (torchaudio's removes weight norm, in place, from the user's module);
    # the adapter handles weight norm itself.
    adapter_cls.__prepare_scriptable__ = lambda self: self
    obj = adapter_cls.__new__(adapter_cls)
    obj.__dict__.update(module.__dict__)
    for k in ("_parameters", "_buffers", "_modules"):
        obj.__dict__[k] = module.__dict__[k].copy()
    for path, name, _ in norms:
        holder = obj
        for part in path:
            child = holder._modules[part]
            c = copy.copy(child)
            c.__dict__["_modules"] = collections.OrderedDict(child._modules)
            holder._modules[part] = c
            holder = c
        holder.__dict__["_forward_pre_hooks"] = collections.OrderedDict(
            (k, h) for k, h in holder._forward_pre_hooks.items()
            if not isinstance(h, _WeightNorm))
        holder.__dict__[name] = getattr(holder, name).detach()
    return obj


def _weight_norms(module):
    """(path parts, param name, dim) of every weight norm under module."""
    found = []
    for path, m in module.named_modules():
        for h in m._forward_pre_hooks.values():
            if isinstance(h, _WeightNorm):
                found.append((path.split(".") if path else [], h.name, h.dim))
    return found


def _attr_path(parts):
    return "".join("." + p if p.isidentifier() else
                   "._modules[%r]" % p for p in parts)


def _script(module, what, prefix=""):
    """torch.jit.script(module), or an ExportError naming ``what``, the
    submodule whose code TorchScript refused (``prefix`` is the module's own
    path) and the offending source line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.jit.script(module)
        except Exception as e:  # noqa: BLE001 -- reported with the unit
            text = str(e).strip()
            lines = [ln for ln in text.splitlines() if ln.strip()]
            culprit = _scripting_culprit(module, text)
            where, hint = "", ""
            if culprit is not None:
                path, sub = culprit
                full = ".".join(x for x in (prefix, path) if x)
                if path:
                    where = "the code of its submodule %r (%s) fails: " % (
                        full, _class_name(sub))
                nones = [n for n in _attributes_at_error(text)
                         if n in sub._parameters and sub._parameters[n] is None
                         or n in sub._buffers and sub._buffers[n] is None]
                if nones:
                    hint = (
                        "\n  %s.%s is None (e.g. bias=False), and TorchScript "
                        "cannot script a read of a None attribute; give it a "
                        "tensor (register a zero buffer under that name), or "
                        "choose units with wrap= so that this module is not "
                        "scripted whole" % (full or "<root>", nones[0]))
            raise ExportError(
                "cannot script %s with TorchScript: %s%s%s\n  Make its forward "
                "TorchScript-compatible (type annotations for non-tensor "
                "arguments, no Python-only calls), or move the data-dependent "
                "branch out of forward so that torch.fx can trace it and it "
                "need not be a leaf" %
                (what, where, "\n    ".join(lines[:8]) or type(e).__name__,
                 hint))


def _attributes_at_error(text):
    """The ``self.NAME`` attributes in the span a TorchScript error marks
    (``~~~~ <--- HERE`` under the line), in order."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if "<--- HERE" in ln and i > 0 and "~" in ln:
            begin = ln.index("~")
            end = len(ln.split("<--- HERE")[0].rstrip())
            return re.findall(r"self\.(\w+)", lines[i - 1][begin:end])
    return []


def _scripting_culprit(module, text):
    """(path, submodule) of ``module`` whose class's source holds the
    'File "...", line N' where a TorchScript error is, or None."""
    places = re.findall(r'File "([^"]+)", line (\d+)', text)
    if not places:
        return None
    # The first place is where the error is; later ones are its callers.
    f, line = os.path.abspath(places[0][0]), int(places[0][1])
    best = None
    for path, sub in module.named_modules():
        cls = type(sub)
        for c in cls.__mro__:
            if c in (nn.Module, object):
                break
            try:
                src = os.path.abspath(inspect.getsourcefile(c))
                code, first = inspect.getsourcelines(c)
            except (TypeError, OSError):
                continue
            if src == f and first <= line < first + len(code):
                # The innermost module wins; the adapter class the leaf is
                # wrapped in counts as the leaf itself.
                if best is None or len(path) > len(best[0]):
                    best = (path, sub)
                break
    return best


def _jit_bytes(scripted):
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    return buf.getvalue()
