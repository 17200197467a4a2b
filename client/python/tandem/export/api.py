"""export(): a module and an example batch in, a checked archive out."""

import hashlib
import inspect
import os
import warnings

import torch
import torch.fx as fx
import torch.nn as nn

from tandem.export._common import (_allclose, _class_name, _dtype_name,
                                   ExportError, FORMAT_VERSION, _in_root,
                                   _LOSS_RTOL, _PRECISION_CHECKS, _ROOT,
                                   _seeded, _show_path, _strip, _user_files)
from tandem.export.archive import Archive, _write_archive
from tandem.export.batch import (_check_batch, _inputs_spec, _make_root,
                                 _synthetic_spec)
from tandem.export.capture import _Recorder, _trace
from tandem.export.memory import measure_loaded_bytes, measure_unit_memory
from tandem.export.glue import (_CallRecorder, _expand_glues, _glue_plan,
                                _script_glue)
from tandem.export.scripting import _jit_bytes, _leaf_adapter, _script
from tandem.export.units import (_all_tensor_names, _collect, _name_units,
                                 _normalize_wrap, _partition,
                                 _unit_graph_module, _unit_paths, _value_name)
from tandem.export.verify import (_check_precision, _eager_loss_and_grads,
                                  _probe_dynamic, _saved_activation_bytes,
                                  _verify)


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
    total, per_unit = _saved_activation_bytes(archive, batch)
    manifest.saved_activation_bytes = total
    for u, saved in zip(manifest.units, per_unit):
        u.saved_activation_bytes = saved
    try:
        measure_unit_memory(archive, batch)
        measure_loaded_bytes(archive)
    except (RuntimeError, AttributeError) as e:
        # A torch whose profiler cannot record CPU allocations: the archive
        # is still whole, and the check at submit stays a lower bound.
        for entry in list(manifest.units) + list(manifest.glues):
            entry.loaded_bytes = 0
        for u in manifest.units:
            del u.memory[:]
        warnings.warn("tandem export: the units' memory was not measured "
                      "(%s: %s); the coordinator's budget check at submit "
                      "will not count their temporaries" %
                      (type(e).__name__, e))
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


def _default_source(module):
    cls = type(module)
    try:
        f = _show_path(inspect.getsourcefile(cls))
    except (TypeError, ValueError):
        f = cls.__module__
    return "%s:%s" % (f, cls.__qualname__)
