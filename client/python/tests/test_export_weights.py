"""`tandem export-weights`: a checkpoint's full weights as one safetensors
file (tandem/weights.py).

The checkpoints here are written by this file in the format
worker/checkpoint/checkpoint_files.h documents (its own writer and its own
FNV-1a checksum, sharing no code with tandem.weights): rank files with the
`tensors` blob and every param's float32 shard, then the MANIFEST. The
exported files are parsed back with struct and json, not with the reader
under test. Worlds 1 and 3 cover padding in the last rank's shard, a stacked
Mixtral-style param ("*" in its export name) whose experts straddle shard
boundaries, a frozen param (a shard but no AdamW moments) and a scalar.
Damaged inputs (truncated or corrupted rank files, a missing rank, no
`tensors` blob, no complete checkpoint, an unknown --step, an unreachable
coordinator) exit 1 naming the file and what is wrong, and leave no output.
"""

import array
import json
import os
import re
import struct

import pytest

from tandem_harness import free_port, run_cli, small_spec
from tandem import weights

MASK = (1 << 64) - 1


def fnv_checksum(data):
    """CheckpointChecksum, written again from its comment in
    checkpoint_files.h: FNV-1a over 64-bit little-endian words, the tail
    zero-padded, seeded with the length."""
    h = 14695981039346656037 ^ len(data)
    for i in range(0, len(data), 8):
        word = int.from_bytes(data[i:i + 8].ljust(8, b"\0"), "little")
        h = ((h ^ word) * 1099511628211) & MASK
    return h


# (param name, shape, export name, trainable): one of every kind. The
# stacked w_gate has 4 experts of 6 values; at world 3 the shards hold 8
# values each, so experts 1 and 2 straddle two ranks.
PARAMS = [
    ("embed.weight", (5, 4), "model.embed_tokens.weight", True),
    ("layers.0.moe.w_gate", (4, 2, 3),
     "model.layers.0.block_sparse_moe.experts.*.w1.weight", True),
    ("norm.weight", (7,), "model.norm.weight", False),
    ("scale", (), "scale", True),
]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def values_of(index, shape, step):
    """A param's full values: distinct, exact in float32."""
    return [index * 1000 + step + 0.25 * i for i in range(numel(shape))]


def f32(values):
    return array.array("f", values).tobytes()


def rank_file(blobs, meta):
    payload = struct.pack("<I", len(meta)) + meta
    payload += struct.pack("<I", len(blobs))
    for name, data in blobs:
        payload += struct.pack("<I", len(name)) + name.encode()
        payload += struct.pack("<Q", len(data)) + data
    return (b"TNDMCKPT" + struct.pack("<IIQ", 1, 0, len(payload)) + payload +
            struct.pack("<Q", fnv_checksum(payload)))


def write_checkpoint(ckpt_dir, step, world, params=PARAMS, tensors_blob=True,
                     graph_hash="g1234abcd", manifest=True):
    """Writes checkpoint `step` of `world` ranks as the worker does; returns
    its directory and {export name: (shape, values)} of what it holds."""
    step_dir = os.path.join(str(ckpt_dir), "step-%08d" % step)
    os.makedirs(step_dir, exist_ok=True)
    lines = "".join("%s\tfloat32\t%s\t%s\n" % (
        n, ",".join(str(d) for d in shape), export)
        for n, shape, export, _ in params)
    full = [values_of(i, shape, step) for i, (_, shape, _, _)
            in enumerate(params)]
    for r in range(world):
        blobs = [("tensors", lines.encode())] if tensors_blob else []
        for (name, shape, _, trainable), vals in zip(params, full):
            per = -(-numel(shape) // world)
            shard = vals[r * per:(r + 1) * per]
            shard += [-7.0] * (per - len(shard))  # padding: never exported
            blobs.append(("param/%s/shard" % name, f32(shard)))
            if trainable:
                blobs.append(("param/%s/exp_avg" % name, f32([0.5] * per)))
                blobs.append(("param/%s/exp_avg_sq" % name, f32([0.1] * per)))
        blobs.append(("rng/cpu", b"\x01" * 13))  # an odd length: tail word
        meta = ("step=%d\nworld=%d\nrank=%d\ngraph_hash=%s\ndata_step=%d\n" %
                (step, world, r, graph_hash, step)).encode()
        with open(os.path.join(step_dir, "rank-%d.ckpt" % r), "wb") as f:
            f.write(rank_file(blobs, meta))
    if manifest:
        text = ("tandem-checkpoint 1\nstep %d\nworld %d\ngraph_hash %s\n"
                "data_step %d\nfiles %s\n" % (
                    step, world, graph_hash, step,
                    " ".join("rank-%d.ckpt" % r for r in range(world))))
        text += "checksum %016x\n" % fnv_checksum(text.encode())
        with open(os.path.join(step_dir, "MANIFEST"), "w") as f:
            f.write(text)
    expected = {}
    for (_, shape, export, _), vals in zip(params, full):
        if "*" in export:
            n = numel(shape[1:])
            for e in range(shape[0]):
                expected[export.replace("*", str(e))] = (
                    list(shape[1:]), vals[e * n:(e + 1) * n])
        else:
            expected[export] = (list(shape), vals)
    return step_dir, expected


def parse_safetensors(path):
    """(header, metadata, {name: bytes}) with struct and json alone."""
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data)
    assert n % 8 == 0, "header not padded to 8 bytes"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__")
    blobs, pos = {}, 0
    for name, e in header.items():  # in order: data follows the header's order
        b, end = e["data_offsets"]
        assert b == pos, name
        blobs[name] = body[b:end]
        pos = end
    assert pos == len(body)
    return header, meta, blobs


def check_export(path, expected, step, graph_hash="g1234abcd"):
    header, meta, blobs = parse_safetensors(path)
    assert list(header) == list(expected)  # the params' order, experts split
    assert meta == {"format": "pt", "tandem.step": str(step),
                    "tandem.graph_hash": graph_hash}
    for name, (shape, vals) in expected.items():
        assert header[name]["dtype"] == "F32"
        assert header[name]["shape"] == shape, name
        assert array.array("f", blobs[name]).tolist() == vals, name


def export(*args, **kwargs):
    return run_cli("export-weights", *args, **kwargs)


# ------------------------------------------------------------ good files

def test_checksum_matches_the_documented_algorithm():
    for n in list(range(0, 25)) + [4096 + 3]:
        data = bytes((i * 37 + n) & 0xFF for i in range(n))
        assert weights.checkpoint_checksum(data) == fnv_checksum(data), n


@pytest.mark.parametrize("world", [1, 3])
def test_export_weights_puts_the_shards_together(tmp_path, world):
    ckpt = tmp_path / "ckpt"
    _, expected = write_checkpoint(ckpt, 8, world)
    out = tmp_path / "model.safetensors"
    r = export(ckpt, "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    assert re.fullmatch(
        r"wrote 7 tensors \([\d,]+ bytes\) of step 8 to %s \(from .*"
        r"step-00000008, world %d\)" % (re.escape(str(out)), world), lines[0])
    assert "{:,}".format(os.path.getsize(out)) in lines[0]
    check_export(out, expected, 8)
    assert not os.path.exists(str(out) + ".tmp")

    # The package's own reader agrees, and so does read_weights.
    got = weights.read_safetensors(str(out))
    assert [(n, d, list(s)) for n, (d, s, _) in got.items()] == [
        (n, "F32", shape) for n, (shape, _) in expected.items()]
    direct = weights.read_weights(str(ckpt))
    assert {n: (list(s), array.array("f", b).tolist())
            for n, (s, b) in direct.items()} == expected


def test_export_weights_reads_back_with_torch(tmp_path):
    torch = pytest.importorskip("torch")
    ckpt = tmp_path / "ckpt"
    _, expected = write_checkpoint(ckpt, 3, 3)
    out = tmp_path / "m.safetensors"
    assert export(ckpt, "-o", out).returncode == 0
    header, _, blobs = parse_safetensors(out)
    for name, (shape, vals) in expected.items():
        t = torch.frombuffer(bytearray(blobs[name]),
                             dtype=torch.float32).view(tuple(shape))
        assert torch.equal(t, torch.tensor(vals).view(tuple(shape))), name


def test_export_weights_picks_the_newest_complete_step(tmp_path):
    ckpt = tmp_path / "ckpt"
    _, want2 = write_checkpoint(ckpt, 2, 2)
    step4, want4 = write_checkpoint(ckpt, 4, 2)
    write_checkpoint(ckpt, 6, 2, manifest=False)  # killed while writing
    out = tmp_path / "m.safetensors"
    r = export(ckpt, "-o", out)
    assert r.returncode == 0, r.stderr
    check_export(out, want4, 4)

    r = export(ckpt, "-o", out, "--step", "2")
    assert r.returncode == 0, r.stderr
    check_export(out, want2, 2)

    r = export(step4, "-o", out)  # one step directory itself
    assert r.returncode == 0, r.stderr
    check_export(out, want4, 4)

    r = export(ckpt, "-o", out, "--step", "3")
    assert r.returncode == 1
    assert ("has no complete checkpoint of step 3; it has steps 2, 4" in
            r.stderr)
    check_export(out, want4, 4)  # the failed export left the file alone

    r = export(step4, "-o", out, "--step", "2")
    assert r.returncode == 1
    assert "is the checkpoint of step 4, not --step 2" in r.stderr


def test_export_weights_api_and_parallel_checksums(tmp_path, monkeypatch):
    """The checksums of large checkpoints run in worker processes; a small
    threshold sends this one there."""
    ckpt = tmp_path / "ckpt"
    step_dir, expected = write_checkpoint(ckpt, 5, 3)
    monkeypatch.setattr(weights, "PARALLEL_MIN_BYTES", 0)
    out = str(tmp_path / "m.safetensors")
    s = weights.export_weights(str(ckpt), out, jobs=3)
    assert (s.tensors, s.step, s.world, s.graph_hash) == (7, 5, 3, "g1234abcd")
    assert s.bytes == os.path.getsize(out)
    check_export(out, expected, 5)
    flip(os.path.join(step_dir, "rank-2.ckpt"), 60)
    with pytest.raises(weights.CheckpointError, match="checksum mismatch"):
        weights.export_weights(str(ckpt), out, jobs=3)


# ------------------------------------------------------------- bad files

def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def assert_fails(r, *fragments):
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr.startswith("tandem: "), r.stderr
    assert "Traceback" not in r.stderr
    for text in fragments:
        assert text in r.stderr, r.stderr


def test_truncated_rank_file(tmp_path):
    step_dir, _ = write_checkpoint(tmp_path / "ckpt", 4, 3)
    path = os.path.join(step_dir, "rank-1.ckpt")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 5)
    out = tmp_path / "m.safetensors"
    assert_fails(export(tmp_path / "ckpt", "-o", out),
                 "%s is truncated (%d of %d bytes)" % (path, size - 5, size))
    assert not os.path.exists(out) and not os.path.exists(str(out) + ".tmp")

    with open(path, "r+b") as f:
        f.truncate(10)
    assert_fails(export(tmp_path / "ckpt", "-o", out),
                 "%s is truncated (10 bytes, shorter than" % path)


def test_corrupted_rank_file(tmp_path):
    step_dir, expected = write_checkpoint(tmp_path / "ckpt", 4, 3)
    path = os.path.join(step_dir, "rank-0.ckpt")
    flip(path, os.path.getsize(path) - 30)  # in the last blob's bytes
    out = tmp_path / "m.safetensors"
    assert_fails(export(tmp_path / "ckpt", "-o", out),
                 "%s is corrupted (checksum mismatch" % path)
    assert not os.path.exists(out)
    # --no-verify skips the checksums only: that byte is in no param.
    r = export(tmp_path / "ckpt", "-o", out, "--no-verify")
    assert r.returncode == 0, r.stderr
    check_export(out, expected, 4)

    flip(path, 0)  # the magic
    assert_fails(export(tmp_path / "ckpt", "-o", out),
                 "%s is not a tandem checkpoint rank file (bad magic" % path)


def test_corrupted_manifest(tmp_path):
    step_dir, _ = write_checkpoint(tmp_path / "ckpt", 4, 1)
    path = os.path.join(step_dir, "MANIFEST")
    text = open(path).read()
    open(path, "w").write(text.replace("world 1", "world 2"))
    assert_fails(export(step_dir, "-o", tmp_path / "m.safetensors"),
                 "manifest %s is corrupted (checksum mismatch)" % path)
    open(path, "w").write(text.split("checksum")[0])
    assert_fails(export(step_dir, "-o", tmp_path / "m.safetensors"),
                 "manifest %s is truncated (no checksum line)" % path)


def test_missing_rank_file(tmp_path):
    step_dir, _ = write_checkpoint(tmp_path / "ckpt", 4, 3)
    os.remove(os.path.join(step_dir, "rank-2.ckpt"))
    assert_fails(export(tmp_path / "ckpt", "-o", tmp_path / "m.safetensors"),
                 "rank file rank-2.ckpt missing (the manifest says world 3)")


def test_rank_file_of_another_checkpoint(tmp_path):
    a, _ = write_checkpoint(tmp_path / "a", 4, 2)
    b, _ = write_checkpoint(tmp_path / "b", 4, 2, graph_hash="other")
    os.replace(os.path.join(b, "rank-1.ckpt"), os.path.join(a, "rank-1.ckpt"))
    assert_fails(export(a, "-o", tmp_path / "m.safetensors"),
                 "rank-1.ckpt does not match its manifest",
                 "graph_hash=other")


def test_checkpoint_without_tensors_blob(tmp_path):
    write_checkpoint(tmp_path / "ckpt", 4, 2, tensors_blob=False)
    assert_fails(export(tmp_path / "ckpt", "-o", tmp_path / "m.safetensors"),
                 "rank-0.ckpt has no 'tensors' blob",
                 "re-run with a newer worker")


def test_bad_tensors_blob(tmp_path):
    params = [("w", (3, 2), "model.w", True), ("v", (2,), "model.w", True)]
    write_checkpoint(tmp_path / "ckpt", 1, 2, params=params)
    assert_fails(export(tmp_path / "ckpt", "-o", tmp_path / "m.safetensors"),
                 "two tensors are exported as 'model.w'")


def test_no_complete_checkpoint(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_fails(export(empty, "-o", tmp_path / "m.safetensors"),
                 "no complete checkpoint in %s: no step-NNNNNNNN" % empty)
    write_checkpoint(tmp_path / "ckpt", 4, 2, manifest=False)
    assert_fails(export(tmp_path / "ckpt", "-o", tmp_path / "m.safetensors"),
                 "its step directories (step-00000004) have no MANIFEST")
    assert_fails(export(tmp_path / "ckpt" / "step-00000004", "-o",
                        tmp_path / "m.safetensors"),
                 "has no MANIFEST: the checkpoint is incomplete")


def test_bad_paths(tmp_path):
    write_checkpoint(tmp_path / "ckpt", 4, 1)
    assert_fails(export(tmp_path / "nowhere", "-o", tmp_path / "m.st"),
                 "%s is not a directory: pass a job's checkpoint.dir" %
                 (tmp_path / "nowhere"))
    assert_fails(export(tmp_path / "ckpt", "-o", tmp_path / "no" / "m.st"),
                 "cannot write %s: no directory" % (tmp_path / "no" / "m.st"))
    r = export(tmp_path / "ckpt")
    assert r.returncode == 2 and "-o/--output" in r.stderr


# ------------------------------------------------------------- job ids

def test_job_id_without_a_coordinator(tmp_path):
    addr = "127.0.0.1:%d" % free_port()
    r = export("llama-0123abcd-1", "-o", tmp_path / "m.safetensors",
               address=addr, timeout=30)
    assert_fails(r, "cannot reach the tandem coordinator at %s" % addr)
    assert not os.path.exists(tmp_path / "m.safetensors")


def test_job_id_reads_the_jobs_checkpoint_dir(coordinator, client, tmp_path):
    ckpt = tmp_path / "ckpt"
    _, expected = write_checkpoint(ckpt, 4, 2)
    job = client.submit(small_spec(checkpoint={"dir": str(ckpt),
                                               "every": 2}))
    out = tmp_path / "m.safetensors"
    r = export(job.id, "-o", out, address=coordinator.address)
    assert r.returncode == 0, r.stderr
    check_export(out, expected, 4)

    bare = client.submit(small_spec())
    assert_fails(export(bare.id, "-o", out, address=coordinator.address),
                 "job %s has no checkpoint.dir" % bare.id)
    assert_fails(export("no-such-job-1", "-o", out,
                        address=coordinator.address), "no-such-job-1")
    gone = client.submit(small_spec(checkpoint={
        "dir": str(tmp_path / "elsewhere"), "every": 2}))
    assert_fails(export(gone.id, "-o", out, address=coordinator.address),
                 "is not a directory here",
                 "where the workers' shared checkpoint directory is mounted")
    for j in (job, bare, gone):
        client.cancel(j.id)


# ------------------------------------------------------ safetensors in

def test_read_safetensors_validates_the_header(tmp_path):
    def write(header, data=b""):
        raw = json.dumps(header).encode()
        p = tmp_path / "x.safetensors"
        p.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
        return str(p)

    good = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "I64", "shape": [], "data_offsets": [8, 16]}}
    got = weights.read_safetensors(write(good, bytes(range(16))))
    assert got == {"a": ("F32", (2,), bytes(range(8))),
                   "b": ("I64", (), bytes(range(8, 16)))}
    with pytest.raises(weights.CheckpointError, match="starts at 4"):
        weights.read_safetensors(write(
            dict(good, b={"dtype": "F32", "shape": [3],
                          "data_offsets": [4, 16]}), bytes(16)))
    with pytest.raises(weights.CheckpointError, match="data_offsets"):
        weights.read_safetensors(write(good, bytes(12)))
    with pytest.raises(weights.CheckpointError, match="bad safetensors entry"):
        weights.read_safetensors(write({"a": {"dtype": "F33", "shape": [1],
                                              "data_offsets": [0, 4]}},
                                       bytes(4)))
    p = tmp_path / "short.safetensors"
    p.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(weights.CheckpointError, match="truncated"):
        weights.read_safetensors(str(p))
