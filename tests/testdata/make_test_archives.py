"""Writes the small model archives the worker's archive tests train.

Run with Debian's Python (it has torch 1.13): /usr/bin/python3 THIS OUT_DIR.
Everything is written by hand here, not by `tandem export`: TorchScript
units scripted from the modules below, the manifest as proto3 JSON, the
weights as safetensors, the zip with stored entries. The layout is
proto/tandem/v1/archive.proto's.

Archives:
  residual.tandem   embed -> block0 -> block1 -> head. The embedding's
                    output x0 skips both blocks into the head (a residual
                    stream read two units later), the embedding is tied
                    with the output head (first and last unit), block1 has
                    a buffer.
  leaf.tandem       embed -> attn (a leaf: a scripted nn.MultiheadAttention
                    block with a causal-mask buffer, params bound by
                    attribute) -> head, embedding tied.
  bad_checksum.tandem, bad_version.tandem, use_before_def.tandem,
  missing_entry.tandem: residual.tandem broken one way each.
  frozen.tandem     residual.tandem with embed.weight (tied: the first and
                    the last unit) and blocks.0.b frozen (requiresGrad
                    false).
"""

import hashlib
import io
import json
import os
import struct
import sys
import zipfile
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

VOCAB = 16
D = 8
SEQ = 6


class Embed(nn.Module):
    def forward(self, weight: Tensor, tokens: Tensor) -> Tuple[Tensor]:
        return (F.embedding(tokens, weight),)


class Block0(nn.Module):
    # x1 = x0 + tanh(x0 W^T + b)
    def forward(self, w: Tensor, b: Tensor, x0: Tensor) -> Tuple[Tensor]:
        return (x0 + torch.tanh(F.linear(x0, w, b)),)


class Block1(nn.Module):
    # x2 = x1 + gelu(x1 W^T) * scale (scale: a buffer)
    def forward(self, w: Tensor, scale: Tensor, x1: Tensor) -> Tuple[Tensor]:
        return (x1 + F.gelu(F.linear(x1, w)) * scale,)


class Head(nn.Module):
    # Reads the last block's output and the embedding's (skipping both
    # blocks); the logits use the tied embedding.
    def forward(self, embed: Tensor, gain: Tensor, x2: Tensor, x0: Tensor,
                targets: Tensor) -> Tuple[Tensor]:
        h = (x2 + 0.5 * x0) * gain
        logits = F.linear(h, embed)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                               targets.reshape(-1))
        return (loss,)


class LeafHead(nn.Module):
    def forward(self, embed: Tensor, x: Tensor, targets: Tensor) -> Tuple[Tensor]:
        logits = F.linear(x, embed)
        return (F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                targets.reshape(-1)),)


class AttnBlock(nn.Module):
    """Kept whole (a leaf): MultiheadAttention has shape-dependent code."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.register_buffer(
            "mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def forward(self, x: Tensor) -> Tuple[Tensor]:
        t = x.size(1)
        y, _ = self.attn(x, x, x, attn_mask=self.mask[:t, :t],
                         need_weights=False)
        return (x + y,)


def script_bytes(module: nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buf)
    return buf.getvalue()


def safetensors_bytes(tensors) -> bytes:
    names = {torch.float32: "F32", torch.bool: "BOOL", torch.int64: "I64"}
    header = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, t in tensors:
        raw = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def token_inputs():
    return [{"name": name, "dtype": "int64", "shape": [2, SEQ],
             "dynamicDims": [1], "role": name}
            for name in ("tokens", "targets")]


def param(name, t, units, requires_grad=True):
    return {"name": name, "shape": list(t.shape), "dtype": "float32",
            "requiresGrad": requires_grad, "units": units}


def write(path, manifest, entries, sha_override=None, drop=None):
    entries = dict(entries)
    manifest = dict(manifest)
    manifest["sha256"] = {k: hashlib.sha256(v).hexdigest()
                          for k, v in entries.items()}
    if sha_override:
        manifest["sha256"].update(sha_override)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("model/manifest.json", json.dumps(manifest, indent=1))
        for name, data in entries.items():
            if name != drop:
                z.writestr("model/" + name, data)


def residual(out_dir):
    g = torch.Generator().manual_seed(3)
    embed = torch.randn(VOCAB, D, generator=g) * 0.3
    w0 = torch.randn(D, D, generator=g) * 0.3
    b0 = torch.randn(D, generator=g) * 0.1
    w1 = torch.randn(D, D, generator=g) * 0.3
    scale = torch.linspace(0.5, 1.5, D)
    gain = torch.ones(D) + 0.1 * torch.randn(D, generator=g)
    manifest = {
        "formatVersion": 1, "name": "ResidualTied",
        "source": "tests/testdata/make_test_archives.py",
        "torchVersion": torch.__version__,
        "inputs": token_inputs(),
        "params": [
            param("embed.weight", embed, ["embed", "head"]),
            param("blocks.0.w", w0, ["blocks.0"]),
            param("blocks.0.b", b0, ["blocks.0"]),
            param("blocks.1.w", w1, ["blocks.1"]),
            param("head.gain", gain, ["head"]),
        ],
        "buffers": [{"name": "blocks.1.scale", "shape": [D],
                     "dtype": "float32", "units": ["blocks.1"]}],
        "units": [
            {"name": "embed", "file": "units/000.pt", "inputs": ["tokens"],
             "outputs": ["x0"], "params": ["embed.weight"]},
            {"name": "blocks.0", "file": "units/001.pt", "inputs": ["x0"],
             "outputs": ["x1"], "params": ["blocks.0.w", "blocks.0.b"]},
            {"name": "blocks.1", "file": "units/002.pt", "inputs": ["x1"],
             "outputs": ["x2"], "params": ["blocks.1.w"],
             "buffers": ["blocks.1.scale"]},
            {"name": "head", "file": "units/003.pt",
             "inputs": ["x2", "x0", "targets"], "outputs": ["loss"],
             "params": ["embed.weight", "head.gain"]},
        ],
        "loss": "loss",
    }
    entries = {
        "units/000.pt": script_bytes(Embed()),
        "units/001.pt": script_bytes(Block0()),
        "units/002.pt": script_bytes(Block1()),
        "units/003.pt": script_bytes(Head()),
        "weights.safetensors": safetensors_bytes([
            ("embed.weight", embed), ("blocks.0.w", w0), ("blocks.0.b", b0),
            ("blocks.1.w", w1), ("head.gain", gain),
            ("blocks.1.scale", scale)]),
    }
    write(os.path.join(out_dir, "residual.tandem"), manifest, entries)
    write(os.path.join(out_dir, "bad_checksum.tandem"), manifest, entries,
          sha_override={"units/002.pt": "0" * 64})
    write(os.path.join(out_dir, "bad_version.tandem"),
          dict(manifest, formatVersion=7), entries)
    bad = json.loads(json.dumps(manifest))
    bad["units"][1]["inputs"] = ["x2"]
    write(os.path.join(out_dir, "use_before_def.tandem"), bad, entries)
    write(os.path.join(out_dir, "missing_entry.tandem"), manifest, entries,
          drop="units/001.pt")
    # Fine-tuning: the tied embedding (first and last unit, so the first
    # unit's output carries no gradient) and block 0's bias frozen.
    frozen = json.loads(json.dumps(manifest))
    frozen["name"] = "ResidualFrozen"
    frozen["params"][0]["requiresGrad"] = False
    frozen["params"][2]["requiresGrad"] = False
    write(os.path.join(out_dir, "frozen.tandem"), frozen, entries)


def leaf(out_dir):
    torch.manual_seed(5)
    block = AttnBlock()
    embed = torch.randn(VOCAB, D) * 0.3
    names = [n for n, _ in block.named_parameters()]
    params = [param("embed.weight", embed, ["embed", "head"])]
    weights = [("embed.weight", embed)]
    for n, p in block.named_parameters():
        params.append(param("attn." + n, p.detach(), ["attn"]))
        weights.append(("attn." + n, p.detach()))
    weights.append(("attn.mask", block.mask))
    manifest = {
        "formatVersion": 1, "name": "LeafAttention",
        "source": "tests/testdata/make_test_archives.py",
        "torchVersion": torch.__version__,
        "inputs": token_inputs(),
        "params": params,
        "buffers": [{"name": "attn.mask", "shape": [SEQ, SEQ],
                     "dtype": "bool", "units": ["attn"]}],
        "units": [
            {"name": "embed", "file": "units/000.pt", "inputs": ["tokens"],
             "outputs": ["x0"], "params": ["embed.weight"]},
            {"name": "attn", "file": "units/001.pt", "inputs": ["x0"],
             "outputs": ["x1"], "params": ["attn." + n for n in names],
             "buffers": ["attn.mask"], "leaf": True},
            {"name": "head", "file": "units/002.pt",
             "inputs": ["x1", "targets"], "outputs": ["loss"],
             "params": ["embed.weight"]},
        ],
        "loss": "loss",
    }
    entries = {
        "units/000.pt": script_bytes(Embed()),
        "units/001.pt": script_bytes(block),
        "units/002.pt": script_bytes(LeafHead()),
        "weights.safetensors": safetensors_bytes(weights),
    }
    write(os.path.join(out_dir, "leaf.tandem"), manifest, entries)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_test_archives.py OUT_DIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    residual(sys.argv[1])
    leaf(sys.argv[1])


if __name__ == "__main__":
    main()
