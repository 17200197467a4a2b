"""The archive on disk: writing it atomically, reading it back with every
checksum verified, running it (glue included), and describing it."""

import contextlib
import hashlib
import io
import math
import os
import tempfile
import zipfile

import torch

from tandem.export._common import (ARCHIVE_DIR, ArchiveError, FORMAT_VERSION,
                                   MANIFEST_ENTRY, _SPEC_DTYPE, WEIGHTS_ENTRY)
from tandem.export.glue import _define_call_unit, _glue_serving
from tandem.export.tensors import (read_safetensors, _safetensors_header,
                                   _tensor_bytes)


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


@contextlib.contextmanager
def interpreted():
    """TorchScript runs its graphs interpreted, unoptimized, inside: as the
    worker runs units and glue (worker/models/archive_program.cc)."""
    optimize = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(False)
    try:
        yield
    finally:
        torch._C._set_graph_executor_optimize(optimize)


def call_unit(unit, mod, args, params, buffers):
    """Runs one unit's TorchScript module ``mod`` on the input values
    ``args``, with ``params`` and ``buffers`` ({name: tensor}) as the worker
    binds them: set as a leaf unit's attributes, passed before the inputs
    to the others. Returns its outputs, a list."""
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
                    [buffers[n] for n in unit.buffers] + list(args)))
    if len(out) != len(unit.outputs):
        raise ArchiveError("unit %s returned %d values, the manifest "
                           "lists %d" % (unit.name, len(out),
                                         len(unit.outputs)))
    return list(out)


def run_archive(archive, batch, params=None, buffers=None, on_unit=None):
    """Runs an archive's units in order on ``batch`` ({input name: tensor})
    and returns the loss. ``params`` / ``buffers`` ({name: tensor}) replace
    the initial weights (pass params with requires_grad=True to take
    gradients through the units); by default the archive's own, with
    requires_grad as in the manifest. Leaf units get their params bound by
    setattr, the others take them as arguments. Glues run their units
    through tandem::call_unit, each once, in order. ``on_unit(k)``, when
    given, is called as unit k starts."""
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
    def run_unit(k, args):
        if on_unit is not None:
            on_unit(k)
        return call_unit(m.units[k], archive.unit_module(m.units[k]), args,
                         params, buffers)

    glue_at = {g.first_unit: g for g in m.glues}
    i = 0
    while i < len(m.units):
        g = glue_at.get(i)
        if g is None:
            unit = m.units[i]
            out = run_unit(i, [values[v] for v in unit.inputs])
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
            return run_unit(k, inputs)

        outer = getattr(_glue_serving, "call", None)
        _glue_serving.call = call
        # As the worker runs glue: interpreted, unoptimized. The optimizing
        # executor would see no input needing a gradient when none does
        # (the batch), and cut the units' params off the backward.
        try:
            with interpreted():
                out = archive.glue_module(g)(*[values[v] for v in g.inputs])
        finally:
            _glue_serving.call = outer
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
