"""``tandem export-weights``: a checkpoint's full, unsharded weights as one
safetensors file.

The workers checkpoint every rank's shards to its own file under the job's
``checkpoint.dir`` (worker/checkpoint/checkpoint_files.h has the format).
This module reads those files itself, verifies them as the worker does
(magic, format version, lengths, checksums, the manifest's world), puts
every param back together from its shards and writes one safetensors file
under the names the ``tensors`` blob gives: Hugging Face Llama/Mixtral names
for the built-in models, the params' own names for exported models.

    import tandem.weights
    summary = tandem.weights.export_weights("ckpt/", "model.safetensors")
    tensors = tandem.weights.read_safetensors("model.safetensors")

Pure standard library (struct, json, mmap): no torch, no numpy, so it runs
wherever the checkpoint files can be read. Files are mapped, not read, so a
multi-GB rank file is never copied into memory at once; the checksums run at
about 100 MB/s per process in pure Python, the rank files in parallel.
"""

import collections
import concurrent.futures
import mmap
import multiprocessing
import os
import re
import struct
import sys

from tandem import safetensors
from tandem.errors import TandemError

CHECKPOINT_FORMAT_VERSION = 1
MAGIC = b"TNDMCKPT"
HEADER_BYTES = 8 + 4 + 4 + 8  # magic, u32 version, u32 0, u64 payload length
MANIFEST = "MANIFEST"
TENSORS_BLOB = "tensors"
STEP_DIR = re.compile(r"^step-(\d+)$")

# Payload bytes below which the rank files are checksummed in this process:
# starting worker processes costs more than it saves on small checkpoints.
PARALLEL_MIN_BYTES = 64 << 20

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_MASK64 = (1 << 64) - 1

# export_weights(): what was written.
WeightsSummary = collections.namedtuple("WeightsSummary", [
    "path", "tensors", "bytes", "step", "graph_hash", "world", "step_dir"])
# One param of a checkpoint, as its `tensors` blob describes it.
ParamEntry = collections.namedtuple("ParamEntry", [
    "name", "dtype", "shape", "export_name"])

# safetensors dtype -> bytes per element.
SAFETENSORS_DTYPES = safetensors.DTYPE_SIZES


class CheckpointError(TandemError):
    """A checkpoint that cannot be found, read or trusted: the message names
    the file and what is wrong with it."""


def checkpoint_checksum(data):
    """The worker's CheckpointChecksum: FNV-1a over 64-bit little-endian
    words (the tail zero-padded to a word), seeded with the length. `data`
    is any bytes-like object (an mmap slice is not copied)."""
    view = memoryview(data).cast("B")
    h = _FNV_OFFSET ^ len(view)
    whole = len(view) // 8 * 8
    if whole:
        body = view[:whole]
        words = (body.cast("Q") if sys.byteorder == "little" else
                 (w for (w,) in struct.iter_unpack("<Q", body)))
        for w in words:
            h = ((h ^ w) * _FNV_PRIME) & _MASK64
    if whole < len(view):
        tail = int.from_bytes(bytes(view[whole:]).ljust(8, b"\0"), "little")
        h = ((h ^ tail) * _FNV_PRIME) & _MASK64
    return h


def _file_checksum(path, offset, length):
    """checkpoint_checksum of bytes offset..offset+length of `path` (run in
    a worker process for large checkpoints)."""
    with open(path, "rb") as f, \
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            return checkpoint_checksum(view[offset:offset + length])
        finally:
            view.release()


# ---------------------------------------------------------------- reading

class RankFile:
    """One rank's verified file, mapped: its metadata and where each blob
    lies. `blob(name)` is a memoryview into the mapping (valid until the
    Checkpoint is closed)."""

    def __init__(self, path, rank):
        self.path = path
        self.rank = rank
        self.meta = {}
        self.blobs = {}  # name -> (offset, length) within the file
        self._file = None
        self._mmap = None
        self._view = None

    def open(self):
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError:
            raise CheckpointError("%s is missing: the manifest names a world "
                                  "of ranks and each rank's file must be "
                                  "there" % self.path) from None
        except OSError as e:
            raise CheckpointError("cannot read %s: %s" %
                                  (self.path, e.strerror or e)) from None
        size = os.fstat(self._file.fileno()).st_size
        if size == 0:
            raise CheckpointError("%s is truncated (empty file)" % self.path)
        self._mmap = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(self._mmap)
        return size

    def close(self):
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # a view still held (by a traceback): the GC closes it
            self._mmap = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _bad(self, why):
        return CheckpointError("%s is %s" % (self.path, why))

    def read_header(self):
        """Checks magic, version and length; returns the payload's
        (offset, length) and the stored checksum."""
        size = self.open()
        view = self._view
        if size < HEADER_BYTES:
            raise self._bad("truncated (%d bytes, shorter than the %d-byte "
                            "header)" % (size, HEADER_BYTES))
        if bytes(view[:8]) != MAGIC:
            raise self._bad("not a tandem checkpoint rank file (bad magic %r)"
                            % bytes(view[:8]))
        version, _, length = struct.unpack_from("<IIQ", view, 8)
        if version != CHECKPOINT_FORMAT_VERSION:
            raise self._bad("of checkpoint format version %d; this tool reads "
                            "version %d: export it with the Tandem release "
                            "that wrote it" %
                            (version, CHECKPOINT_FORMAT_VERSION))
        want = HEADER_BYTES + length + 8
        if size < want:
            raise self._bad("truncated (%d of %d bytes)" % (size, want))
        if size > want:
            raise self._bad("corrupted (%d bytes, longer than the %d its "
                            "header says)" % (size, want))
        (stored,) = struct.unpack_from("<Q", view, HEADER_BYTES + length)
        return HEADER_BYTES, length, stored

    def parse_payload(self, offset, length):
        """Reads the metadata and the blob table (the payload is checked
        first: a structure error after a good checksum means a bad writer)."""
        view = self._view
        end = offset + length
        pos = offset

        def take(n, what):
            nonlocal pos
            if n > end - pos:
                raise self._bad("corrupted (bad structure: %s runs past the "
                                "payload)" % what)
            start = pos
            pos += n
            return start

        def u32(what):
            return struct.unpack_from("<I", view, take(4, what))[0]

        def u64(what):
            return struct.unpack_from("<Q", view, take(8, what))[0]

        meta_len = u32("the metadata length")
        start = take(meta_len, "the metadata")
        try:
            text = bytes(view[start:start + meta_len]).decode("utf-8")
        except UnicodeDecodeError:
            raise self._bad("corrupted (metadata is not UTF-8)") from None
        for line in text.split("\n"):
            key, sep, value = line.partition("=")
            if sep:
                self.meta[key] = value
        count = u32("the blob count")
        for i in range(count):
            n = u32("blob %d's name length" % i)
            start = take(n, "blob %d's name" % i)
            try:
                name = bytes(view[start:start + n]).decode("utf-8")
            except UnicodeDecodeError:
                raise self._bad("corrupted (blob %d's name is not UTF-8)" %
                                i) from None
            size = u64("blob %r's length" % name)
            self.blobs[name] = (take(size, "blob %r" % name), size)
        if pos != end:
            raise self._bad("corrupted (bad structure: %d bytes after the "
                            "last blob)" % (end - pos))

    def blob(self, name):
        where = self.blobs.get(name)
        if where is None:
            return None
        return self._view[where[0]:where[0] + where[1]]


class Checkpoint:
    """One verified checkpoint (a ``step-%08d`` directory): the manifest's
    step, world, graph_hash and data_step, and every rank's mapped file.
    Use it as a context manager, or call close()."""

    def __init__(self, step_dir, verify=True, jobs=None):
        self.step_dir = step_dir
        self.files = []
        try:
            self._read_manifest()
            self._read_ranks(verify, jobs)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for f in self.files:
            f.close()

    def _read_manifest(self):
        path = os.path.join(self.step_dir, MANIFEST)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise CheckpointError(
                "%s has no MANIFEST: the checkpoint is incomplete (a run "
                "killed while writing it) or this is not a checkpoint "
                "directory" % self.step_dir) from None
        except OSError as e:
            raise CheckpointError("cannot read %s: %s" %
                                  (path, e.strerror or e)) from None

        def bad(why):
            return CheckpointError("manifest %s %s" % (path, why))

        last = raw.rfind(b"checksum ")
        if last < 0:
            raise bad("is truncated (no checksum line)")
        try:
            expected = int(raw[last + 9:].strip().decode("ascii"), 16)
        except ValueError:
            raise bad("is corrupted (unreadable checksum)") from None
        if expected != checkpoint_checksum(raw[:last]):
            raise bad("is corrupted (checksum mismatch)")
        try:
            text = raw[:last].decode("utf-8")
        except UnicodeDecodeError:
            raise bad("is corrupted (not UTF-8 text)") from None
        fields = {}
        for line in text.split("\n"):
            key, _, value = line.partition(" ")
            if key:
                fields[key] = value

        def number(key, default=None):
            value = fields.get(key, default)
            try:
                return int(value)
            except (TypeError, ValueError):
                raise bad("is corrupted (%s line %s)" % (
                    key, "missing" if value is None else
                    "%r is not a number" % value)) from None

        version = number("tandem-checkpoint")
        self.step = number("step")
        self.world = number("world")
        self.data_step = number("data_step", "0")
        if version != CHECKPOINT_FORMAT_VERSION:
            raise bad("has format version %d; this tool reads version %d: "
                      "export it with the Tandem release that wrote it" %
                      (version, CHECKPOINT_FORMAT_VERSION))
        self.graph_hash = fields.get("graph_hash", "")
        m = STEP_DIR.match(os.path.basename(os.path.normpath(self.step_dir)))
        if m and int(m.group(1)) != self.step:
            raise bad("names step %d, not this directory's %d" %
                      (self.step, int(m.group(1))))
        if self.world < 1:
            raise bad("is corrupted (world %d)" % self.world)
        names = ["rank-%d.ckpt" % r for r in range(self.world)]
        if "files" in fields and fields["files"].split() != names:
            raise bad("is corrupted (its files line %r does not list "
                      "rank-0.ckpt .. rank-%d.ckpt)" %
                      (fields["files"], self.world - 1))

    def _read_ranks(self, verify, jobs):
        missing = [r for r in range(self.world) if not os.path.isfile(
            os.path.join(self.step_dir, "rank-%d.ckpt" % r))]
        if missing:
            raise CheckpointError(
                "%s: rank file%s %s missing (the manifest says world %d): "
                "the checkpoint is incomplete; export another step with "
                "--step, or copy the missing files here" % (
                    self.step_dir, "s" if len(missing) > 1 else "",
                    ", ".join("rank-%d.ckpt" % r for r in missing),
                    self.world))
        payloads = []
        for r in range(self.world):
            f = RankFile(os.path.join(self.step_dir, "rank-%d.ckpt" % r), r)
            self.files.append(f)
            payloads.append(f.read_header())
        if verify:
            self._verify_checksums(payloads, jobs)
        want = {"step": str(self.step), "world": str(self.world),
                "graph_hash": self.graph_hash,
                "data_step": str(self.data_step)}
        for f, (offset, length, _) in zip(self.files, payloads):
            f.parse_payload(offset, length)
            got = dict(f.meta)
            if any(got.get(k) != v for k, v in want.items()) or \
                    got.get("rank") != str(f.rank):
                raise CheckpointError(
                    "%s does not match its manifest (it says %s; the "
                    "manifest: rank %d of %s)" % (
                        f.path, ", ".join("%s=%s" % kv for kv in got.items()),
                        f.rank, ", ".join("%s=%s" % kv
                                          for kv in want.items())))

    def _verify_checksums(self, payloads, jobs):
        total = sum(length for _, length, _ in payloads)
        jobs = min(jobs or os.cpu_count() or 1, len(self.files))
        if jobs > 1 and total >= PARALLEL_MIN_BYTES:
            # Forked: `python -m tandem` cannot be re-imported by a spawned
            # child (its __main__ runs the CLI).
            ctx = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(
                    max_workers=jobs, mp_context=ctx) as pool:
                sums = list(pool.map(
                    _file_checksum, [f.path for f in self.files],
                    [o for o, _, _ in payloads], [n for _, n, _ in payloads]))
        else:
            sums = [checkpoint_checksum(f._view[o:o + n])
                    for f, (o, n, _) in zip(self.files, payloads)]
        for f, got, (_, _, stored) in zip(self.files, sums, payloads):
            if got != stored:
                raise CheckpointError(
                    "%s is corrupted (checksum mismatch: stored %016x, the "
                    "payload's is %016x)" % (f.path, stored, got))

    # -- params

    def params(self):
        """The `tensors` blob as ParamEntry tuples, in the model's param
        order, each checked against its shards on every rank."""
        texts = [f.blob(TENSORS_BLOB) for f in self.files]
        texts = [None if t is None else bytes(t) for t in texts]
        if texts[0] is None:
            raise CheckpointError(
                "%s has no %r blob: the checkpoint was written by a worker "
                "older than `tandem export-weights`, which does not record "
                "the params' shapes and export names; re-run with a newer "
                "worker (resuming from this checkpoint and checkpointing "
                "again writes one)" % (self.files[0].path, TENSORS_BLOB))
        text = texts[0]
        for f, t in zip(self.files[1:], texts[1:]):
            if t != text:
                raise CheckpointError(
                    "%s: its %r blob %s rank 0's; every rank of one "
                    "checkpoint describes the same model" % (
                        f.path, TENSORS_BLOB,
                        "is missing, unlike" if t is None else
                        "differs from"))
        where = "%s's %r blob" % (self.files[0].path, TENSORS_BLOB)
        try:
            lines = text.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            raise CheckpointError("%s is not UTF-8 text" % where) from None
        if lines and lines[-1] == "":
            lines.pop()
        entries = []
        for i, line in enumerate(lines, 1):
            parts = line.split("\t")
            if len(parts) != 4 or not parts[0] or not parts[3]:
                raise CheckpointError(
                    "%s, line %d: expected <param name>\\t<dtype>\\t<shape>"
                    "\\t<export name>, got %r" % (where, i, line))
            name, dtype, shape_text, export_name = parts
            if dtype != "float32":
                raise CheckpointError(
                    "%s, line %d: param %r has dtype %r; this tool reads "
                    "float32 shards only" % (where, i, name, dtype))
            try:
                shape = tuple(int(d) for d in shape_text.split(",")) \
                    if shape_text else ()
            except ValueError:
                shape = None
            if shape is None or any(d < 0 for d in shape):
                raise CheckpointError("%s, line %d: param %r has a bad shape "
                                      "%r" % (where, i, name, shape_text))
            if "*" in export_name and not shape:
                raise CheckpointError(
                    "%s, line %d: param %r is a scalar but its export name "
                    "%r stacks it along dim 0" % (where, i, name, export_name))
            entries.append(ParamEntry(name, dtype, shape, export_name))
        seen = set()
        for e in entries:
            if e.name in seen:
                raise CheckpointError("%s lists param %r twice" %
                                      (where, e.name))
            seen.add(e.name)
            shard = _shard_numel(_numel(e.shape), self.world) * 4
            for f in self.files:
                blob = f.blobs.get("param/%s/shard" % e.name)
                if blob is None:
                    raise CheckpointError(
                        "%s has no shard of param %r (blob 'param/%s/shard')"
                        % (f.path, e.name, e.name))
                if blob[1] != shard:
                    raise CheckpointError(
                        "%s: the shard of param %r is %d bytes, not %d "
                        "(ceil(%d values / world %d) float32s)" % (
                            f.path, e.name, blob[1], shard,
                            _numel(e.shape), self.world))
        return entries

    def tensors(self):
        """[(export name, shape, params entry, first element, numel)] in the
        file's order: a stacked param ("*" in its export name) becomes
        shape[0] tensors of shape[1:], the rest one each."""
        out, names = [], set()
        for e in self.params():
            if "*" in e.export_name:
                inner = e.shape[1:]
                n = _numel(inner)
                parts = [(e.export_name.replace("*", str(i)), inner, e, i * n,
                          n) for i in range(e.shape[0])]
            else:
                parts = [(e.export_name, e.shape, e, 0, _numel(e.shape))]
            for part in parts:
                if part[0] in names:
                    raise CheckpointError(
                        "%s: two tensors are exported as %r (the %r blob's "
                        "export names must be unique)" %
                        (self.step_dir, part[0], TENSORS_BLOB))
                if part[0] == "__metadata__":
                    raise CheckpointError(
                        "%s: param %r is exported as %r, a name safetensors "
                        "reserves" % (self.step_dir, e.name, part[0]))
                names.add(part[0])
                out.append(part)
        return out

    def _pieces(self, entry, first, numel):
        """Memoryviews of the shards holding elements first..first+numel of
        param `entry` (the full param is the ranks' shards concatenated)."""
        per = _shard_numel(_numel(entry.shape), self.world)
        end = first + numel
        pieces = []
        for f in self.files:
            lo, hi = f.rank * per, (f.rank + 1) * per
            a, b = max(first, lo), min(end, hi)
            if a < b:
                shard = f.blob("param/%s/shard" % entry.name)
                pieces.append(shard[(a - lo) * 4:(b - lo) * 4])
        return pieces

    def read_tensor(self, entry, first, numel):
        """Elements first..first+numel of a param, as float32 LE bytes."""
        return b"".join(bytes(p) for p in self._pieces(entry, first, numel))


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _shard_numel(numel, world):
    return -(-numel // world)


# ---------------------------------------------------------- finding one

def _complete_steps(ckpt_dir):
    """Steps under `ckpt_dir` whose step-%08d directory has a MANIFEST,
    newest first (as the worker's ListWithManifest)."""
    steps = []
    for name in os.listdir(ckpt_dir):
        m = STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(ckpt_dir, name, MANIFEST)):
            steps.append((int(m.group(1)), name))
    return sorted(steps, reverse=True)


def find_step_dir(path, step=None):
    """The step-%08d directory to export from `path`: `path` itself when it
    is one; else, in a job's checkpoint.dir, the newest complete checkpoint
    (one with a MANIFEST) or `step`'s."""
    if not os.path.isdir(path):
        raise CheckpointError("%s is not a directory" % path)
    m = STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    if m or os.path.exists(os.path.join(path, MANIFEST)):
        if step is not None and m and int(m.group(1)) != step:
            raise CheckpointError(
                "%s is the checkpoint of step %d, not --step %d; pass the "
                "job's checkpoint.dir to choose a step" %
                (path, int(m.group(1)), step))
        return path
    try:
        steps = _complete_steps(path)
    except OSError as e:
        raise CheckpointError("cannot list %s: %s" %
                              (path, e.strerror or e)) from None
    if not steps:
        partial = sorted(n for n in os.listdir(path) if STEP_DIR.match(n))
        raise CheckpointError(
            "no complete checkpoint in %s: %s" % (path, (
                "its step directories (%s) have no MANIFEST (runs killed "
                "while writing them)" % ", ".join(partial[-5:])
                if partial else "no step-NNNNNNNN directories; pass a job's "
                "checkpoint.dir or one of its step directories")))
    if step is None:
        return os.path.join(path, steps[0][1])
    for s, name in steps:
        if s == step:
            return os.path.join(path, name)
    raise CheckpointError(
        "%s has no complete checkpoint of step %d; it has step%s %s" % (
            path, step, "s" if len(steps) > 1 else "",
            ", ".join(str(s) for s, _ in sorted(steps))))


def checkpoint_dir_of_job(job_id, coordinator=None, timeout=30.0):
    """The checkpoint.dir of job `job_id`, from the coordinator's copy of
    its spec (as `tandem status JOB --spec` prints it)."""
    from tandem.client import Client

    try:
        with Client(coordinator, timeout=timeout) as client:
            job, _ = client.get(job_id)
    except TandemError as e:
        # Say why the coordinator was asked at all: a mistyped directory
        # name looks like a job id.
        raise TandemError("%s is not a directory here, so it names a job: %s"
                          % (job_id, e.message), code=e.code,
                          address=e.address) from None
    ckpt_dir = job.spec.checkpoint.dir
    if not ckpt_dir:
        raise CheckpointError(
            "job %s has no checkpoint.dir: it wrote no checkpoints, so there "
            "are no weights to export; set checkpoint.dir and "
            "checkpoint.every in the job spec to keep them" % job_id)
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(
            "job %s's checkpoint.dir %s is not a directory here: "
            "export-weights reads the checkpoint files itself, so run it "
            "where the workers' shared checkpoint directory is mounted (or "
            "copy it here and pass the directory)" % (job_id, ckpt_dir))
    return ckpt_dir


def resolve(source, step=None, coordinator=None, timeout=30.0):
    """The step directory `source` means: a job's checkpoint.dir, one of its
    step-%08d directories, or (not an existing directory) a job id whose
    checkpoint.dir the coordinator knows."""
    if os.path.isdir(source):
        return find_step_dir(source, step)
    if os.sep in source or os.path.exists(source):
        raise CheckpointError(
            "%s is not a directory: pass a job's checkpoint.dir, one of its "
            "step-NNNNNNNN directories, or a job id" % source)
    return find_step_dir(checkpoint_dir_of_job(source, coordinator, timeout),
                         step)


def open_checkpoint(source, step=None, verify=True, coordinator=None,
                    jobs=None, timeout=30.0):
    """A verified ``Checkpoint`` of `source` (see resolve)."""
    return Checkpoint(resolve(source, step, coordinator, timeout),
                      verify=verify, jobs=jobs)


def read_weights(source, step=None, verify=True, coordinator=None):
    """{export name: (shape, float32 LE bytes)} of a checkpoint's full
    params, in the order export_weights writes them; the whole model in
    memory, for tests and small models."""
    with open_checkpoint(source, step, verify, coordinator) as ckpt:
        return collections.OrderedDict(
            (name, (shape, ckpt.read_tensor(entry, first, numel)))
            for name, shape, entry, first, numel in ckpt.tensors())


# --------------------------------------------------------------- writing

def export_weights(source, path, step=None, verify=True, coordinator=None,
                   jobs=None, timeout=30.0):
    """Writes the full params of a checkpoint to `path` as safetensors (F32,
    the `tensors` blob's export names, "__metadata__" format pt,
    tandem.step and tandem.graph_hash). `source` is a job's checkpoint.dir
    (its newest complete checkpoint, or `step`'s), one step-%08d directory,
    or a job id (its checkpoint.dir from the coordinator at `coordinator`;
    the directory must be readable here). The file is written to
    "<path>.tmp" and renamed, so a failed export leaves no partial file.
    `verify=False` skips the checksums (lengths and structure are still
    checked); `jobs` processes checksum the rank files (default: the CPUs);
    `timeout`: seconds for the coordinator's answer. Returns a
    WeightsSummary."""
    out_dir = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(out_dir):
        raise CheckpointError("cannot write %s: no directory %s" %
                              (path, out_dir))
    with open_checkpoint(source, step, verify, coordinator, jobs,
                         timeout) as ckpt:
        tensors = ckpt.tensors()
        header, data_bytes = safetensors.header_bytes(
            [(name, "F32", shape, numel * 4)
             for name, shape, _, _, numel in tensors],
            {"format": "pt", "tandem.step": str(ckpt.step),
             "tandem.graph_hash": ckpt.graph_hash})
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                for _, _, entry, first, numel in tensors:
                    for piece in ckpt._pieces(entry, first, numel):
                        f.write(piece)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            _remove_quietly(tmp)
            raise CheckpointError("cannot write %s: %s" %
                                  (path, e.strerror or e)) from None
        except BaseException:
            _remove_quietly(tmp)
            raise
        return WeightsSummary(path=path, tensors=len(tensors),
                              bytes=len(header) + data_bytes,
                              step=ckpt.step, graph_hash=ckpt.graph_hash,
                              world=ckpt.world, step_dir=ckpt.step_dir)


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def describe(summary):
    """The line `tandem export-weights` prints."""
    return ("wrote %d tensors (%s bytes) of step %d to %s (from %s, world %d)"
            % (summary.tensors, "{:,}".format(summary.bytes), summary.step,
               summary.path, summary.step_dir, summary.world))


# ------------------------------------------------------- safetensors in

def read_safetensors_header(path):
    """(tensor entries {name: {dtype, shape, data_offsets}}, metadata dict,
    data start) of a safetensors file, checked (tandem.safetensors,
    parse_header): the header length fits the file, the JSON is an object,
    every dtype is known, every shape's byte size matches its offsets, and
    the offsets tile the data exactly."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                head += f.read(min(n, max(size - 8, 0)))
    except OSError as e:
        raise CheckpointError("cannot read %s: %s" %
                              (path, e.strerror or e)) from None
    return safetensors.parse_header(head, size, path, CheckpointError)


def read_safetensors(path):
    """{name: (dtype, shape tuple, bytes)} of a safetensors file, in the
    header's order, validated by read_safetensors_header."""
    header, _, start = read_safetensors_header(path)
    out = collections.OrderedDict()
    with open(path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for name, e in header.items():
                b, end = e["data_offsets"]
                out[name] = (e["dtype"], tuple(e["shape"]),
                             mm[start + b:start + end])
    return out
