"""Exported models train as PyTorch eager trains them (issue 12).

A user's unmodified nn.Module (tests/models/) is exported with
`tandem.export`, trained by the real `tandem-worker --standalone` processes
at worlds 1, 2 and 3 (Gloo on loopback), and compared with PyTorch eager
training of the same module in this process: torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_, the archive's initial weights, the same
global batches. The reference shares no code with the worker: it reads the
token file the way worker/README.md documents it (sequence i starts at token
(i * seq_len) mod the windows that fit; step s's global batch is sequences
s*G .. s*G+G-1; rank r reads the r-th contiguous slice), and the final
parameters come from the worker's own checkpoint files
(worker/checkpoint/checkpoint_files.h), reassembled from the ranks' shards.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export
"""

import importlib.util
import os
import socket
import struct
import subprocess
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import tandem  # noqa: E402

BUILD = os.environ.get("TANDEM_BUILD_DIR", os.path.join(ROOT, "build"))
WORKER = os.path.join(BUILD, "worker", "tandem-worker")

STEPS = 8
GLOBAL_BATCH = 6  # sequences per step, split over the ranks
SEQ_LEN = 32
LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-8, 0.01, 1.0
RTOL = 1e-5


def load_model(name):
    path = os.path.join(ROOT, "tests", "models", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"user_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tokens(path, vocab, count, seed=7):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (count,), generator=g)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{count}H", *tokens.tolist()))
    return tokens


def global_batch(tokens, step):
    """Sequences step*G .. step*G+G-1 of the token file, as documented."""
    windows = (len(tokens) - 1) // SEQ_LEN
    rows = []
    for i in range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH):
        first = (i % windows) * SEQ_LEN
        rows.append(tokens[first:first + SEQ_LEN + 1])
    seqs = torch.stack(rows)
    return {"input_ids": seqs[:, :-1].contiguous(),
            "labels": seqs[:, 1:].contiguous()}


def reference(module, tokens, steps=STEPS):
    """PyTorch eager: one process, the whole global batch, AdamW."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = module(**global_batch(tokens, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in module.named_parameters()}


def read_rank_checkpoint(path):
    """The worker's rank file (checkpoint_files.h): blobs by name."""
    data = open(path, "rb").read()
    assert data[:8] == b"TNDMCKPT", path
    version, _, length = struct.unpack_from("<IIQ", data, 8)
    assert version == 1
    payload = data[24:24 + length]
    off = 0
    (meta_len,) = struct.unpack_from("<I", payload, off)
    off += 4 + meta_len
    (count,) = struct.unpack_from("<I", payload, off)
    off += 4
    blobs = {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", payload, off)
        off += 4
        name = payload[off:off + n].decode()
        off += n
        (size,) = struct.unpack_from("<Q", payload, off)
        off += 8
        blobs[name] = payload[off:off + size]
        off += size
    return blobs


def final_params(ckpt_dir, world, manifest):
    """Full parameters reassembled from every rank's shards."""
    steps = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step-"))
    assert steps, f"no checkpoint in {ckpt_dir}"
    last = os.path.join(ckpt_dir, steps[-1])
    assert os.path.exists(os.path.join(last, "MANIFEST"))
    ranks = [read_rank_checkpoint(os.path.join(last, f"rank-{r}.ckpt"))
             for r in range(world)]
    out = {}
    for p in manifest.params:
        shards = [torch.frombuffer(bytearray(b[f"param/{p.name}/shard"]),
                                   dtype=torch.float32) for b in ranks]
        numel = 1
        for d in p.shape:
            numel *= d
        out[p.name] = torch.cat(shards)[:numel].view(*p.shape)
    return out


def spec_yaml(archive, tokens_path, vocab, world, ckpt_dir):
    return f"""name: exported-numerics
model:
  kind: torchscript
  path: {archive}
  vocab: {vocab}
data:
  kind: tokens
  path: {tokens_path}
  token_bytes: 2
batch:
  micro_batch: {GLOBAL_BATCH // world}
  seq_len: {SEQ_LEN}
train:
  steps: {STEPS}
  lr: {LR}
  beta1: {BETAS[0]}
  beta2: {BETAS[1]}
  eps: {EPS}
  weight_decay: {WD}
  grad_clip: {CLIP}
  seed: 1
parallel:
  world_size: {world}
  zero_stage: 3
checkpoint:
  dir: {ckpt_dir}
  every: {STEPS}
"""


def train(tmp_path, archive, tokens_path, vocab, world, schedule=None):
    ckpt = tmp_path / f"ckpt-w{world}"
    spec = tmp_path / f"spec-w{world}.yaml"
    spec.write_text(spec_yaml(archive, tokens_path, vocab, world, ckpt))
    port = free_port()
    procs = []
    for r in range(world):
        cmd = [WORKER, "--standalone", "--spec", str(spec), "--rank", str(r),
               "--world", str(world), "--rendezvous", f"127.0.0.1:{port}",
               "--threads", "1", "--timeout-s", "120"]
        if schedule:
            cmd += ["--schedule", schedule]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} failed:\n{err[-3000:]}"
    import json
    lines = [json.loads(l) for l in outs[0][0].splitlines() if l.startswith('{"step"')]
    return [l["loss"] for l in lines], str(ckpt)


def rel_err(a, b):
    """Norm-wise relative error of a tensor, ||a - b|| / ||b||. Not
    element-wise: AdamW divides each element's gradient by its own running
    RMS, so an element whose true gradient is ~0 (a LayerNorm bias's share
    that feeds the keys, which softmax ignores) takes steps made of rounding
    noise, and any two summation orders (one process against a sum over
    ranks) disagree on such elements at the scale of lr."""
    return (a - b).norm().item() / max(b.norm().item(), 1e-12)


@pytest.fixture(scope="module")
def gpt_archive(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt")
    gpt = load_model("gpt")
    module, batch = gpt.build()
    path = str(d / "gpt.tandem")
    manifest = tandem.export(module, batch, path=path)
    return gpt, path, manifest


@pytest.mark.skipif(not os.path.exists(WORKER), reason=f"no {WORKER}")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_gpt_matches_pytorch_eager(tmp_path, gpt_archive, world):
    gpt, archive, manifest = gpt_archive
    vocab = 512
    tokens_path = tmp_path / "tokens.bin"
    tokens = write_tokens(tokens_path, vocab, STEPS * GLOBAL_BATCH * SEQ_LEN + 1)

    module, _ = gpt.build()
    ref_losses, ref_params = reference(module, tokens)
    losses, ckpt = train(tmp_path, archive, str(tokens_path), vocab, world)

    assert len(losses) == STEPS
    for step, (got, want) in enumerate(zip(losses, ref_losses)):
        assert abs(got - want) <= RTOL * abs(want), (
            f"world {world} step {step}: loss {got} vs PyTorch {want}")
    got_params = final_params(ckpt, world, manifest)
    assert set(got_params) == {p.name for p in manifest.params}
    # All parameters as one vector: relative error 1e-5. Per tensor, 1e-4:
    # a tensor initialized at zero (a LayerNorm or linear bias) has a norm of
    # only a few AdamW steps, which its elements' noise-driven steps (see
    # rel_err) are measured against.
    names = sorted(got_params)
    flat_got = torch.cat([got_params[n].flatten() for n in names])
    flat_ref = torch.cat([ref_params[n].flatten() for n in names])
    total = rel_err(flat_got, flat_ref)
    worst = max((rel_err(got_params[n], ref_params[n]), n) for n in names)
    print(f"world {world}: all params {total:.2e}, worst tensor {worst[1]} {worst[0]:.2e}")
    assert total <= RTOL, f"world {world}: parameters' relative error {total:.2e}"
    assert worst[0] <= 10 * RTOL, (
        f"world {world}: {worst[1]} relative error {worst[0]:.2e}")
    # The run trained: parameters moved away from their initial values.
    init, _ = gpt.build()
    moved = dict(init.named_parameters())
    assert any(rel_err(got_params[n], moved[n].detach()) > 1e-3 for n in got_params)
