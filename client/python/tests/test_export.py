"""`tandem export` (tandem/export/, client/README.md "Exporting your own
model"): the user models in tests/models/ exported through the API and the
CLI, read back, and run unit by unit against the modules themselves.

The numerics checks run the archive with their own reader and runner below
(zipfile, json, a few lines of safetensors parsing, torch.jit.load), sharing
no code with tandem.export, and compare with PyTorch eager on the original
module.
"""

import functools
import importlib.util
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import typing
import zipfile

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from tandem_harness import PY_ROOT, REPO  # noqa: E402

import tandem  # noqa: E402
from tandem import export as tx  # noqa: E402

MODELS = REPO / "tests" / "models"
PYTHON = sys.executable


def load_model_file(name):
    spec = importlib.util.spec_from_file_location(
        "test_export_" + name, MODELS / (name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpt = load_model_file("gpt")
encoder_lm = load_model_file("encoder_lm")
try:
    vit = load_model_file("vit")  # torchvision (Debian's python3-torchvision)
except ImportError:
    vit = None
needs_torchvision = pytest.mark.skipif(
    vit is None, reason="no torchvision: scripts/setup.sh installs it")

BUILDS = {
    "gpt": gpt.build,
    "gpt_frozen": gpt.build_frozen,
    "encoder_lm": encoder_lm.build,
}
if vit is not None:
    BUILDS["vit"] = vit.build


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """Every model of BUILDS exported through the API once."""
    d = tmp_path_factory.mktemp("archives")
    out = {}
    for name, build in BUILDS.items():
        module, batch = build()
        path = d / (name + ".tandem")
        manifest = tandem.export(module, batch, path=path)
        out[name] = (path, manifest)
    return out


# ------------------------------------------------- an independent reader/runner

ST_DTYPES = {"F32": torch.float32, "I64": torch.int64, "F64": torch.float64,
             "BF16": torch.bfloat16, "F16": torch.float16,
             "I32": torch.int32, "U8": torch.uint8}


def parse_safetensors(data):
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, "header not padded to a multiple of 8"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        t = torch.frombuffer(bytearray(body[b:e]), dtype=ST_DTYPES[h["dtype"]])
        out[name] = t.reshape(h["shape"])
    return out


def read_raw(path):
    with zipfile.ZipFile(path) as zf:
        assert all(i.compress_type == zipfile.ZIP_STORED
                   for i in zf.infolist())
        manifest = json.loads(zf.read("model/manifest.json"))
        units = [torch.jit.load(io.BytesIO(zf.read("model/" + u["file"])))
                 for u in manifest["units"]]
        weights = parse_safetensors(zf.read("model/weights.safetensors"))
    return manifest, units, weights


def run_units(manifest, units, params, buffers, batch):
    env = dict(batch)
    for u, mod in zip(manifest["units"], units):
        if u["leaf"]:
            for n in u["params"] + u["buffers"]:
                *owner, attr = n[len(u["name"]) + 1:].split(".")
                setattr(functools.reduce(getattr, owner, mod), attr,
                        params[n] if n in params else buffers[n])
            out = mod(*[env[v] for v in u["inputs"]])
        else:
            out = mod(*[params[n] for n in u["params"]],
                      *[buffers[n] for n in u["buffers"]],
                      *[env[v] for v in u["inputs"]])
        assert isinstance(out, tuple) and len(out) == len(u["outputs"])
        env.update(zip(u["outputs"], out))
    return env[manifest["loss"]]


def eager_loss_and_grads(module, batch):
    loss = module(**batch)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named])
    return loss.detach(), dict(zip((n for n, _ in named), grads))


def shorter_batch(build):
    """Three sequences of 20 tokens: another micro-batch and length (for the
    ViT, three other images: its image size is fixed)."""
    if vit is not None and build is vit.build:
        return vit.example_batch(n=3, seed=7)
    g = torch.Generator().manual_seed(7)
    seqs = torch.randint(0, 512, (3, 21), generator=g)
    return {"input_ids": seqs[:, :-1].contiguous(),
            "labels": seqs[:, 1:].contiguous()}


# ------------------------------------------------------------------ manifests

def test_export_gpt_manifestListsUnitsTiedParamBuffersInputs(archives):
    path, m = archives["gpt"]
    raw, _, weights = read_raw(path)
    assert raw["format_version"] == 1 and m.format_version == 1
    assert raw["name"] == "GPT"
    assert raw["torch_version"] == torch.__version__
    assert [u["name"] for u in raw["units"]] == \
        ["embed", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert [u["file"] for u in raw["units"]] == \
        ["units/%03d.pt" % i for i in range(5)]

    module, batch = gpt.build()
    names = [p["name"] for p in raw["params"]]
    assert names == [n for n, _ in module.named_parameters()]
    assert "lm_head.weight" not in names  # tied: listed once
    tied = [p for p in raw["params"] if len(p["units"]) > 1]
    assert [(p["name"], p["units"]) for p in tied] == \
        [("tok_emb.weight", ["embed", "head"])]
    assert [u["name"] for u in raw["units"] if "tok_emb.weight" in u["params"]] \
        == ["embed", "head"]
    assert all(p["requires_grad"] for p in raw["params"])
    assert raw["params"][0]["shape"] == ["512", "64"]  # proto3 JSON: int64
    assert raw["params"][0]["dtype"] == "float32"

    assert [(b["name"], b["units"]) for b in raw["buffers"]] == \
        [("blocks.%d.attn.mask" % i, ["blocks.%d" % i]) for i in range(3)]
    assert [(i["name"], i["dtype"], i["shape"], i["dynamic_dims"], i["role"])
            for i in raw["inputs"]] == [
        ("input_ids", "int64", ["4", "32"], [0, 1], "tokens"),
        ("labels", "int64", ["4", "32"], [0, 1], "targets")]

    # Values are named and flow forward: each unit reads only batch inputs
    # or outputs of earlier units; the loss is the last unit's output.
    seen = {"input_ids", "labels"}
    for u in raw["units"]:
        assert set(u["inputs"]) <= seen, u["name"]
        seen |= set(u["outputs"])
    assert raw["units"][-1]["outputs"] == [raw["loss"]]
    assert "labels" in raw["units"][-1]["inputs"]

    assert set(raw["sha256"]) == {u["file"] for u in raw["units"]} | \
        {"weights.safetensors"}
    # Initial weights: every param and buffer, equal to the module's.
    state = dict(module.named_parameters())
    state.update(module.named_buffers())
    assert set(weights) == set(names) | {b["name"] for b in raw["buffers"]}
    for n, t in weights.items():
        assert torch.equal(t, state[n].detach()), n


def test_export_encoderLm_layersAreLeavesAndTheMaskReachesEach(archives):
    path, m = archives["encoder_lm"]
    raw, units, _ = read_raw(path)
    assert [(u["name"], u["leaf"]) for u in raw["units"]] == [
        ("embed", False), ("encoder.layers.0", True),
        ("encoder.layers.1", True), ("head", False)]
    embed, l0, l1, head = raw["units"]
    # The causal mask, sliced once in embed, is read by both layers: a value
    # that skips a unit, not a chain.
    assert len(embed["outputs"]) == 2
    mask = [v for v in embed["outputs"] if v in l1["inputs"]]
    assert len(mask) == 1 and mask[0] in l0["inputs"]
    assert raw["buffers"][0]["name"] == "causal_mask"
    assert raw["buffers"][0]["units"] == ["embed"]
    # A leaf's params are the scripted module's own, at names inside it.
    own = dict(units[1].named_parameters())
    assert sorted(n[len("encoder.layers.0."):] for n in l0["params"]) == \
        sorted(own)


@needs_torchvision
def test_export_vit_classTokenAndPositionsInEmbed_blocksAreLeaves(archives):
    path, m = archives["vit"]
    raw, units, weights = read_raw(path)
    blocks = ["vit.encoder.layers.encoder_layer_%d" % i for i in range(2)]
    assert [(u["name"], u["leaf"]) for u in raw["units"]] == [
        ("embed", False), (blocks[0], True), (blocks[1], True),
        ("head", False)]
    embed, b0, b1, head = raw["units"]
    # The class token and the position embedding are params read directly
    # in forward (torch.cat, +), not through a submodule: plain params of
    # the embed unit.
    assert embed["params"] == ["vit.class_token", "vit.conv_proj.weight",
                               "vit.conv_proj.bias",
                               "vit.encoder.pos_embedding"]
    assert embed["inputs"] == ["images"]
    # A chain through the blocks; the labels go to the head only.
    assert b0["inputs"] == embed["outputs"] and len(b0["outputs"]) == 1
    assert b1["inputs"] == b0["outputs"]
    assert sorted(head["inputs"]) == sorted(["labels"] + b1["outputs"])
    assert head["outputs"] == [raw["loss"]]
    # Each EncoderBlock is scripted whole, its nn.MultiheadAttention inside;
    # the leaf's params are the scripted module's own, at names inside it.
    own = dict(units[1].named_parameters())
    assert "self_attention.in_proj_weight" in own
    assert sorted(n[len(blocks[0]) + 1:] for n in b0["params"]) == sorted(own)
    # The image size is fixed (torchvision checks it): only dim 0 varies.
    assert [(i["name"], i["dtype"], i["shape"], i["dynamic_dims"], i["role"])
            for i in raw["inputs"]] == [
        ("images", "float32", ["4", "3", "16", "16"], [0], ""),
        ("labels", "int64", ["4"], [0], "")]
    assert raw["buffers"] == []
    module, _ = vit.build()
    assert set(weights) == {n for n, _ in module.named_parameters()}


@needs_torchvision
def test_export_vitWrapMultiheadAttention_attentionLeafInsideTracedBlocks(
        tmp_path):
    """wrap=[nn.MultiheadAttention]: FX traces torchvision's EncoderBlocks
    (their torch._assert with an f-string included) and only the attention
    is scripted whole; the rest of each block falls between the units."""
    module, batch = vit.build()
    path = tmp_path / "vit-attn.tandem"
    tandem.export(module, batch, wrap=[torch.nn.MultiheadAttention],
                  path=path)
    manifest, units, weights = read_raw(path)
    attn = ["vit.encoder.layers.encoder_layer_%d.self_attention" % i
            for i in range(2)]
    assert [(u["name"], u["leaf"]) for u in manifest["units"]] == [
        ("embed", False), (attn[0], True), ("after." + attn[0], False),
        (attn[1], True), ("head", False)]
    # Read back and run independently: the module's loss and gradients.
    for b in (batch, vit.example_batch(n=3, seed=7)):
        module, _ = vit.build()
        want_loss, want_grads = eager_loss_and_grads(module, b)
        params = {p["name"]: weights[p["name"]].clone().requires_grad_()
                  for p in manifest["params"]}
        loss = run_units(manifest, units, params, {}, b)
        assert abs(loss.item() - want_loss.item()) <= \
            1e-6 * abs(want_loss.item())
        grads = torch.autograd.grad(loss, [params[n] for n in want_grads])
        for n, g in zip(want_grads, grads):
            w = want_grads[n]
            assert (g - w).abs().max().item() <= \
                1e-5 * max(w.abs().max().item(), 1e-12), n


def test_export_frozenGpt_marksFrozenParams(archives):
    _, m = archives["gpt_frozen"]
    frozen = sorted(p.name for p in m.params if not p.requires_grad)
    assert frozen == ["pos_emb.weight", "tok_emb.weight"]


def test_export_wrapByClassOrSize_choosesUnits():
    module, batch = gpt.build(n_layer=2)
    m = tandem.export(module, batch, wrap=[gpt.Block])
    assert [u.name for u in m.units] == ["embed", "blocks.0", "blocks.1",
                                         "head"]
    m = tandem.export(module, batch, wrap=[gpt.MLP])
    assert [u.name for u in m.units] == [
        "embed", "blocks.0.mlp", "after.blocks.0.mlp", "blocks.1.mlp", "head"]
    # Size: the smallest modules with >= 30000 params (the MLPs hold 33088,
    # the token embedding 32768; attention 16640).
    m = tandem.export(module, batch, wrap=30000)
    keyed = [u.name for u in m.units if u.name in ("tok_emb", "blocks.0.mlp",
                                                   "blocks.1.mlp")]
    assert keyed == ["tok_emb", "blocks.0.mlp", "blocks.1.mlp"]
    assert all(u.params or u.name.startswith(("embed", "after", "head"))
               for u in m.units)


# ------------------------------------------------------------------ numerics

@pytest.mark.parametrize("model", sorted(BUILDS))
@pytest.mark.parametrize("which", ["example", "shorter"])
def test_runUnits_reproducesLossAndEveryGradient(archives, model, which):
    path, _ = archives[model]
    manifest, units, weights = read_raw(path)
    module, batch = BUILDS[model]()
    if which == "shorter":
        batch = shorter_batch(BUILDS[model])
    want_loss, want_grads = eager_loss_and_grads(module, batch)

    params = {}
    for p in manifest["params"]:
        params[p["name"]] = weights[p["name"]].clone().requires_grad_(
            p["requires_grad"])
    buffers = {b["name"]: weights[b["name"]] for b in manifest["buffers"]}
    loss = run_units(manifest, units, params, buffers, batch)
    assert abs(loss.item() - want_loss.item()) <= 1e-6 * abs(want_loss.item())

    trainable = [n for n, t in params.items() if t.requires_grad]
    assert sorted(trainable) == sorted(want_grads)
    grads = torch.autograd.grad(loss, [params[n] for n in trainable])
    for n, g in zip(trainable, grads):
        w = want_grads[n]
        scale = max(w.abs().max().item(), 1e-12)
        assert (g - w).abs().max().item() <= 1e-5 * scale, n
    if model == "gpt_frozen":
        assert not params["tok_emb.weight"].requires_grad


def test_runArchive_matchesModule(archives):
    path, _ = archives["encoder_lm"]
    archive = tx.load_archive(path)
    module, batch = encoder_lm.build()
    loss = tx.run_archive(archive, batch)
    assert abs(loss.item() - module(**batch).item()) <= 1e-6 * loss.item()
    with pytest.raises(tx.ArchiveError, match="lacks input 'labels'"):
        tx.run_archive(archive, {"input_ids": batch["input_ids"]})


# ------------------------------------------------------------ bf16 check

def cast_floating(t):
    return t.to(torch.bfloat16) if t.is_floating_point() else t


@pytest.mark.parametrize("model", sorted(BUILDS))
def test_export_bf16Check_unitsRunInBf16AsTheModuleDoes(archives, model):
    """Every model of BUILDS runs in bf16, and its manifest says so
    (ArchivePrecisionCheck, which model.dtype bf16 needs). The runner above
    runs the units in bf16 as the worker does (params, float buffers and
    float inputs cast) and computes the module's bf16 loss and gradients:
    `module.to(torch.bfloat16)` on the bf16 batch."""
    path, manifest = archives[model]
    assert [(c.dtype, c.error) for c in manifest.precision_checks] == [
        ("bfloat16", "")]
    raw, units, weights = read_raw(path)
    assert [c["dtype"] for c in raw["precision_checks"]] == ["bfloat16"]
    assert not raw["precision_checks"][0].get("error")
    module, batch = BUILDS[model]()
    batch = {k: cast_floating(v) for k, v in batch.items()}
    want_loss, want_grads = eager_loss_and_grads(module.to(torch.bfloat16),
                                                 batch)
    params = {p["name"]: cast_floating(weights[p["name"]]).requires_grad_(
        p["requires_grad"]) for p in raw["params"]}
    buffers = {b["name"]: cast_floating(weights[b["name"]])
               for b in raw["buffers"]}
    loss = run_units(raw, units, params, buffers, batch)
    assert loss.dtype == want_loss.dtype == torch.bfloat16
    assert loss.item() == want_loss.item()
    trainable = [n for n, t in params.items() if t.requires_grad]
    grads = torch.autograd.grad(loss, [params[n] for n in trainable])
    for n, g in zip(trainable, grads):
        assert g.dtype == torch.bfloat16, n
        assert torch.equal(g, want_grads[n]), n
    assert "runs in bfloat16 (model.dtype bf16): yes, checked" in \
        tx.describe(manifest)


class Float32Constant(torch.nn.Module):
    """Multiplies by a matrix it creates in float32 each call: fine in f32,
    a dtype mismatch once its params are bf16."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return (self.lin(x) @ torch.ones(8, 8)).pow(2).mean()


def test_export_notBf16Able_exportsAndRecordsTheModulesError(tmp_path):
    """A model that fails in bf16 still exports (f32 runs it); the manifest
    records the module's own error, which the job spec quotes when
    model.dtype bf16 is asked for."""
    path = tmp_path / "f32only.tandem"
    manifest = tandem.export(Float32Constant(), {"x": torch.randn(4, 8)},
                             path=path)
    assert path.exists()
    [check] = manifest.precision_checks
    assert check.dtype == "bfloat16"
    assert check.error == ("the module fails in bfloat16: RuntimeError: "
                           "expected scalar type BFloat16 but found Float")
    assert ("runs in bfloat16 (model.dtype bf16): no: the module fails" in
            tx.describe(manifest))


# ------------------------------------------------------------ archive checks

def rewrite_zip(src, dst, change):
    with zipfile.ZipFile(src) as zin, \
            zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)


def test_loadArchive_verifiesEveryChecksum(archives, tmp_path):
    path, manifest = archives["gpt"]
    a = tx.load_archive(path)
    assert a.manifest == manifest
    assert set(a.entries) == set(manifest.sha256)

    def flip(name, data):
        if name == "model/units/002.pt":
            mid = len(data) // 2
            return data[:mid] + bytes([data[mid] ^ 1]) + data[mid + 1:]
        return data
    bad = tmp_path / "corrupt.tandem"
    rewrite_zip(path, bad, flip)
    with pytest.raises(tx.ArchiveError) as e:
        tx.load_archive(bad)
    assert "model/units/002.pt fails its checksum" in str(e.value)
    assert "export it again" in str(e.value)

    def drop(name, data):
        return None if name == "model/weights.safetensors" else data
    rewrite_zip(path, bad, drop)
    with pytest.raises(tx.ArchiveError, match="weights.safetensors is missing"):
        tx.load_archive(bad)

    def future(name, data):
        if name == "model/manifest.json":
            m = json.loads(data)
            m["format_version"] = 2
            return json.dumps(m).encode()
        return data
    rewrite_zip(path, bad, future)
    with pytest.raises(tx.ArchiveError, match="format_version 2; this tandem "
                                              "reads version 1"):
        tx.load_archive(bad)

    bad.write_bytes(b"not a zip")
    with pytest.raises(tx.ArchiveError, match="not a tandem model archive"):
        tx.load_archive(bad)


def test_safetensors_roundTripAndLayout(tmp_path):
    tensors = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
               ("b", torch.tensor([1, -2], dtype=torch.int64)),
               ("c", torch.tensor([1.5, -2.25], dtype=torch.bfloat16)),
               ("d", torch.tensor([True, False])),
               ("e", torch.zeros(0, 4))]
    buf = io.BytesIO()
    tx.write_safetensors(tensors, buf)
    data = buf.getvalue()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    assert n % 8 == 0
    assert header["a"] == {"dtype": "F32", "shape": [2, 3],
                           "data_offsets": [0, 24]}
    assert header["b"]["data_offsets"] == [24, 40]
    assert header["c"]["dtype"] == "BF16"
    assert data[8 + n + 24:8 + n + 32] == struct.pack("<q", 1)
    back = tx.read_safetensors(data)
    assert list(back) == [n for n, _ in tensors]
    for name, t in tensors:
        assert back[name].dtype == t.dtype and torch.equal(back[name], t)
    with pytest.raises(tx.ArchiveError, match="data_offsets"):
        tx.read_safetensors(data[:-4])


# ------------------------------------------------------------------- errors

BAD_MODEL = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 64)

    def forward(self, input_ids, labels):
        x = self.emb(input_ids)
        x, _ = self.attn(x, x, x, need_weights=False)
        return F.cross_entropy(self.out(x).flatten(0, 1), labels.flatten())


def build():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    return Net(), {"input_ids": ids, "labels": ids}
'''
BAD_LINE = 15  # x, _ = self.attn(...)


@pytest.fixture
def bad_model(tmp_path):
    path = tmp_path / "bad_model.py"
    path.write_text(BAD_MODEL)
    spec = importlib.util.spec_from_file_location("bad_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


def test_export_untraceableModule_saysWhereAndWhatToDoAndWritesNothing(
        bad_model, tmp_path):
    path, mod = bad_model
    module, batch = mod.build()
    out = tmp_path / "out.tandem"
    with pytest.raises(tx.ExportError) as e:
        tandem.export(module, batch, path=out)
    msg = str(e.value)
    assert "cannot capture module 'attn' (torch.nn.MultiheadAttention)" in msg
    assert "%s:%d: x, _ = self.attn(x, x, x, need_weights=False)" % (
        path, BAD_LINE) in msg
    assert "wrap=[MultiheadAttention]" in msg
    assert not e.value.usage
    assert sorted(os.listdir(tmp_path)) == ["bad_model.py"]

    # The suggested fix works: the module becomes a leaf unit.
    m = tandem.export(module, batch, wrap=[torch.nn.MultiheadAttention],
                      path=out)
    assert [(u.name, u.leaf) for u in m.units] == \
        [("embed", False), ("attn", True), ("head", False)]


def test_export_failure_keepsExistingFile(bad_model, tmp_path):
    path, mod = bad_model
    module, batch = mod.build()
    out = tmp_path / "model.tandem"
    out.write_bytes(b"the previous archive")
    with pytest.raises(tx.ExportError):
        tandem.export(module, batch, path=out)
    assert out.read_bytes() == b"the previous archive"
    assert sorted(os.listdir(tmp_path)) == ["bad_model.py", "model.tandem"]


def test_export_encoderLmAttentionOnly_layersRunAsGlueWithUnitMemory():
    """wrap=[nn.MultiheadAttention] asks FX to trace nn.TransformerEncoder-
    Layer, which branches on its input's shape: each layer runs as glue,
    calling its attention and every other submodule holding params as units
    of their own (before glue existed, this was an error naming the layer)."""
    module, batch = encoder_lm.build()
    m = tandem.export(module, batch, wrap=[torch.nn.MultiheadAttention])
    layer = ["self_attn", "norm1", "linear1", "linear2", "norm2"]
    assert [u.name for u in m.units] == (
        ["embed"] + ["encoder.layers.0." + n for n in layer] +
        ["encoder.layers.1." + n for n in layer] + ["head"])
    assert [(g.name, g.first_unit, g.unit_count) for g in m.glues] == [
        ("encoder.layers.0", 1, 5), ("encoder.layers.1", 6, 5)]
    # Units inside a glue have their own memory measured as the glue calls
    # them (tests/export checks it against the worker's profile), at the
    # example's micro-batch and twice it.
    size = batch["input_ids"].shape[0]
    for k, u in enumerate(m.units):
        got = {(x.micro_batch, x.recompute) for x in u.memory}
        assert {(size, False), (2 * size, False)} <= got, (u.name, got)
    attn = {(x.micro_batch, x.recompute): x for x in m.units[1].memory}
    # Attention keeps what it saves for backward, more at twice the batch.
    assert 0 < attn[size, False].forward_net_bytes < \
        attn[2 * size, False].forward_net_bytes
    assert all(g.loaded_bytes > 0 for g in m.glues)


def test_export_gpt_recordsEachUnitsOwnMemoryAtTwoMicroBatches(archives):
    """Each unit's own memory forward and backward (what the worker's
    profile measures per node, tests/export checks the two agree) at the
    example's micro-batch and twice it, with and without activation
    checkpointing, and what loading each unit keeps."""
    _, m = archives["gpt"]
    n = len(m.units)
    for k, u in enumerate(m.units):
        got = {(x.micro_batch, x.recompute): x for x in u.memory}
        recompute = k + 1 < n  # the last unit never recomputes
        assert set(got) == ({(4, False), (8, False), (4, True), (8, True)}
                            if recompute else {(4, False), (8, False)}), u.name
        assert u.loaded_bytes > 0, u.name
    blocks = [u for u in m.units if u.name.startswith("blocks.")]
    for u in blocks:
        got = {(x.micro_batch, x.recompute): x for x in u.memory}
        plain, twice = got[4, False], got[8, False]
        # A block's forward keeps what it saves for backward and its output:
        # at least what it saves, and in proportion to the micro-batch but
        # for the causal mask's slice (32 x 32 bools).
        assert plain.forward_net_bytes >= u.saved_activation_bytes > 0
        assert twice.forward_net_bytes == 2 * plain.forward_net_bytes - 1024
        assert plain.forward_rise_bytes >= plain.forward_net_bytes
        # Its backward frees what the forward kept and keeps its params'
        # gradients, whatever the micro-batch: what the two points' line
        # crosses 0 at (the coordinator interpolates along it).
        grads = 4 * sum(math.prod(p.shape) for p in m.params
                        if p.units == [u.name])
        at_zero = 2 * plain.backward_net_bytes - twice.backward_net_bytes
        assert abs(at_zero - grads) <= 2048, (at_zero, grads)
        assert plain.backward_net_bytes < 0
        # Checkpointed, the forward keeps its output only, and the backward
        # computes the rest again first.
        ckpt = got[4, True]
        assert ckpt.forward_net_bytes < plain.forward_net_bytes
        assert ckpt.backward_rise_bytes > plain.backward_rise_bytes
    # The head's backward holds the logits' gradients: more than a block's.
    head = {(x.micro_batch, x.recompute): x for x in m.units[-1].memory}
    assert head[4, False].backward_rise_bytes > 2 * 4 * 32 * 512 * 4 * 0.9


def test_export_withoutAProfilerThatRecordsMemory_stillExportsAndWarns(
        monkeypatch):
    """A torch whose profiler cannot record CPU allocations still exports:
    the archive carries no unit memory (the check at submit stays a lower
    bound) and the user is told."""
    from tandem.export import api

    def unavailable(*_):
        raise RuntimeError("profiler without kineto")
    monkeypatch.setattr(api, "measure_unit_memory", unavailable)
    module, batch = gpt.build(n_layer=1)
    with pytest.warns(UserWarning, match="units' memory was not measured"):
        m = tandem.export(module, batch)
    assert all(len(u.memory) == 0 and u.loaded_bytes == 0 for u in m.units)
    assert all(u.saved_activation_bytes > 0 for u in m.units[1:-1])


class BiasFreeAttentionLM(torch.nn.Module):
    def __init__(self, zero_buffer=False):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                 batch_first=True)
        layer.self_attn = torch.nn.MultiheadAttention(16, 2, bias=False,
                                                      batch_first=True)
        if zero_buffer:  # the fix the error suggests, for both biases
            attn = layer.self_attn
            del attn.in_proj_bias, attn.out_proj.bias
            attn.register_buffer("in_proj_bias", torch.zeros(48))
            attn.out_proj.register_buffer("bias", torch.zeros(16))
        self.enc = torch.nn.TransformerEncoder(layer, 2,
                                               enable_nested_tensor=False)
        self.out = torch.nn.Linear(16, 64)

    def forward(self, input_ids, labels):
        logits = self.out(self.enc(self.emb(input_ids)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                 labels.flatten())


def test_export_unscriptableLeaf_namesSubmoduleLineAndNoneAttribute(tmp_path):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    batch = {"input_ids": ids, "labels": ids}
    out = tmp_path / "lm.tandem"
    with pytest.raises(tx.ExportError) as e:
        tandem.export(BiasFreeAttentionLM(), batch, path=out)
    msg = str(e.value)
    assert msg.startswith(
        "cannot script leaf unit 'enc.layers.0' (torch.nn.TransformerEncoder"
        "Layer) with TorchScript: the code of its submodule "
        "'enc.layers.0.self_attn' (torch.nn.MultiheadAttention) fails"), msg
    assert re.search(r'File "\S*torch/nn/modules/activation\.py", line \d+',
                     msg), msg
    assert "self.in_proj_bias.dtype" in msg and "<--- HERE" in msg, msg
    assert "enc.layers.0.self_attn.in_proj_bias is None (e.g. bias=False)" \
        in msg, msg
    assert "register a zero buffer under that name" in msg, msg
    assert not e.value.usage and not out.exists()
    # The suggested fix exports, and the archive computes the module's loss.
    module = BiasFreeAttentionLM(zero_buffer=True)
    tandem.export(module, batch, path=out)
    loss = tx.run_archive(tx.load_archive(out), batch)
    assert abs(loss.item() - module(**batch).item()) <= 1e-6 * loss.item()


class Logits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


def test_export_badBatchOrLoss_clearErrors():
    module, batch = gpt.build(n_layer=1)
    with pytest.raises(tx.ExportError, match="example_batch lacks 'labels', "
                                             "which forward.*requires"):
        tandem.export(module, {"input_ids": batch["input_ids"]})
    with pytest.raises(tx.ExportError, match="has 'mask', which forward"):
        tandem.export(module, dict(batch, mask=batch["labels"]))
    with pytest.raises(tx.ExportError, match="not in the example batch"):
        tandem.export(module, batch, dynamic_dims={"tokens": [1]})

    x = {"x": torch.randn(2, 4)}
    with pytest.raises(tx.ExportError, match="must be a scalar floating-point"
                                             " tensor.*shape \\[2, 3\\]"):
        tandem.export(Logits(), x)
    # loss= maps the outputs to the scalar.
    m = tandem.export(Logits(), x, loss=lambda out, b: out.square().mean())
    assert [u.name for u in m.units] == ["model"]
    assert [p.name for p in m.params] == ["lin.weight", "lin.bias"]
    # Dim 1 of x is Linear's feature dim: the module refuses other sizes,
    # so only the micro-batch varies.
    assert list(m.inputs[0].dynamic_dims) == [0]
    assert m.inputs[0].role == ""


class PatchBlock(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


class TinyViT(torch.nn.Module):
    """A classifier that checks its image size, like torchvision's ViT."""

    def __init__(self, image=8, patch=4, d=16, classes=5):
        super().__init__()
        self.image = image
        self.proj = torch.nn.Conv2d(3, d, patch, patch)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, d))
        self.blocks = torch.nn.Sequential(PatchBlock(d), PatchBlock(d))
        self.heads = torch.nn.Sequential(torch.nn.Linear(d, classes))

    def forward(self, images):
        n, _, h, _ = images.shape
        torch._assert(h == self.image, "wrong image size")
        x = self.proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(n, -1, -1), x], dim=1)
        return self.heads(self.blocks(x)[:, 0])


def test_export_lossOnlyEntriesAndFixedImageSize(tmp_path):
    torch.manual_seed(0)
    module = TinyViT()
    batch = {"images": torch.randn(4, 3, 8, 8),
             "labels": torch.tensor([0, 3, 1, 4])}

    def loss(out, b):
        return torch.nn.functional.cross_entropy(out, b["labels"])
    with pytest.raises(tx.ExportError, match="has 'labels', which forward"):
        tandem.export(module, batch)
    path = tmp_path / "vit.tandem"
    m = tandem.export(module, batch, loss=loss, path=path)
    # The blocks are units (leaves: nn.MultiheadAttention inside); a
    # Sequential holding one Linear is not a stack of blocks.
    assert [(u.name, u.leaf) for u in m.units] == [
        ("embed", False), ("blocks.0", True), ("blocks.1", True),
        ("head", False)]
    # The module refuses other image sizes, so only dim 0 varies.
    assert [(i.name, list(i.dynamic_dims), i.role) for i in m.inputs] == \
        [("images", [0], ""), ("labels", [0], "")]
    with pytest.raises(tx.ExportError, match="dynamic_dims says images "
                                             "\\[2, 3\\] may vary, but"):
        tandem.export(module, batch, loss=loss, dynamic_dims={"images": [2, 3]})

    manifest, units, weights = read_raw(path)
    small = {k: v[:3] for k, v in batch.items()}
    for b in (batch, small):
        out = loss(module(images=b["images"]), b)
        named = list(module.named_parameters())
        want = torch.autograd.grad(out, [p for _, p in named])
        params = {p["name"]: weights[p["name"]].clone().requires_grad_()
                  for p in manifest["params"]}
        got = run_units(manifest, units, params, {}, b)
        assert abs(got.item() - out.item()) <= 1e-6 * abs(out.item())
        grads = torch.autograd.grad(got, [params[n] for n, _ in named])
        for (n, _), g, w in zip(named, grads, want):
            assert (g - w).abs().max().item() <= \
                1e-5 * max(w.abs().max().item(), 1e-12), n


def test_export_syntheticDescriptions_fromTheExampleOrInputRanges(tmp_path):
    """What data.kind synthetic draws for the inputs of no role: floats with
    the example's mean and std, integers over its smallest to largest value
    or input_ranges; none for inputs of a role (the token stream's)."""
    import tandem.synthetic as syn

    torch.manual_seed(0)
    module = TinyViT()
    batch = {"images": torch.randn(4, 3, 8, 8) * 3 + 1,
             "labels": torch.tensor([1, 3, 1, 2])}

    def loss(out, b):
        return torch.nn.functional.cross_entropy(out, b["labels"])
    m = tandem.export(module, batch, loss=loss)
    images, labels = m.inputs
    x = batch["images"].double()
    assert images.synthetic.mean == pytest.approx(x.mean().item())
    assert images.synthetic.std == pytest.approx(x.std(unbiased=False).item())
    assert (labels.synthetic.low, labels.synthetic.high) == (1, 3)
    assert "labels int64 [4] dynamic dims [0] (synthetic: 1 to 3)" in \
        tx.describe(m)

    path = tmp_path / "vit.tandem"
    m = tandem.export(module, batch, loss=loss, path=path,
                      input_ranges={"labels": (0, 4)})
    assert (m.inputs[1].synthetic.low, m.inputs[1].synthetic.high) == (0, 4)
    # The archive keeps them, and tandem.synthetic draws from them.
    m = tx.load_archive(path).manifest
    drawn = syn.global_batch(m, seed=5, step=2, global_size=64, seq_len=0)
    assert drawn["images"].shape == (64, 3, 8, 8)
    assert drawn["images"].dtype == torch.float32
    assert abs(drawn["images"].double().mean().item() - 1) < 0.5
    assert set(drawn["labels"].tolist()) == {0, 1, 2, 3, 4}
    again = syn.global_batch(m, seed=5, step=2, global_size=64, seq_len=0)
    assert torch.equal(drawn["images"], again["images"])
    # Samples are addressed globally: step 2 of 64 is samples 128..191.
    part = syn.inputs(m, 5, range(160, 170), seq_len=0)
    assert torch.equal(part["labels"], drawn["labels"][32:42])

    for ranges, want in [
            ({"label": (0, 4)}, "input_ranges names 'label', which is not"),
            ({"images": (0, 4)}, "a range is for integer and bool inputs"),
            ({"labels": (4, 0)}, "must be non-empty and within int64's"),
            ({"labels": 4}, "give \\(low, high\\)")]:
        with pytest.raises(tx.ExportError, match=want):
            tandem.export(module, batch, loss=loss, input_ranges=ranges)

    gpt_module, gpt_batch = gpt.build(n_layer=1)
    m = tandem.export(gpt_module, gpt_batch)
    assert not any(i.HasField("synthetic") for i in m.inputs)
    with pytest.raises(tx.ExportError, match="the input has role tokens"):
        tandem.export(gpt_module, gpt_batch,
                      input_ranges={"input_ids": (0, 9)})


def test_synthetic_tokenStreamMatchesTheWorkersFormula():
    """tandem.synthetic's token stream: a walk in [0, vocab) with 1 token in
    8 noise, seq_len + 1 tokens, the same for a seed and index (the worker's
    own values are pinned in synthetic_inputs_test)."""
    import tandem.synthetic as syn

    row = syn.token_sequence(3, 50, 4, 12)
    assert row == [47, 3, 1, 15, 21]
    long = syn.token_sequence(9, 1000, 200, 4)
    assert len(long) == 201 and all(0 <= t < 1000 for t in long)
    steps = [(b - a) % 1000 for a, b in zip(long, long[1:])]
    assert max(set(steps), key=steps.count) in range(1, 8)


def test_importTandem_doesNotImportTorch():
    code = ("import sys, tandem, tandem.cli, tandem.client; "
            "print('torch' in sys.modules)")
    out = subprocess.run([PYTHON, "-c", code], cwd=PY_ROOT, check=True,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- CLI

def run_cli(*args, cwd=PY_ROOT):
    env = dict(os.environ, PYTHONPATH=str(PY_ROOT))
    return subprocess.run([PYTHON, "-m", "tandem", "export", *args],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_cli_exportsGptAndEncoderLm(tmp_path):
    out = tmp_path / "gpt.tandem"
    r = run_cli(str(MODELS / "gpt.py") + ":build", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "GPT: 5 units (embed, blocks.0, blocks.1, blocks.2, head)" in r.stdout
    assert "1 used by more than one unit (tied), 0 frozen" in r.stdout
    m = tx.load_archive(out).manifest
    assert m.source == str(MODELS / "gpt.py") + ":build"

    # An example batch from a safetensors file, with another length, and
    # only dim 1 of input_ids declared dynamic (dim 0 always is).
    ids = torch.randint(0, 512, (2, 17))
    batch_file = tmp_path / "batch.safetensors"
    with open(batch_file, "wb") as f:
        tx.write_safetensors([("input_ids", ids[:, :-1].contiguous()),
                              ("labels", ids[:, 1:].contiguous())], f)
    out = tmp_path / "enc.tandem"
    r = run_cli(str(MODELS / "encoder_lm.py") + ":build", "-o", str(out),
                "--example-batch", str(batch_file), "--dynamic",
                "input_ids:1", "--name", "enc")
    assert r.returncode == 0, r.stderr
    assert "enc: 4 units" in r.stdout
    m = tx.load_archive(out).manifest
    assert [(i.name, list(i.shape), list(i.dynamic_dims)) for i in m.inputs] \
        == [("input_ids", [2, 16], [0, 1]), ("labels", [2, 16], [0, 1])]
    assert [u.leaf for u in m.units] == [False, True, True, False]


def test_cli_untraceableModule_exits1WithoutTraceback(bad_model, tmp_path):
    path, _ = bad_model
    out = tmp_path / "out.tandem"
    r = run_cli(str(path) + ":build", "-o", str(out))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "cannot capture module 'attn'" in r.stderr
    assert "%s:%d:" % (path, BAD_LINE) in r.stderr
    assert "--wrap MultiheadAttention" in r.stderr
    assert not out.exists()
    r = run_cli(str(path) + ":build", "-o", str(out), "--wrap",
                "MultiheadAttention")
    assert r.returncode == 0, r.stderr
    assert "attn [leaf]" in r.stdout


def test_cli_usageErrors_exit2(tmp_path):
    out = str(tmp_path / "x.tandem")
    gpt_py = str(MODELS / "gpt.py")
    for args, want in [
            (["nope.py:build", "-o", out], "no such file"),
            ([gpt_py, "-o", out], "expected FILE.py:FUNCTION"),
            ([gpt_py + ":missing", "-o", out], "has no function 'missing'"),
            ([gpt_py + ":build", "-o", out, "--wrap", "Nope"],
             "no module of class 'Nope'"),
            ([gpt_py + ":build", "-o", out, "--dynamic", "input_ids"],
             "--dynamic takes NAME:DIM"),
            ([gpt_py + ":build", "-o", out, "--example-batch",
              str(tmp_path / "missing.safetensors")],
             "cannot read --example-batch"),
            ([gpt_py + ":GPT", "-o", out],
             "returned only the module; pass --example-batch"),
            ([gpt_py + ":build", "-o", out, "--input-range", "labels:0:9"],
             "--input-range takes NAME=LOW:HIGH")]:
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert want in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert not os.path.exists(out)


# ------------------------------------------------------------------- glue

class Layer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor,
                mask: typing.Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.lin(x)
        if mask is not None:
            h = h.masked_fill(mask[..., None], 0.0)
        return self.norm(x + h)


class Stack(nn.Module):
    """Its forward reads a length with .item(): torch.fx cannot capture
    it, so it runs as glue over its layers. `scale_param`: it also holds a
    param of its own (which glue cannot). `twice`: it calls its first layer
    twice."""

    def __init__(self, scale_param=False, twice=False):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.twice = twice
        if scale_param:
            self.scale = nn.Parameter(torch.ones(8))
        else:
            self.scale = None

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        t = int(torch.max(lengths).item())
        mask = torch.arange(t)[None, :] >= lengths[:, None]
        x = x[:, :t]
        for layer in self.layers:
            x = layer(x, mask)
        if self.twice:
            x = self.layers[0](x, mask)
        if self.scale is not None:
            x = x * self.scale
        return x


class StackModel(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.stack = Stack(**kw)
        self.out = nn.Linear(8, 3)

    def forward(self, x, lengths, labels):
        h = self.stack(self.inp(x), lengths)
        return torch.nn.functional.cross_entropy(self.out(h.mean(1)), labels)


def stack_batch():
    g = torch.Generator().manual_seed(3)
    return {"x": torch.randn(3, 6, 4, generator=g),
            "lengths": torch.tensor([6, 4, 5]),
            "labels": torch.tensor([0, 2, 1])}


def test_export_glue_keepsLayersUnitsAndRunsAsTheModule(tmp_path):
    """The container is glue; its layers stay units, called in order."""
    torch.manual_seed(0)
    module = StackModel()
    batch = stack_batch()
    m = tandem.export(module, batch, path=tmp_path / "m.tandem",
                      dynamic_dims={"x": [0], "lengths": [0]})
    assert [u.name for u in m.units] == [
        "embed", "stack.layers.0", "stack.layers.1", "head"]
    [g] = m.glues
    assert (g.name, g.first_unit, g.unit_count) == ("stack", 1, 2)
    assert "glue: stack (torch.fx cannot capture its forward" in \
        tx.describe(m)
    archive = tandem.load_archive(tmp_path / "m.tandem")
    with torch.no_grad():
        want = module(**batch)
        got = tandem.run_archive(archive, batch)
    assert torch.allclose(got, want, rtol=1e-6)


def test_export_glueHoldingAParam_saysWhichAndTheFixWorks():
    torch.manual_seed(0)
    with pytest.raises(tx.ExportError) as e:
        tandem.export(StackModel(scale_param=True), stack_batch(),
                      dynamic_dims={"x": [0], "lengths": [0]})
    msg = str(e.value)
    assert "module 'stack' (" in msg and "holds param 'stack.scale'" in msg
    assert "Move the param into a submodule" in msg

    # The fix: the param in a submodule of its own, which becomes a unit.
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return x * self.weight

    class ScaledStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Layer(), Layer()])
            self.scale = Scale()

        def forward(self, x: torch.Tensor, lengths: torch.Tensor):
            t = int(torch.max(lengths).item())
            mask = torch.arange(t)[None, :] >= lengths[:, None]
            x = x[:, :t]
            for layer in self.layers:
                x = layer(x, mask)
            return self.scale(x)

    module = StackModel()
    module.stack = ScaledStack()
    m = tandem.export(module, stack_batch(),
                      dynamic_dims={"x": [0], "lengths": [0]})
    assert [u.name for u in m.units] == [
        "embed", "stack.layers.0", "stack.layers.1", "stack.scale", "head"]


def test_export_glueCallingALayerTwice_saysSoAndTheFixWorks():
    torch.manual_seed(0)
    with pytest.raises(tx.ExportError) as e:
        tandem.export(StackModel(twice=True), stack_batch(),
                      dynamic_dims={"x": [0], "lengths": [0]})
    msg = str(e.value)
    assert "module 'stack.layers.0' (" in msg
    assert "is called 2 times by the glue 'stack'" in msg
    assert "Give each call a module of its own" in msg
    # The fix: a third layer instead of the second call.
    module = StackModel()
    module.stack.layers.append(Layer())
    tandem.export(module, stack_batch(),
                  dynamic_dims={"x": [0], "lengths": [0]})


def test_export_glueStub_refusesNoneWhereItCapturedATensor(tmp_path):
    """Stack passes its layers a mask; a glue that passed None instead
    fails the run naming the unit and the argument, rather than handing
    the unit an undefined tensor."""
    torch.manual_seed(0)
    tandem.export(StackModel(), stack_batch(), path=tmp_path / "m.tandem",
                  dynamic_dims={"x": [0], "lengths": [0]})
    archive = tandem.load_archive(tmp_path / "m.tandem")
    glue = archive.glue_module(0)
    stub = getattr(glue.layers, "0")
    with pytest.raises(Exception, match="exported with a tensor for mask; "
                       "this call passes None"):
        stub(torch.zeros(3, 6, 8), None)


def test_export_glueStub_refusesAnotherConstantThanCaptured(tmp_path):
    """What was not a tensor at capture is a constant of the unit: a glue
    that passes another value fails the run naming it, rather than
    computing with the captured one."""
    class Flagged(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, flip: bool = False):
            return self.lin(-x if flip else x)

    class FlagStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = Flagged()

        def forward(self, x: torch.Tensor, lengths: torch.Tensor):
            return self.layer(x, int(torch.max(lengths).item()) > 5)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 8)
            self.stack = FlagStack()

        def forward(self, x, lengths, labels):
            return self.stack(self.inp(x), lengths).mean()

    torch.manual_seed(0)
    tandem.export(Model(), stack_batch(), path=tmp_path / "m.tandem",
                  dynamic_dims={"x": [0], "lengths": [0]}, wrap=[Flagged])
    archive = tandem.load_archive(tmp_path / "m.tandem")
    batch = stack_batch()
    batch["lengths"] = torch.tensor([3, 4, 5])  # the flag turns False
    with pytest.raises(Exception, match="exported with flip=True"):
        tandem.run_archive(archive, batch)
