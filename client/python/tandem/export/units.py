"""Cutting the traced graph into units, the way FSDP's auto-wrap does, and what
crosses between them."""

import operator

import torch
import torch.fx as fx
import torch.nn as nn

from tandem.export._common import (ExportError, _fetch_attr, _has_tensor,
                                   _safe_name, _strip)


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


def _all_tensor_names(root):
    """Every (qualified name, param or buffer), aliases included."""
    for path, m in root.named_modules(remove_duplicate=False):
        for d in (m._parameters, m._buffers):
            for n, t in d.items():
                if t is not None:
                    yield (path + "." + n if path else n), t
