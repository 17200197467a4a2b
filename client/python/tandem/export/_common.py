"""Constants, errors and small helpers every part of the exporter shares."""

import contextlib
import inspect
import os
import traceback

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.node import map_aggregate
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


def _strip(path):
    """A qualified name in the root's namespace -> the user module's own."""
    if path == _ROOT:
        return ""
    if path.startswith(_ROOT + "."):
        return path[len(_ROOT) + 1:]
    return path


def _in_root(path):
    return _ROOT + "." + path if path else _ROOT


# This package's own files: never the user's line in an error.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _ours(filename):
    return os.path.abspath(filename).startswith(_PACKAGE_DIR)


def _user_files(root, extra=()):
    files = set()
    torch_dir = os.path.dirname(torch.__file__)
    for m in root.modules():
        try:
            f = inspect.getsourcefile(type(m))
        except TypeError:
            continue
        if f and not f.startswith(torch_dir) and not _ours(f):
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
            if (not fn.startswith(torch_dir) and not _ours(fn) and
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


def _innermost_line(frames):
    """'file:line: code' of the innermost frame outside torch.fx and tandem
    (the line that failed, in the user's module or in torch.nn's), or ''."""
    fx_dir = os.path.dirname(fx.__file__)
    for fr in reversed(frames):
        fn = os.path.abspath(fr.filename)
        if (not fn.startswith(fx_dir) and not _ours(fn)
                and not fr.filename.startswith("<")):
            return "%s:%d: %s" % (_show_path(fr.filename), fr.lineno,
                                  (fr.line or "").strip())
    return ""


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


def _safe_name(s):
    out = "".join(c if c.isalnum() else "_" for c in s)
    return out if not out[:1].isdigit() else "_" + out


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
