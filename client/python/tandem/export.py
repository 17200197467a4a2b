"""``tandem export``: capture a user's ``torch.nn.Module`` into a model archive
that the worker runs (client/README.md, "Exporting your own model").

    import tandem
    manifest = tandem.export(model, {"input_ids": x, "labels": y},
                             path="model.tandem")
    archive = tandem.export.load_archive("model.tandem")   # checksums verified
    loss = tandem.export.run_archive(archive, batch)        # the units, in order

How a module becomes an archive:

1. torch.fx traces the module (through standard modules such as nn.Linear,
   so their params become explicit ``get_attr`` nodes; buffers are proxied so
   ``self.mask[:t, :t]`` traces). A unit module that FX cannot trace inside
   (shape-dependent control flow, e.g. nn.TransformerEncoderLayer) is kept
   whole as a leaf.
2. The graph is cut into units the way FSDP's auto-wrap does: by default every
   child of every nn.ModuleList/nn.Sequential of blocks; the code before the
   first block ("embed"), after the last one ("head") and between blocks forms
   units of its own. The values that cross units are derived from the graph's
   def-use edges (any unit may read any earlier unit's values); shape numbers
   that cross units are recomputed where they are used.
3. Each unit becomes a TorchScript module: ``forward(*params, *buffers,
   *inputs) -> tuple(outputs)`` with params and buffers lifted into inputs, or
   for a leaf the module itself, scripted, taking its inputs only.
4. Every scripted unit is checked against its FX unit, and the whole chain of
   saved units against the module itself (loss and every param's gradient, on
   the example batch and on one with shorter dynamic dims) before anything is
   written. The archive (proto/tandem/v1/archive.proto) goes to a temporary
   file renamed into place, so a failed export never leaves a broken archive.

torch is imported by this module only; the rest of the package works without
it. This module is callable: ``tandem.export(...)`` is ``export(...)``.
"""

import collections
import contextlib
import copy
import dis
import functools
import hashlib
import inspect
import io
import json
import linecache
import math
import operator
import os
import re
import struct
import sys
import tempfile
import threading
import traceback
import types
import typing
import warnings
import zipfile

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.node import map_aggregate
from torch.nn.utils.weight_norm import WeightNorm as _WeightNorm

from tandem.errors import TandemError

FORMAT_VERSION = 1
ARCHIVE_DIR = "model/"
MANIFEST_ENTRY = "manifest.json"
WEIGHTS_ENTRY = "weights.safetensors"

ROLE_NAMES = ("tokens", "targets", "")
_TOKEN_NAMES = ("input_ids", "tokens", "idx")
_TARGET_NAMES = ("labels", "targets")

# The wrapper that fixes forward's keyword signature holds the user's module
# under this attribute; every qualified name the tracer sees starts with it.
_ROOT = "m"

# Tolerances of the self-check that runs before anything is written (fp32).
_LOSS_RTOL = 1e-5
_GRAD_TOL = 1e-5

# The low-precision dtypes export runs the units in (ArchivePrecisionCheck),
# with the tolerances of their comparison against the module cast to the
# dtype. The units run the module's own ops in the same order, so they
# compute its values (measured on tests/models: equal); the tolerances are a
# few roundings of the dtype (bf16 keeps 8 bits: 2^-8 relative), so that a
# kernel summing in another order (TorchScript, another torch build) passes
# while an op computing in another dtype does not.
_SPEC_DTYPE = {"bfloat16": "bf16", "float16": "f16"}
_PRECISION_CHECKS = {torch.bfloat16: dict(loss_rtol=2.0 ** -6,
                                          grad_tol=2.0 ** -5)}


class ExportError(TandemError):
    """A module, batch or option that ``tandem export`` cannot turn into an
    archive. ``message`` says what went wrong and what to change. ``usage``
    is True for bad arguments (the CLI exits 2), False when the model could
    not be captured (exit 1)."""

    def __init__(self, message, usage=False):
        super().__init__(message)
        self.usage = usage


class ArchiveError(TandemError):
    """An archive that cannot be read: not a zip, a manifest that does not
    parse, an unknown format_version, or an entry whose checksum fails."""


# ---------------------------------------------------------------- safetensors

_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ST_TORCH = {v: k for k, v in _ST_DTYPES.items()}


def _tensor_bytes(t):
    """The raw little-endian bytes of a tensor, row-major."""
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.view(torch.uint8).numpy().tobytes()


def _safetensors_header(named):
    """(header bytes incl. the 8-byte length, total data size) for a list of
    (name, tensor)."""
    header, offset = {}, 0
    for name, t in named:
        if t.dtype not in _ST_DTYPES:
            raise ExportError("%s has dtype %s, which safetensors cannot "
                              "hold" % (name, t.dtype))
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offset


def write_safetensors(named, f):
    """Writes (name, tensor) pairs as safetensors to the binary file f:
    an 8-byte little-endian header length, a JSON header padded with spaces
    to a multiple of 8, then every tensor's raw little-endian bytes."""
    named = list(named)
    header, _ = _safetensors_header(named)
    f.write(header)
    for _, t in named:
        f.write(_tensor_bytes(t))


def read_safetensors(data, source="safetensors data"):
    """The named tensors of a safetensors file's bytes, as a dict in file
    order. Raises ArchiveError on a malformed file."""
    data = memoryview(data)
    if len(data) < 8:
        raise ArchiveError("%s is too short to be a safetensors file" % source)
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ArchiveError("%s: header length %d runs past the end of the "
                           "file (%d bytes)" % (source, n, len(data)))
    try:
        header = json.loads(bytes(data[8:8 + n]).decode())
    except ValueError as e:
        raise ArchiveError("%s: the header is not JSON (%s)" % (source, e))
    body = data[8 + n:]
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _ST_TORCH[spec["dtype"]]
            shape = [int(d) for d in spec["shape"]]
            begin, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ArchiveError("%s: tensor %r has an unknown dtype or a "
                               "malformed entry: %r" % (source, name, spec))
        numel = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(body) or end - begin != numel * itemsize:
            raise ArchiveError("%s: tensor %r: data_offsets %r do not fit "
                               "shape %r of %s in %d data bytes" %
                               (source, name, [begin, end], shape,
                                spec["dtype"], len(body)))
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        raw = bytearray(body[begin:end])
        if dtype == torch.bool:
            t = torch.frombuffer(raw, dtype=torch.uint8).to(torch.bool)
        else:
            t = torch.frombuffer(raw, dtype=dtype)
        out[name] = t.reshape(shape)
    return out


# ---------------------------------------------------------------- tracing

class _CaptureFailure(Exception):
    """Tracing failed inside the module at ``path`` (the innermost one)."""

    def __init__(self, path, module, error):
        super().__init__(str(error))
        self.path = path
        self.module = module
        self.error = error
        # The frames that led to the call (the user's line calling the
        # module) and those inside it, outermost first.
        self.frames = (traceback.extract_stack()[:-2] +
                       traceback.extract_tb(error.__traceback__))


def _proxy_iter(self):
    # torch 1.13's Proxy.__iter__ indexes the caller's bytecode by
    # f_lasti // 2, which is wrong on Python 3.11 (inline caches), so
    # `b, t, c = x.size()` fails there; find the instruction by offset.
    frame = inspect.currentframe().f_back
    for inst in dis.get_instructions(frame.f_code):
        if inst.offset == frame.f_lasti:
            if inst.opname == "UNPACK_SEQUENCE":
                return (self[i] for i in range(inst.argval))
            break
    return self.tracer.iter(self)


# Tensor factories take sizes, not tensors, so __torch_function__ never sees
# a Proxy among their arguments (torch.arange(t) with t = x.size(1)).
_FACTORIES = ("arange", "zeros", "ones", "full", "empty", "eye", "linspace",
              "rand", "randn", "randint")


def _factory_wrapper(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        proxies = []
        map_aggregate((args, kwargs), lambda v: proxies.append(v)
                      if isinstance(v, fx.Proxy) else None)
        if proxies:
            return proxies[0].tracer.create_proxy("call_function", fn, args,
                                                  kwargs)
        return fn(*args, **kwargs)
    return wrapper


class _Patched:
    """Patches Proxy.__iter__ and the tensor factories while tracing."""

    def __enter__(self):
        self.saved = [(fx.proxy.Proxy, "__iter__",
                       fx.proxy.Proxy.__dict__["__iter__"])]
        if sys.version_info >= (3, 11):
            fx.proxy.Proxy.__iter__ = _proxy_iter
        for name in _FACTORIES:
            fn = getattr(torch, name)
            self.saved.append((torch, name, fn))
            setattr(torch, name, _factory_wrapper(fn))
        return self

    def __exit__(self, *exc):
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)
        return False


class _Tracer(fx.Tracer):
    """Traces through every module except the ``leaves``; proxies buffers;
    records on each node the stack of module paths it was created in
    (``node.meta["tandem_stack"]``, outermost first) and turns a failure
    inside a module into a _CaptureFailure naming the innermost one."""

    proxy_buffer_attributes = True

    def __init__(self, leaves):
        super().__init__()
        self.leaves = leaves
        self.module_stack_paths = []

    def is_leaf_module(self, m, qualname):
        return qualname in self.leaves

    def call_module(self, m, forward, args, kwargs):
        path = self.path_of_module(m)
        self.module_stack_paths.append(path)
        try:
            return super().call_module(m, forward, args, kwargs)
        except _CaptureFailure:
            raise
        except Exception as e:  # noqa: BLE001 -- reported with its module
            raise _CaptureFailure(path, m, e) from e
        finally:
            self.module_stack_paths.pop()

    def create_node(self, *args, **kwargs):
        node = super().create_node(*args, **kwargs)
        node.meta["tandem_stack"] = tuple(self.module_stack_paths)
        return node


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


def _strip(path):
    """A qualified name in the root's namespace -> the user module's own."""
    if path == _ROOT:
        return ""
    if path.startswith(_ROOT + "."):
        return path[len(_ROOT) + 1:]
    return path


def _in_root(path):
    return _ROOT + "." + path if path else _ROOT


# ---------------------------------------------------------------- units

def _param_count(m):
    return sum(p.numel() for p in m.parameters())


def _is_block_container(m):
    """An nn.ModuleList/nn.Sequential of blocks: children of one class, each
    with params and submodules of its own (not a Sequential of Linears)."""
    if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) == 0:
        return False
    children = list(m.children())
    return (all(_param_count(c) > 0 and any(True for _ in c.children())
                for c in children) and
            len({type(c) for c in children}) == 1)


def _unit_paths(module, wrap):
    """The module paths (user namespace, "" for the root) that are units,
    none inside another. wrap: None (every child of a ModuleList/Sequential
    of same-class blocks), a list of module classes, or a min param count."""
    units = []

    def by_containers(m, path):
        if _is_block_container(m):
            for name, child in m.named_children():
                units.append(path + "." + name if path else name)
            return
        for name, child in m.named_children():
            by_containers(child, path + "." + name if path else name)

    def by_classes(m, path):
        if path and isinstance(m, wrap):
            units.append(path)
            return
        for name, child in m.named_children():
            by_classes(child, path + "." + name if path else name)

    def by_size(m, path):
        # FSDP's size policy without nesting: the smallest modules that hold
        # at least `wrap` params each.
        if _param_count(m) < wrap:
            return False
        found = False
        for name, child in m.named_children():
            found |= by_size(child, path + "." + name if path else name)
        if not found:
            units.append(path)
        return True

    if wrap is None:
        by_containers(module, "")
    elif isinstance(wrap, tuple):
        by_classes(module, "")
    else:
        by_size(module, "")
    return units


def _normalize_wrap(wrap):
    if wrap is None:
        return None
    if isinstance(wrap, bool):
        raise ExportError("wrap must be a list of module classes or a "
                          "minimum param count, got %r" % wrap, usage=True)
    if isinstance(wrap, int):
        if wrap < 1:
            raise ExportError("wrap=%d: a minimum param count must be >= 1"
                              % wrap, usage=True)
        return wrap
    if isinstance(wrap, type):
        wrap = [wrap]
    try:
        classes = tuple(wrap)
    except TypeError:
        raise ExportError("wrap must be a list of module classes or a "
                          "minimum param count, got %r" % (wrap,), usage=True)
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, nn.Module)):
            raise ExportError("wrap=[...] takes nn.Module classes, got %r" %
                              (c,), usage=True)
    return classes


class _Unit:
    def __init__(self, key, leaf):
        self.key = key          # module path in the root namespace, or None
        self.leaf = leaf
        self.nodes = []
        self.name = ""
        self.inputs = []        # nodes (placeholders or other units' nodes)
        self.outputs = []       # nodes of this unit read later
        self.params = []        # manifest names
        self.buffers = []
        self.remat = []         # non-tensor nodes recomputed here
        self.constants = {}     # get_attr target -> value (not param/buffer)
        self.baked = {}         # node -> its constant value, passed to a leaf


def _value_name(node):
    if isinstance(node, str):
        return node     # a value local to a glue
    return node.target if node.op == "placeholder" else node.name


# ---------------------------------------------------------------- glue
#
# A container whose forward torch.fx cannot capture (a branch on a mask's
# dtype, a length read with .item(), assignment through a mask) runs as
# glue: the container scripted whole with TorchScript, each unit under it
# replaced by a stub that calls tandem::call_unit(k, inputs), so that the
# units stay units (proto/tandem/v1/archive.proto, ArchiveGlue).

_glue_lib = []
_glue_serving = threading.local()


def _define_call_unit():
    """Defines tandem::call_unit in this process, once: scripting a glue
    needs its schema, and run_archive serves it while a glue runs."""
    if _glue_lib:
        return
    lib = torch.library.Library("tandem", "DEF")
    lib.define("call_unit(int unit, Tensor?[] inputs) -> Tensor[]")
    lib.impl("call_unit", _serve_call_unit, "CompositeImplicitAutograd")
    _glue_lib.append(lib)


def _serve_call_unit(unit, inputs):
    call = getattr(_glue_serving, "call", None)
    if call is None:
        raise RuntimeError("tandem::call_unit(%d) ran outside a glue" % unit)
    return call(unit, list(inputs))


def _glue_for(failure_path, unit_paths_root, glues):
    """The innermost module at or above ``failure_path`` that has units
    below it (the glue to make), or None."""
    path = failure_path
    while path:
        if path not in glues and any(u.startswith(path + ".")
                                     for u in unit_paths_root):
            return path
        if "." not in path:
            return None
        path = path.rsplit(".", 1)[0]
    return None


def _glue_plan(root, glue, unit_paths_root):
    """(calls, through) for the glue at ``glue``: the module paths its
    code calls as units (the units under it, and every other submodule
    holding params that has no unit below it), and the containers between
    it and them, which stay in the glue's code."""
    calls, through = [], []

    def walk(m, path):
        own = [n for n, p in m._parameters.items() if p is not None]
        if own:
            raise ExportError(
                "module %r (%s) runs as glue (torch.fx cannot capture its "
                "forward) and holds param %r itself; glue runs without "
                "params of its own. Move the param into a submodule (an "
                "nn.Linear, or a small nn.Module holding it)" %
                (_strip(path) or "<root>", _class_name(m),
                 _strip(path + "." + own[0])))
        for name, child in m._modules.items():
            if child is None:
                continue
            p = path + "." + name
            if p in unit_paths_root:
                calls.append(p)
            elif any(u.startswith(p + ".") for u in unit_paths_root):
                through.append(p)
                walk(child, p)
            elif any(True for _ in child.parameters()):
                calls.append(p)

    walk(root.get_submodule(glue), glue)
    return calls, through


class _CallRecorder:
    """While entered, records every call of the modules at ``paths``: its
    arguments bound to forward's signature (defaults applied) and its
    result, in call order."""

    def __init__(self, root, paths):
        self.root = root
        self.paths = paths
        self.calls = {p: [] for p in paths}
        self.order = []

    def _wrap(self, path, forward):
        sig = inspect.signature(forward)

        def recording(*args, **kwargs):
            out = forward(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            self.calls[path].append((dict(bound.arguments), out))
            self.order.append(path)
            return out
        return recording

    def __enter__(self):
        for p in self.paths:
            m = self.root.get_submodule(p)
            m.forward = self._wrap(p, m.forward)
        return self

    def __exit__(self, *exc):
        for p in self.paths:
            self.root.get_submodule(p).__dict__.pop("forward", None)
        return False


def _tensor_paths(v, expr, out, what):
    """Appends (expression, tensor) for every tensor in ``v`` (a tensor, or
    tuples and lists of them, None and numbers); raises for other values."""
    if isinstance(v, torch.Tensor):
        out.append((expr, v))
    elif isinstance(v, (tuple, list)):
        for i, x in enumerate(v):
            _tensor_paths(x, "%s[%d]" % (expr, i), out, what)
    elif not (v is None or isinstance(v, (bool, int, float, str))):
        raise ExportError(
            "%s is a %s; what crosses a unit boundary inside glue must be "
            "tensors, None, numbers or strings (or tuples and lists of "
            "them)" % (what, type(v).__name__))
    return out


def _render(v, names):
    """Source for ``v``, its tensors by the next of ``names`` (an iterator),
    in the order _tensor_paths finds them."""
    if isinstance(v, torch.Tensor):
        return next(names)
    if isinstance(v, tuple):
        return "(%s)" % "".join(_render(x, names) + ", " for x in v)
    if isinstance(v, list):
        return "[%s]" % ", ".join(_render(x, names) for x in v)
    return repr(v)


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


def _hollow(m):
    """A copy of module ``m`` and its submodules with every param and buffer
    replaced by an empty tensor and no hooks: what glue code may read of a
    unit it calls (attributes, a layer's flags) without holding its
    weights."""
    obj = copy.copy(m)
    obj.__dict__["_parameters"] = collections.OrderedDict(
        (n, None if p is None else
         nn.Parameter(p.detach().new_empty(0), requires_grad=False))
        for n, p in m._parameters.items())
    obj.__dict__["_buffers"] = collections.OrderedDict(
        (n, None if b is None else b.new_empty(0))
        for n, b in m._buffers.items())
    obj.__dict__["_modules"] = collections.OrderedDict(
        (n, None if c is None else _hollow(c)) for n, c in m._modules.items())
    for hooks in ("_forward_pre_hooks", "_forward_hooks",
                  "_backward_hooks"):
        if hooks in obj.__dict__:
            obj.__dict__[hooks] = collections.OrderedDict()
    for k, v in list(obj.__dict__.items()):
        if isinstance(v, torch.Tensor):
            # A plain tensor attribute (weight norm's computed weight).
            obj.__dict__[k] = v.detach().new_empty(0)
    return obj


def _call_stub(module, path, index, arguments, result, unit_name):
    """The stand-in glue code calls for the unit at ``path`` (its index in
    the archive ``index``): an instance of a subclass of the module's class,
    hollow (_hollow), whose forward has the module's signature and calls
    tandem::call_unit with the arguments that were tensors at capture. The
    others were captured as constants and must not change; the result is
    rebuilt around the tensors the unit returns."""
    cls = type(module)
    f = cls.forward
    sig = inspect.signature(f)
    params = list(sig.parameters.values())[1:]
    header, checks, passed = ["self"], [], []
    # TorchScript reads a method's types from its source: each annotation
    # goes in as a name bound to the original's annotation object.
    aliases = {}

    def annotated(text, ann):
        if ann is inspect.Parameter.empty:
            return text
        alias = "_tandem_ann_%d" % len(aliases)
        aliases[alias] = ann
        return "%s: %s" % (text, alias)
    star = False
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ExportError(
                "module %r (%s) is called by glue, and its forward takes "
                "*args or **kwargs, which TorchScript cannot call; give "
                "forward named arguments" % (unit_name, _class_name(module)))
        if p.kind == p.KEYWORD_ONLY and not star:
            header.append("*")
            star = True
        header.append(annotated(p.name, p.annotation) +
                      ("" if p.default is p.empty else "=None"))
        v = arguments[p.name]
        found = _tensor_paths(v, p.name, [], "argument %r of %r" %
                              (p.name, unit_name))
        passed.extend(e for e, _ in found)
        if not found:
            msg = ("tandem: unit %s was exported with %s=%r; this call "
                   "passes another value. Export with an example batch that "
                   "takes this path" % (unit_name, p.name, v))
            if v is None:
                checks.append("        if %s is not None:\n"
                              "            raise RuntimeError(%r)\n" %
                              (p.name, msg))
            elif isinstance(v, (bool, int, float, str)):
                checks.append("        if %s != %r:\n"
                              "            raise RuntimeError(%r)\n" %
                              (p.name, v, msg))
    outs = _tensor_paths(result, "result", [], "what %r returns" % unit_name)
    if not outs:
        raise ExportError("module %r (%s) returns no tensor; a unit must "
                          "return at least one" %
                          (unit_name, _class_name(module)))
    cname = "TandemCall_%s_%d" % (_safe_name(cls.__name__), index)
    returns = ""
    if sig.return_annotation is not inspect.Signature.empty:
        returns = " -> " + annotated("", sig.return_annotation)[2:]
    src = ("class %s(Base):\n"
           "    def forward(%s)%s:\n"
           "%s"
           "        outs = torch.ops.tandem.call_unit(%d, torch.jit.annotate("
           "List[Optional[Tensor]], [%s]))\n"
           "        return %s\n" %
           (cname, ", ".join(header), returns, "".join(checks), index,
            ", ".join(passed),
            _render(result, iter("outs[%d]" % i for i in range(len(outs))))))
    ns = dict(f.__globals__)
    ns.update(aliases)
    stub_cls = _subclass(cls, cname, src, ns)
    fwd = stub_cls.forward
    fwd.__defaults__ = f.__defaults__
    fwd.__kwdefaults__ = f.__kwdefaults__
    stub = stub_cls.__new__(stub_cls)
    stub.__dict__.update(_hollow(module).__dict__)
    return stub, [t for _, t in outs]


def _unit_adapter(module, unit_name, arguments, result):
    """The unit a glue calls, as a leaf unit: a subclass of the module's
    class whose forward takes the tensors of the captured call positionally,
    calls the original forward with them and the captured constants, and
    returns a tuple of the tensors of its result (the order _call_stub
    passes and rebuilds them in). Returns (adapter, example inputs)."""
    ins = []
    for name, v in arguments.items():
        _tensor_paths(v, name, ins, "argument %r of %r" % (name, unit_name))
    names = iter("in_%d" % i for i in range(len(ins)))
    outs = _tensor_paths(result, "result", [], "what %r returns" % unit_name)
    args = ["%s=%s" % (n, _render(v, names)) for n, v in arguments.items()]
    obj = _adapter(module, "Unit", ["in_%d" % i for i in range(len(ins))],
                   args, [e for e, _ in outs])
    return obj, [t for _, t in ins]


def _stubbed(m, path, stubs, through):
    """Replaces, in module ``m`` at ``path`` (modified in place), every
    child that a glue calls by its stub, and every container on the way by
    a copy so replaced."""
    for name, child in list(m._modules.items()):
        p = path + "." + name
        if p in stubs:
            m._modules[name] = stubs[p]
        elif p in through:
            c = copy.copy(child)
            c.__dict__["_modules"] = collections.OrderedDict(child._modules)
            _stubbed(c, p, stubs, through)
            m._modules[name] = c


class _Glue:
    def __init__(self, outer, calls, through):
        self.outer = outer      # the _Unit of its call in the traced graph
        self.calls = calls      # module paths it calls as units
        self.through = through
        self.first = 0
        self.count = 0
        self.file = ""
        self.module = None      # the scripted glue


def _expand_glues(units, glues, recorder, root, root_params, root_buffers):
    """Replaces each glue's unit by the units it calls, in the order it
    called them on the example batch; returns (units, [_Glue])."""
    by_id = {id(p): n for n, p in root_params}
    by_id_b = {id(b): n for n, b in root_buffers}
    out, made = [], []
    for u in units:
        if u.key not in glues:
            out.append(u)
            continue
        calls, through = glues[u.key]
        g = _Glue(u, calls, through)
        g.first = len(out)
        glue_name = u.name
        for p in calls:
            n = len(recorder.calls[p])
            if n != 1:
                raise ExportError(
                    "module %r (%s) is called %s by the glue %r on the "
                    "example batch; a unit inside glue runs exactly once "
                    "per step. %s" %
                    (_strip(p), _class_name(root.get_submodule(p)),
                     "never" if n == 0 else "%d times" % n, glue_name,
                     "Delete it from the module, or export with an example "
                     "batch on which forward calls it" if n == 0 else
                     "Give each call a module of its own"))
        for p in sorted(calls, key=recorder.order.index):
            module = root.get_submodule(p)
            arguments, result = recorder.calls[p][0]
            cu = _Unit(p, True)
            cu.name = _strip(p)
            cu.glue = g
            cu.arguments = arguments
            cu.result = result
            cu.params = _names_of(module.parameters(), by_id, [])
            cu.buffers = _names_of(module.buffers(), by_id_b, [])
            out.append(cu)
        g.count = len(out) - g.first
        made.append(g)
    return out, made


def _script_glue(g, root, units, values):
    """Scripts glue ``g`` (its container with stubs for the units it calls)
    and the units it calls; checks the glue, run with them, against the
    module on the example batch. Returns {entry: bytes}."""
    _define_call_unit()
    u = g.outer
    entries = {}
    stubs, examples = {}, {}
    for k in range(g.first, g.first + g.count):
        cu = units[k]
        module = root.get_submodule(cu.key)
        stubs[cu.key], _ = _call_stub(module, cu.key, k, cu.arguments,
                                      cu.result, cu.name)
        adapter, ins = _unit_adapter(module, cu.name, cu.arguments,
                                     cu.result)
        scripted = _script(adapter, "unit %r (%s), called by glue %r" %
                           (cu.name, _class_name(module), u.name),
                           prefix=cu.name)
        with torch.no_grad(), _seeded():
            got = scripted(*ins)
        want = _tensor_paths(cu.result, "result", [], "")
        if len(got) != len(want) or not all(
                _allclose(a, b, 1e-5, 1e-6) for a, (_, b) in zip(got, want)):
            raise ExportError("unit %r: its TorchScript module computes "
                              "other values than the module on the example "
                              "batch" % cu.name)
        cu.inputs = ["%s/in%d" % (cu.name, i) for i in range(len(ins))]
        cu.outputs = ["%s/out%d" % (cu.name, i) for i in range(len(got))]
        cu.scripted = scripted
        examples[k] = ins
        entries[cu.file] = _jit_bytes(scripted)
    # Glue code may test isinstance(layer, TheLayerClass) (PyTorch's own
    # TransformerEncoder does); TorchScript resolves a module class in such
    # a test only once it has scripted one: script a hollow instance of each
    # called class first. One that does not script is not tested so.
    for k in range(g.first, g.first + g.count):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                torch.jit.script(_hollow(root.get_submodule(units[k].key)))
            except Exception:  # noqa: BLE001,S110 -- only a type to resolve
                pass
    adapter = _leaf_adapter(u, root, weight_norm=False)
    _stubbed(adapter, u.key, stubs, set(g.through))
    scripted = _script(adapter, "glue %r (%s)" % (
        u.name, _class_name(root.get_submodule(u.key))), prefix=u.name)

    def call(k, inputs):
        return list(units[k].scripted(*inputs))
    _glue_serving.call = call
    try:
        with torch.no_grad(), _seeded():
            got = scripted(*[values[a] for a in u.inputs])
    except Exception as e:  # noqa: BLE001 -- reported with the glue
        raise ExportError("glue %r fails when it calls its units: %s: %s" %
                          (u.name, type(e).__name__, _first_line(e)))
    finally:
        _glue_serving.call = None
    want = [values[o] for o in u.outputs]
    if len(got) != len(want) or not all(
            _allclose(a, b, 1e-5, 1e-6) for a, b in zip(got, want)):
        raise ExportError("glue %r: its TorchScript module computes other "
                          "values than the module on the example batch" %
                          u.name)
    g.module = scripted
    entries[g.file] = _jit_bytes(scripted)
    return entries


# ---------------------------------------------------------------- errors

def _user_files(root, extra=()):
    files = set()
    torch_dir = os.path.dirname(torch.__file__)
    for m in root.modules():
        try:
            f = inspect.getsourcefile(type(m))
        except TypeError:
            continue
        if f and not f.startswith(torch_dir) and f != __file__:
            files.add(os.path.abspath(f))
    for obj in extra:
        try:
            f = inspect.getsourcefile(obj)
        except TypeError:
            continue
        if f:
            files.add(os.path.abspath(f))
    return files


def _where(error, user_files, frames=None):
    """'file:line: code' of the innermost traceback frame in the user's own
    files (else the innermost outside torch and tandem), or ''."""
    if frames is None:
        frames = traceback.extract_tb(error.__traceback__)
    torch_dir = os.path.dirname(torch.__file__)
    pick = None
    for fr in reversed(frames):
        if os.path.abspath(fr.filename) in user_files:
            pick = fr
            break
    if pick is None:
        for fr in reversed(frames):
            fn = os.path.abspath(fr.filename)
            if (not fn.startswith(torch_dir) and fn != __file__ and
                    not fr.filename.startswith("<")):
                pick = fr
                break
    if pick is None:
        return ""
    return "%s:%d: %s" % (_show_path(pick.filename), pick.lineno,
                          (pick.line or "").strip())


def _show_path(f):
    f = os.path.abspath(f)
    rel = os.path.relpath(f)
    return f if rel.startswith("..") else rel


def _first_line(error):
    """The first line of an exception's message ("" when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _what_went_wrong(error):
    text = _first_line(error)
    text = "%s: %s" % (type(error).__name__, text) if text else \
        type(error).__name__
    if isinstance(error, fx.proxy.TraceError) or "symbolically traced" in text:
        return ("forward branches on a traced value (an `if`, `while`, "
                "`bool()`, `int()` or `len()` of a tensor or of its shape), "
                "which torch.fx cannot capture (%s)" % text)
    return "torch.fx could not trace it (%s)" % text


def _class_name(m):
    c = type(m)
    if getattr(nn, c.__name__, None) is c:
        return "torch.nn." + c.__name__
    if c.__module__.startswith("torch."):
        return "%s.%s" % (c.__module__, c.__qualname__)
    return c.__qualname__


# ---------------------------------------------------------------- export

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


def _trace(root, unit_paths, user_files):
    """Traces root, making a unit a leaf when FX cannot trace inside it, and
    a container above units glue (an FX leaf whose units are called from
    its scripted code) when FX cannot trace it. Returns (graph, tracer,
    leaves, glues)."""
    leaves, glues = set(), set()
    # The root itself is never made a leaf: its failure is reported.
    in_root_units = {_in_root(p) for p in unit_paths if p}
    for _ in range(len(unit_paths) + 32):
        tracer = _Tracer(leaves)
        try:
            with _Patched():
                graph = tracer.trace(root)
            return graph, tracer, leaves, glues
        except _CaptureFailure as f:
            unit = next((u for u in sorted(in_root_units, key=len)
                         if f.path == u or f.path.startswith(u + ".")), None)
            if unit is not None and unit not in leaves:
                leaves.add(unit)
                continue
            glue = None if unit is not None else _glue_for(
                f.path, in_root_units, glues)
            if glue is not None:
                # A glue above another takes it in.
                for g in [g for g in glues if g.startswith(glue + ".")]:
                    glues.discard(g)
                    leaves.discard(g)
                glues.add(glue)
                leaves.add(glue)
                continue
            raise _capture_error(root, f, unit_paths, user_files)
        except ExportError:
            raise
        except Exception as e:  # noqa: BLE001 -- the root's own code
            where = _where(e, user_files)
            raise ExportError(
                "cannot capture the model's forward (or the loss function): "
                "%s%s. Move the data-dependent branch out of forward, or pass "
                "loss= a function that torch.fx can trace" %
                (_what_went_wrong(e), "\n  at " + where if where else ""))
    raise ExportError("tracing did not settle on a set of leaf units")


def _capture_error(root, failure, unit_paths, user_files):
    path = _strip(failure.path)
    m = failure.module
    where = _where(failure.error, user_files, failure.frames)
    classes = []
    for p in unit_paths:
        c = type(root.get_submodule(_in_root(p)))
        if c not in classes:
            classes.append(c)
    if type(m) not in classes:
        classes.append(type(m))
    if path == "":
        todo = ("move the data-dependent branch out of forward, or into "
                "a submodule that can be made a leaf")
    else:
        todo = ("make it a leaf: wrap=[%s] (CLI: --wrap %s), so that it "
                "becomes a unit of its own, scripted whole with TorchScript; "
                "or move the data-dependent branch out of forward" %
                (", ".join(c.__name__ for c in classes),
                 ",".join(c.__name__ for c in classes)))
    inside = _innermost_line(failure.frames)
    return ExportError(
        "cannot capture module %r (%s): %s%s%s\n  %s" %
        (path or "<root>", _class_name(m), _what_went_wrong(failure.error),
         "\n  at " + where if where else "",
         "\n  failing line: " + inside if inside and inside != where else "",
         todo))


def _innermost_line(frames):
    """'file:line: code' of the innermost frame outside torch.fx and tandem
    (the line that failed, in the user's module or in torch.nn's), or ''."""
    fx_dir = os.path.dirname(fx.__file__)
    for fr in reversed(frames):
        fn = os.path.abspath(fr.filename)
        if (not fn.startswith(fx_dir) and fn != os.path.abspath(__file__)
                and not fr.filename.startswith("<")):
            return "%s:%d: %s" % (_show_path(fr.filename), fr.lineno,
                                  (fr.line or "").strip())
    return ""


class _Recorder(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        v = super().run_node(n)
        self.values[n] = v
        return v


def _partition(graph, unit_paths_root, leaves, values):
    """Nodes -> units in execution order (contiguous runs of nodes in the
    same unit module; code outside any unit module forms units too)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    units, node_unit = [], {}
    for n in graph.nodes:
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        key = next((p for p in n.meta.get("tandem_stack", ())
                    if p in unit_paths_root), None)
        if not units or units[-1].key != key:
            units.append(_Unit(key, key in leaves))
        units[-1].nodes.append(n)
        node_unit[n] = units[-1]
    # Unpacking a tuple another unit returns (a leaf's (out, weights)):
    # the getitem moves to that unit, so only tensors cross units.
    for n in list(node_unit):
        if (n.op == "call_function" and n.target is operator.getitem and
                isinstance(n.args[0], fx.Node) and n.args[0] in node_unit):
            src = node_unit[n.args[0]]
            v = values.get(n.args[0])
            if (src is not node_unit[n] and not isinstance(v, torch.Tensor)
                    and _has_tensor(v)):
                node_unit[n].nodes.remove(n)
                src.nodes.append(n)
                src.nodes.sort(key=order.get)
                node_unit[n] = src
    units = [u for u in units if u.nodes]
    return units, node_unit, order


def _name_units(units):
    keyed = [i for i, u in enumerate(units) if u.key is not None]
    seen = {}
    for i, u in enumerate(units):
        if u.key is not None:
            base = _strip(u.key) or "model"
        elif not keyed:
            base = "model"
        elif i < keyed[0]:
            base = "embed"
        elif i > keyed[-1]:
            base = "head"
        else:
            prev = max(k for k in keyed if k < i)
            base = "after." + (_strip(units[prev].key) or "model")
        seen[base] = seen.get(base, 0) + 1
        u.name = base if seen[base] == 1 else "%s#%d" % (base, seen[base])


def _collect(units, node_unit, order, values, root, param_names,
             buffer_names):
    """Each unit's params, buffers, inputs, recomputed shape values and the
    outputs other units read."""
    params_by_id = {id(p): n for n, p in param_names}
    buffers_by_id = {id(b): n for n, b in buffer_names}

    for u in units:
        own = set(u.nodes)
        inputs, params, buffers, remat = {}, set(), set(), {}

        def need(a, consumer_is_leaf):
            if a in own or a in remat:
                return
            if a.op == "placeholder":
                inputs[a] = True
                return
            if a.op == "get_attr":
                val = _fetch_attr(root, a.target)
                if id(val) in params_by_id:
                    params.add(params_by_id[id(val)])
                elif id(val) in buffers_by_id:
                    buffers.add(buffers_by_id[id(val)])
                else:
                    u.constants[a.target] = val
                return
            v = values.get(a)
            if isinstance(v, torch.Tensor):
                inputs[a] = True
                return
            if consumer_is_leaf and (v is None or
                                     isinstance(v, (bool, int, float, str))):
                # Passed to the leaf (or glue) as the constant it was at
                # capture (a None, a flag); _verify runs other shapes.
                u.baked[a] = v
                return
            if consumer_is_leaf or a.op == "call_module" or _has_tensor(v):
                raise ExportError(
                    "value %r (a %s) made in unit %r is read by unit %r; "
                    "only tensors can flow between units. Return tensors "
                    "from the block, or choose other units with wrap=" %
                    (a.name, type(v).__name__, node_unit[a].name, u.name))
            remat[a] = True
            for b in a.all_input_nodes:
                need(b, False)

        for n in u.nodes:
            for a in n.all_input_nodes:
                need(a, u.leaf)
        u.inputs = sorted(inputs, key=order.get)
        u.remat = sorted(remat, key=order.get)
        u.params = [n for n, _ in param_names if n in params]
        u.buffers = [n for n, _ in buffer_names if n in buffers]
        if u.leaf:
            lm = root.get_submodule(u.key)
            u.params = _names_of(lm.parameters(), params_by_id, u.params)
            u.buffers = _names_of(lm.buffers(), buffers_by_id, u.buffers)

    for u in units:
        for a in u.inputs:
            if a.op != "placeholder":
                src = node_unit[a]
                if a not in src.outputs:
                    src.outputs.append(a)
    for u in units:
        u.outputs.sort(key=order.get)


def _names_of(tensors, by_id, also):
    names = set(also)
    for t in tensors:
        if id(t) in by_id:
            names.add(by_id[id(t)])
    return [n for n in by_id.values() if n in names]


def _has_tensor(v):
    found = []
    map_aggregate(v, lambda x: found.append(x)
                  if isinstance(x, torch.Tensor) else None)
    return bool(found)


def _fetch_attr(root, target):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _unit_graph_module(u, order, param_index, buffer_index):
    """The FX GraphModule of a non-leaf unit: placeholders for its params,
    buffers and inputs, its nodes (and recomputed shape values), and a tuple
    of its outputs."""
    g = fx.Graph()
    env = {}
    lifted = {}
    for name in u.params:
        lifted[("p", name)] = g.placeholder(_safe_name("p_" + _strip(name)))
    for name in u.buffers:
        lifted[("b", name)] = g.placeholder(_safe_name("b_" + _strip(name)))
    for a in u.inputs:
        env[a] = g.placeholder(_safe_name("in_" + _value_name(a)))
    consts = {}

    def arg(a):
        if a in env:
            return env[a]
        if a.op == "get_attr":
            if a.target in param_index:
                return lifted[("p", param_index[a.target])]
            if a.target in buffer_index:
                return lifted[("b", buffer_index[a.target])]
            attr = "c_" + _safe_name(a.target)
            consts[attr] = u.constants[a.target]
            env[a] = g.get_attr(attr)
            return env[a]
        raise AssertionError("unit %s: %s not available" % (u.name, a))

    for n in sorted(u.nodes + u.remat, key=order.get):
        env[n] = g.node_copy(n, arg)
    g.output(tuple(env[o] for o in u.outputs))
    g.lint()
    return fx.GraphModule(consts, g, class_name="TandemUnit")


def _safe_name(s):
    out = "".join(c if c.isalnum() else "_" for c in s)
    return out if not out[:1].isdigit() else "_" + out


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


@contextlib.contextmanager
def _seeded(seed=0):
    """Every run that is compared starts from the same RNG state, so random
    ops (dropout) draw the same numbers in the module and in its units."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _allclose(a, b, rtol, atol):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def export(module, example_batch, loss=None, wrap=None, path=None, name=None,
           dynamic_dims=None, roles=None, source=None, input_ranges=None):
    """Captures ``module`` into a model archive and returns its manifest (a
    ``tandem.v1.archive_pb2.ArchiveManifest``); writes the archive to
    ``path`` when given.

    module: a torch.nn.Module whose forward takes ``example_batch``'s
      tensors as keyword arguments and returns the scalar loss (the mean over
      the batch's tokens or samples), or whatever ``loss`` maps to it.
    example_batch: {name: tensor}; dim 0 of every tensor is the micro-batch.
    loss: None, or ``loss(outputs, batch) -> scalar tensor``.
    wrap: None (every child of an nn.ModuleList/nn.Sequential of blocks is a
      unit), a list of module classes (each such module is a unit), or an int
      (the smallest modules with at least that many params are units).
    path: where to write the archive (a temporary file next to it is renamed
      into place only when everything succeeded).
    name: the model's name (default: the module's class name).
    dynamic_dims: {input name: [dims]} that may vary from batch to batch
      (default: every dim >= 1; dim 0 always varies).
    roles: {input name: "tokens" | "targets" | ""} (default: input_ids /
      tokens / idx and labels / targets when both are int64 of one shape).
    source: where the module came from, recorded in the manifest.
    input_ranges: {input name: (low, high)}: the values ``data.kind:
      synthetic`` draws for an integer or bool input, both included (default:
      the example batch's smallest and largest; give a classifier's labels
      (0, classes - 1)). Floating inputs are drawn with the example batch's
      mean and standard deviation (tandem.synthetic).

    Raises ExportError saying what to change when the module cannot be
    captured.
    """
    from tandem.v1 import archive_pb2

    if loss is not None and not callable(loss):
        raise ExportError("loss must be a function (outputs, batch) -> "
                          "scalar tensor, got %r" % (loss,), usage=True)
    names, forward_names = _check_batch(module, example_batch,
                                        loss is not None)
    wrap_given = wrap is not None
    wrap = _normalize_wrap(wrap)
    inputs = _inputs_spec(example_batch, names, dynamic_dims, roles)
    synthetic = _synthetic_spec(example_batch, inputs, input_ranges)
    batch = {n: example_batch[n] for n in names}
    if path is not None:
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d):
            raise ExportError("cannot write %s: directory %s does not exist" %
                              (path, d), usage=True)

    root = _make_root(module, names, forward_names, loss)
    user_files = _user_files(root, [loss] if loss is not None and
                             not isinstance(loss, nn.Module) else [])

    # The reference: the module itself, eagerly.
    param_names = list(module.named_parameters())
    buffer_names = list(module.named_buffers())
    ref_loss, ref_grads = _eager_loss_and_grads(root, batch, param_names,
                                                user_files)
    inputs, checks = _probe_dynamic(root, batch, inputs,
                                    set(dynamic_dims or ()), param_names,
                                    user_files)

    unit_paths = _unit_paths(module, wrap)
    if wrap_given and not unit_paths:
        raise ExportError("wrap=%r matches no module of %s; name classes it "
                          "contains or a smaller param count" %
                          (wrap, type(module).__name__), usage=True)
    graph, _, leaves, glue_paths = _trace(root, unit_paths, user_files)
    gm = fx.GraphModule(root, graph)
    graph = gm.graph
    graph.eliminate_dead_code()
    gm.recompile()

    unit_paths_root = {_in_root(p) for p in unit_paths}
    glues = {g: _glue_plan(root, g, unit_paths_root) for g in glue_paths}
    calls = _CallRecorder(root, [p for c, _ in glues.values() for p in c])
    with torch.no_grad(), _seeded(), calls:
        rec = _Recorder(gm)
        traced_loss = rec.run(*[batch[n] for n in names])
    if not (isinstance(traced_loss, torch.Tensor) and
            _allclose(traced_loss, ref_loss.detach(), _LOSS_RTOL, 0)):
        raise ExportError("the traced forward computes %r, the module %r on "
                          "the example batch: forward depends on something "
                          "torch.fx does not capture (Python state changed "
                          "by forward, hooks, a global); make forward a "
                          "function of its inputs and params" %
                          (traced_loss, ref_loss))

    units, node_unit, order = _partition(graph, unit_paths_root | set(glues),
                                         leaves, rec.values)
    out_node = next(n for n in graph.nodes if n.op == "output")
    loss_node = out_node.args[0]
    if not isinstance(loss_node, fx.Node) or loss_node not in node_unit:
        raise ExportError("forward's loss is not computed from the batch and "
                          "the params (it is %r)" % (loss_node,))
    _name_units(units)
    root_params = [(_ROOT + "." + n, p) for n, p in param_names]
    root_buffers = [(_ROOT + "." + n, b) for n, b in buffer_names]
    _collect(units, node_unit, order, rec.values, root, root_params,
             root_buffers)
    last = units[-1]
    if node_unit[loss_node] is not last:
        raise ExportError("forward computes something after its loss; "
                          "return the loss last")
    if loss_node not in last.outputs:
        last.outputs.append(loss_node)
    units, glue_list = _expand_glues(units, glues, calls, root, root_params,
                                     root_buffers)

    # Every param must be used, or the worker would hold one no unit reads.
    used = {}
    for u in units:
        for p in u.params:
            used.setdefault(p, []).append(u.name)
    unused = [_strip(n) for n, _ in root_params if n not in used]
    if unused:
        raise ExportError(
            "%d param(s) of %s are never used by forward on the example "
            "batch: %s%s. Delete them from the module before exporting (a "
            "branch not taken on the example batch is not captured)" %
            (len(unused), type(module).__name__, ", ".join(unused[:8]),
             ", ..." if len(unused) > 8 else ""))
    used_buffers = {}
    for u in units:
        for b in u.buffers:
            used_buffers.setdefault(b, []).append(u.name)

    tensors = dict(root_params)
    tensors.update(root_buffers)
    entries = _script_units(units, root, rec.values, order, root_params,
                            root_buffers, glue_list)

    manifest = archive_pb2.ArchiveManifest(
        format_version=FORMAT_VERSION,
        name=name or type(module).__name__,
        source=source or _default_source(module),
        torch_version=torch.__version__,
        loss=loss_node.name)
    for n, t, dims, role in inputs:
        entry = manifest.inputs.add(name=n, dtype=_dtype_name(t.dtype),
                                    shape=list(t.shape), dynamic_dims=dims,
                                    role=role)
        if n in synthetic:
            entry.synthetic.CopyFrom(archive_pb2.ArchiveSynthetic(
                **synthetic[n]))
    for n, p in root_params:
        manifest.params.add(name=_strip(n), shape=list(p.shape),
                            dtype=_dtype_name(p.dtype),
                            requires_grad=p.requires_grad, units=used[n])
    weight_names = [n for n, _ in root_params]
    for n, b in root_buffers:
        if n in used_buffers:
            manifest.buffers.add(name=_strip(n), shape=list(b.shape),
                                 dtype=_dtype_name(b.dtype),
                                 units=used_buffers[n])
            weight_names.append(n)
    for u in units:
        manifest.units.add(
            name=u.name, file=u.file,
            inputs=[_value_name(a) for a in u.inputs],
            outputs=[_value_name(a) for a in u.outputs],
            params=[_strip(n) for n in u.params],
            buffers=[_strip(n) for n in u.buffers], leaf=u.leaf)
    for g in glue_list:
        manifest.glues.add(
            name=g.outer.name, file=g.file, first_unit=g.first,
            unit_count=g.count,
            inputs=[_value_name(a) for a in g.outer.inputs],
            outputs=[_value_name(a) for a in g.outer.outputs])
    for f, data in entries.items():
        manifest.sha256[f] = hashlib.sha256(data).hexdigest()

    weights = [(_strip(n), tensors[n]) for n in weight_names]
    archive = Archive(manifest, entries,
                      weights={n: t.detach() for n, t in weights})
    _verify(archive, batch, ref_loss, ref_grads, checks)
    manifest.saved_activation_bytes = _saved_activation_bytes(archive, batch)
    for dtype, tolerances in _PRECISION_CHECKS.items():
        manifest.precision_checks.add(
            dtype=_dtype_name(dtype),
            error=_check_precision(archive, root, batch, dtype,
                                   **tolerances) or "")

    if path is not None:
        _write_archive(path, manifest, entries, weights)
    return manifest


def _script_units(units, root, values, order, root_params, root_buffers,
                  glues=()):
    """Scripts every unit and checks it against its torch.fx form on the
    example values (a unit a glue calls, and the glue, against the module
    itself: _script_glue); returns {"units/NNN.pt": bytes, "glue/NNN.pt":
    bytes}."""
    param_index = {}
    for n, p in root_params:
        param_index[n] = n
    # get_attr resolves a tied param to its first name; map every alias.
    by_id = {id(p): n for n, p in root_params}
    by_id_b = {id(b): n for n, b in root_buffers}
    buffer_index = {}
    for n, t in _all_tensor_names(root):
        if id(t) in by_id:
            param_index[n] = by_id[id(t)]
        elif id(t) in by_id_b:
            buffer_index[n] = by_id_b[id(t)]

    tensors = dict(root_params)
    tensors.update(root_buffers)
    entries = {}
    for i, u in enumerate(units):
        u.file = "units/%03d.pt" % i
        if getattr(u, "glue", None) is not None:
            _check_leaf_binding(u, root)
            continue
        if u.leaf:
            if u.name != _strip(u.key):
                raise ExportError(
                    "leaf module %r (%s) runs more than once in forward; a "
                    "leaf unit runs once. Call it once, or choose units with "
                    "wrap= so that it is not a leaf" %
                    (_strip(u.key), _class_name(root.get_submodule(u.key))))
            _check_leaf_binding(u, root)
            adapter = _leaf_adapter(u, root)
            scripted = _script(adapter, "leaf unit %r (%s)" % (
                u.name, _class_name(root.get_submodule(u.key))),
                prefix=_strip(u.key))
            fx_args = [values[a] for a in u.inputs]
            with torch.no_grad(), _seeded():
                fx_out = adapter(*fx_args)
            own = dict(scripted.named_parameters())
            own.update(dict(scripted.named_buffers()))
            for n in u.params + u.buffers:
                rel = n[len(u.key) + 1:]
                if rel not in own:
                    raise ExportError("leaf unit %r: the scripted module has "
                                      "no attribute %r" % (u.name, rel))
        else:
            ugm = _unit_graph_module(u, order, param_index, buffer_index)
            scripted = _script(ugm, "unit %r" % u.name)
            fx_args = ([tensors[n] for n in u.params] +
                       [tensors[n] for n in u.buffers] +
                       [values[a] for a in u.inputs])
            with torch.no_grad(), _seeded():
                fx_out = ugm(*fx_args)
        with torch.no_grad(), _seeded():
            sc_out = scripted(*fx_args)
        if len(sc_out) != len(u.outputs) or not all(
                isinstance(a, torch.Tensor) and
                _allclose(a, b, 1e-5, 1e-6) for a, b in zip(sc_out, fx_out)):
            raise ExportError("unit %r: its TorchScript module computes "
                              "other values than its torch.fx graph on the "
                              "example batch" % u.name)
        entries[u.file] = _jit_bytes(scripted)
    for i, g in enumerate(glues):
        g.file = "glue/%03d.pt" % i
        entries.update(_script_glue(g, root, units, values))
    return entries


def _check_leaf_binding(u, root):
    for n in u.params + u.buffers:
        if not n.startswith(u.key + "."):
            raise ExportError(
                "leaf unit %r reads %r, a param or buffer tied to one "
                "outside it; tandem binds a leaf's params by their names "
                "inside it. Untie it, or choose units with wrap= so that "
                "this module is not a leaf" % (u.name, _strip(n)))


def _all_tensor_names(root):
    """Every (qualified name, param or buffer), aliases included."""
    for path, m in root.named_modules(remove_duplicate=False):
        for d in (m._parameters, m._buffers):
            for n, t in d.items():
                if t is not None:
                    yield (path + "." + n if path else n), t


def _default_source(module):
    cls = type(module)
    try:
        f = _show_path(inspect.getsourcefile(cls))
    except (TypeError, ValueError):
        f = cls.__module__
    return "%s:%s" % (f, cls.__qualname__)


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
    """The bytes the archive's units save for backward on ``batch``: every
    tensor autograd keeps from the forward to the backward, each storage
    counted once, the params, buffers and batch excluded. What a rank holds
    at the end of its forward, beyond its weights, when it runs the units
    at this batch's shape (no activation checkpointing)."""
    params = {p.name: archive.weights()[p.name].clone().requires_grad_(
        p.requires_grad) for p in archive.manifest.params}
    buffers = {b.name: archive.weights()[b.name]
               for b in archive.manifest.buffers}
    owned = {t.storage().data_ptr()
             for t in list(params.values()) + list(buffers.values()) +
             list(batch.values()) if t.numel() > 0}
    saved = {}

    def pack(t):
        if t.numel() > 0:
            s = t.storage()
            ptr = s.data_ptr()
            if ptr not in owned:
                saved[ptr] = max(saved.get(ptr, 0),
                                 s.size() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            _seeded():
        run_archive(archive, batch, params=params, buffers=buffers)
    return sum(saved.values())


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


def _write_archive(path, manifest, entries, weights):
    """Writes the zip to a temporary file next to path and renames it into
    place; on any failure removes the temporary file and leaves path as it
    was."""
    from google.protobuf import json_format

    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f, \
                zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            for name, data in entries.items():
                zf.writestr(ARCHIVE_DIR + name, data)
            h = hashlib.sha256()
            header, size = _safetensors_header(weights)
            with zf.open(ARCHIVE_DIR + WEIGHTS_ENTRY, "w",
                         force_zip64=len(header) + size > 2**31) as w:
                w.write(header)
                h.update(header)
                for _, t in weights:
                    b = _tensor_bytes(t)
                    w.write(b)
                    h.update(b)
            manifest.sha256[WEIGHTS_ENTRY] = h.hexdigest()
            text = json_format.MessageToJson(
                manifest, preserving_proto_field_name=True,
                including_default_value_fields=True, indent=1)
            zf.writestr(ARCHIVE_DIR + MANIFEST_ENTRY, text + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------- reading

class Archive:
    """A model archive read back: ``manifest`` (ArchiveManifest), ``entries``
    ({path relative to "model/": bytes}), ``path`` (None when in memory)."""

    def __init__(self, manifest, entries, weights=None, path=None):
        self.manifest = manifest
        self.entries = entries
        self.path = path
        self._weights = weights

    def weights(self):
        """{param or buffer name: tensor}: the initial weights."""
        if self._weights is None:
            self._weights = read_safetensors(
                self.entries[WEIGHTS_ENTRY],
                "%s: %s" % (self.path, WEIGHTS_ENTRY))
        return self._weights

    def unit_module(self, unit):
        """The TorchScript module of a unit (an ArchiveUnit or its index)."""
        if isinstance(unit, int):
            unit = self.manifest.units[unit]
        return torch.jit.load(io.BytesIO(self.entries[unit.file]))

    def glue_module(self, glue):
        """The TorchScript module of a glue (an ArchiveGlue or its index)."""
        _define_call_unit()
        if isinstance(glue, int):
            glue = self.manifest.glues[glue]
        return torch.jit.load(io.BytesIO(self.entries[glue.file]))


def load_archive(path):
    """Reads a model archive, checks its format_version and the SHA-256 of
    every entry, and returns an Archive. Raises ArchiveError saying what is
    wrong."""
    from google.protobuf import json_format

    from tandem.v1 import archive_pb2

    path = os.fspath(path)
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArchiveError("%s: no such archive" % path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ArchiveError("%s is not a tandem model archive (%s); export "
                           "one with `tandem export`" % (path, e))
    with zf:
        raw = {}
        for info in zf.infolist():
            if info.is_dir():
                continue
            if not info.filename.startswith(ARCHIVE_DIR):
                raise ArchiveError("%s: entry %r is outside %s; not a tandem "
                                   "model archive" %
                                   (path, info.filename, ARCHIVE_DIR))
            try:
                raw[info.filename[len(ARCHIVE_DIR):]] = zf.read(info)
            except (zipfile.BadZipFile, OSError) as e:
                raise ArchiveError("%s: cannot read entry %s (%s): the "
                                   "archive is corrupted; export it again" %
                                   (path, info.filename, e))
    text = raw.pop(MANIFEST_ENTRY, None)
    if text is None:
        raise ArchiveError("%s has no %s%s; not a tandem model archive" %
                           (path, ARCHIVE_DIR, MANIFEST_ENTRY))
    manifest = archive_pb2.ArchiveManifest()
    try:
        json_format.Parse(text.decode("utf-8"), manifest)
    except (json_format.ParseError, UnicodeDecodeError) as e:
        raise ArchiveError("%s: %s%s does not parse as an ArchiveManifest: "
                           "%s" % (path, ARCHIVE_DIR, MANIFEST_ENTRY, e))
    if manifest.format_version != FORMAT_VERSION:
        raise ArchiveError(
            "%s has format_version %d; this tandem reads version %d. Export "
            "it again with this version of tandem" %
            (path, manifest.format_version, FORMAT_VERSION))
    needed = ({u.file for u in manifest.units} |
              {g.file for g in manifest.glues} | {WEIGHTS_ENTRY})
    for name in sorted(needed | set(raw)):
        if name not in manifest.sha256:
            raise ArchiveError("%s: entry %s%s has no checksum in the "
                               "manifest" % (path, ARCHIVE_DIR, name))
    for name, want in sorted(manifest.sha256.items()):
        if name not in raw:
            raise ArchiveError("%s: entry %s%s is missing; export it again" %
                               (path, ARCHIVE_DIR, name))
        got = hashlib.sha256(raw[name]).hexdigest()
        if got != want:
            raise ArchiveError(
                "%s: entry %s%s fails its checksum (sha256 %s, the manifest "
                "says %s): the archive is corrupted; export it again" %
                (path, ARCHIVE_DIR, name, got, want))
    return Archive(manifest, raw, path=path)


def run_archive(archive, batch, params=None, buffers=None):
    """Runs an archive's units in order on ``batch`` ({input name: tensor})
    and returns the loss. ``params`` / ``buffers`` ({name: tensor}) replace
    the initial weights (pass params with requires_grad=True to take
    gradients through the units); by default the archive's own, with
    requires_grad as in the manifest. Leaf units get their params bound by
    setattr, the others take them as arguments."""
    m = archive.manifest
    weights = None
    if params is None or buffers is None:
        weights = archive.weights()
    if params is None:
        params = {p.name: weights[p.name].clone().requires_grad_(
            p.requires_grad) for p in m.params}
    if buffers is None:
        buffers = {b.name: weights[b.name] for b in m.buffers}
    values = {}
    for inp in m.inputs:
        if inp.name not in batch:
            raise ArchiveError("the batch lacks input %r (the archive takes "
                               "%s)" % (inp.name,
                                        ", ".join(i.name for i in m.inputs)))
        values[inp.name] = batch[inp.name]
    def run_unit(unit, args):
        mod = archive.unit_module(unit)
        if unit.leaf:
            for n in list(unit.params) + list(unit.buffers):
                t = params[n] if n in params else buffers[n]
                owner, _, attr = n[len(unit.name) + 1:].rpartition(".")
                target = mod
                for part in owner.split(".") if owner else ():
                    target = getattr(target, part)
                setattr(target, attr, t)
            out = mod(*args)
        else:
            out = mod(*([params[n] for n in unit.params] +
                        [buffers[n] for n in unit.buffers] + args))
        if len(out) != len(unit.outputs):
            raise ArchiveError("unit %s returned %d values, the manifest "
                               "lists %d" % (unit.name, len(out),
                                             len(unit.outputs)))
        return list(out)

    glue_at = {g.first_unit: g for g in m.glues}
    i = 0
    while i < len(m.units):
        g = glue_at.get(i)
        if g is None:
            unit = m.units[i]
            out = run_unit(unit, [values[v] for v in unit.inputs])
            for name, v in zip(unit.outputs, out):
                values[name] = v
            i += 1
            continue
        # The glue calls its units, each once, in order (as the worker's
        # executor requires).
        expected = [g.first_unit]

        def call(k, inputs, g=g, expected=expected):
            if k != expected[0] or k >= g.first_unit + g.unit_count:
                raise ArchiveError(
                    "glue %s called unit %d where unit %d was next" %
                    (g.name, k, expected[0]))
            expected[0] += 1
            return run_unit(m.units[k], inputs)

        outer = getattr(_glue_serving, "call", None)
        _glue_serving.call = call
        # As the worker runs glue: interpreted, unoptimized. The optimizing
        # executor would see no input needing a gradient when none does
        # (the batch), and cut the units' params off the backward.
        optimize = torch._C._get_graph_executor_optimize()
        torch._C._set_graph_executor_optimize(False)
        try:
            out = archive.glue_module(g)(*[values[v] for v in g.inputs])
        finally:
            _glue_serving.call = outer
            torch._C._set_graph_executor_optimize(optimize)
        if expected[0] != g.first_unit + g.unit_count:
            raise ArchiveError("glue %s called %d of its %d units" %
                               (g.name, expected[0] - g.first_unit,
                                g.unit_count))
        if len(out) != len(g.outputs):
            raise ArchiveError("glue %s returned %d values, the manifest "
                               "lists %d" % (g.name, len(out),
                                             len(g.outputs)))
        for name, v in zip(g.outputs, out):
            values[name] = v
        i = g.first_unit + g.unit_count
    return values[m.loss]


def describe(manifest, path=None, size=None):
    """A short summary of a manifest: units, params, tied/frozen, size."""
    n_params = sum(math.prod(p.shape) for p in manifest.params)
    tied = sum(1 for p in manifest.params if len(p.units) > 1)
    frozen = sum(1 for p in manifest.params if not p.requires_grad)
    leaves = sum(1 for u in manifest.units if u.leaf)
    lines = ["%s: %d units (%s%s)" % (
        manifest.name, len(manifest.units),
        ", ".join(u.name + (" [leaf]" if u.leaf else "")
                  for u in manifest.units[:8]),
        ", ..." if len(manifest.units) > 8 else "")]
    for g in manifest.glues:
        lines.append("  glue: %s (torch.fx cannot capture its forward; "
                     "scripted whole) calls units %s" % (
                         g.name, ", ".join(
                             u.name for u in manifest.units[
                                 g.first_unit:g.first_unit + g.unit_count])))
    lines.append("  params: %d tensors, %s values; %d used by more than one "
                 "unit (tied), %d frozen; %d buffers; %d leaf units" %
                 (len(manifest.params), "{:,}".format(n_params), tied, frozen,
                  len(manifest.buffers), leaves))
    def note(i):
        # Its role, or what data.kind synthetic draws for it.
        if i.role:
            return " (%s)" % i.role
        if not i.HasField("synthetic"):
            return ""
        s = i.synthetic
        if i.dtype.startswith(("float", "bfloat")):
            return " (synthetic: mean %.4g, std %.4g)" % (s.mean, s.std)
        return " (synthetic: %d to %d)" % (s.low, s.high)

    lines.append("  inputs: " + ", ".join(
        "%s %s %s dynamic dims %s%s" % (
            i.name, i.dtype, list(i.shape), list(i.dynamic_dims), note(i))
        for i in manifest.inputs))
    if manifest.saved_activation_bytes:
        lines.append("  activations saved for backward on the example "
                     "batch: %s bytes (each rank holds them at the end of "
                     "its forward, scaled to its micro-batch)" %
                     "{:,}".format(manifest.saved_activation_bytes))
    for c in manifest.precision_checks:
        lines.append("  runs in %s (model.dtype %s): %s" % (
            c.dtype, _SPEC_DTYPE.get(c.dtype, c.dtype),
            "no: " + c.error if c.error else "yes, checked"))
    if path is not None:
        lines.append("  wrote %s (%s bytes)" % (path, "{:,}".format(size)))
    return "\n".join(lines)


class _CallableModule(types.ModuleType):
    """``tandem.export(...)`` calls export(); ``tandem.export.load_archive``
    and the rest stay attributes of this module."""

    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
