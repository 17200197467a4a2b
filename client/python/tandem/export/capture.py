"""Tracing with torch.fx, through standard modules: a unit that FX cannot
trace inside becomes a leaf, a container above units that it cannot trace
becomes glue."""

import dis
import functools
import inspect
import sys
import traceback

import torch
import torch.fx as fx
from torch.fx.node import map_aggregate

from tandem.export._common import (_class_name, ExportError, _in_root,
                                   _innermost_line, _strip, _what_went_wrong,
                                   _where)


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


class _Recorder(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        v = super().run_node(n)
        self.values[n] = v
        return v
