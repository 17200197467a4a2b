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

5. A container above units that torch.fx cannot capture runs as glue
   (glue.py): scripted whole, its units called through tandem::call_unit.

The package, along those seams: batch.py (the example batch), capture.py
(tracing), units.py (cutting into units), scripting.py (TorchScript,
leaves), glue.py, verify.py (the checks), archive.py (writing, reading,
running and describing archives), tensors.py (safetensors of tensors, on
the codec tandem/safetensors.py shares with tandem.weights) and api.py
(export itself).

torch is imported by this package only; the rest of tandem works without
it. The package is callable: ``tandem.export(...)`` is ``export(...)``.
"""

import sys
import types

from tandem.export._common import (ARCHIVE_DIR, FORMAT_VERSION,
                                   MANIFEST_ENTRY, ROLE_NAMES, WEIGHTS_ENTRY,
                                   ArchiveError, ExportError)
from tandem.export.api import export
from tandem.export.archive import Archive, describe, load_archive, run_archive
from tandem.export.tensors import read_safetensors, write_safetensors

__all__ = ["ARCHIVE_DIR", "FORMAT_VERSION", "MANIFEST_ENTRY", "ROLE_NAMES",
           "WEIGHTS_ENTRY", "Archive", "ArchiveError", "ExportError",
           "describe", "export", "load_archive", "read_safetensors",
           "run_archive", "write_safetensors"]


# Named where users find them (repr, tracebacks): tandem.export.ExportError.
for _public in (Archive, ArchiveError, ExportError):
    _public.__module__ = __name__


class _CallableModule(types.ModuleType):
    """``tandem.export(...)`` calls export(); ``tandem.export.load_archive``
    and the rest stay attributes of this package."""

    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
