"""Glue (proto/tandem/v1/archive.proto, ArchiveGlue): a container torch.fx
cannot capture, scripted whole with its units replaced by stubs that call
tandem::call_unit, so that the units stay units."""

import collections
import copy
import inspect
import threading
import typing
import warnings

import torch
import torch.nn as nn

from tandem.export._common import (_allclose, _class_name, ExportError,
                                   _first_line, _safe_name, _seeded, _strip)
from tandem.export.scripting import (_adapter, _jit_bytes, _leaf_adapter,
                                     _script, _subclass)
from tandem.export.units import _names_of, _Unit


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


def _call_stub(module, index, arguments, result, unit_name):
    """The stand-in glue code calls for ``module`` (unit ``index`` of
    the archive): an instance of a subclass of the module's class,
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
        if isinstance(v, torch.Tensor) and _optional(p.annotation):
            # A tensor at capture: the unit takes it; None would reach the
            # unit as an undefined tensor.
            checks.append(
                "        if %s is None:\n"
                "            raise RuntimeError(%r)\n" %
                (p.name, "tandem: unit %s was exported with a tensor for "
                 "%s; this call passes None. Export with an example batch "
                 "that takes this path" % (unit_name, p.name)))
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
    return stub


def _optional(annotation):
    """Whether an annotation admits None (Optional[...], a Union with
    None)."""
    return (typing.get_origin(annotation) is typing.Union and
            type(None) in typing.get_args(annotation))


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
        stubs[cu.key] = _call_stub(module, k, cu.arguments, cu.result,
                                   cu.name)
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
    entries[g.file] = _jit_bytes(scripted)
    return entries
