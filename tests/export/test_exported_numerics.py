"""Exported models train as PyTorch eager trains them (issue 12).

A user's unmodified nn.Module (tests/models/) is exported with
`tandem.export`, trained by the real `tandem-worker --standalone` processes
at worlds 1, 2 and 3 (Gloo on loopback), and compared with PyTorch eager
training of the same module in this process: torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_, the archive's initial weights, the same
global batches. The models: a GPT in plain torch.nn (tied embeddings), a
language model built from nn.TransformerEncoder (its layers are leaf units)
and torchvision's VisionTransformer (its EncoderBlocks are leaf units; the
images and labels come from the `tensors` data source). Every model has
dropout 0: the worker and PyTorch draw different random numbers, so only a
deterministic forward can match to 1e-5.

The reference shares no code with the worker: it reads the data the way
worker/README.md documents it. Tokens: sequence i starts at token
(i * seq_len) mod the windows that fit. Tensors: sample i is row i mod N of
every array. Step s's global batch is sequences (samples) s*G .. s*G+G-1,
and rank r reads the r-th contiguous slice of each micro-batch. The final
parameters come from the worker's own checkpoint files
(worker/checkpoint/checkpoint_files.h), reassembled from the ranks' shards.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export
"""

import importlib.util
import json
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


def tensors_global_batch(arrays, step, global_size=GLOBAL_BATCH):
    """Samples step*G .. step*G+G-1 of a `tensors` file's arrays, wrapping
    at the end of the file, as documented."""
    n = len(next(iter(arrays.values())))
    rows = torch.tensor([i % n for i in range(step * global_size,
                                              (step + 1) * global_size)])
    return {name: a[rows] for name, a in arrays.items()}


def reference(module, tokens, steps=STEPS, batch_of=global_batch, ranks=1):
    """PyTorch eager: one process, the whole global batch, AdamW.
    batch_of(tokens, step) is the step's global batch (default: sequences
    of the token file; tensors_global_batch for a `tensors` file).
    ranks > 1: as data parallelism computes it, each step's global batch
    cut into `ranks` contiguous slices, the module run on each slice alone
    and the mean of their losses back-propagated. For a module whose forward
    depends on the whole batch (BatchNorm's batch statistics) that is what
    DDP and FSDP train; for any other it is the same up to fp32 rounding."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        batch = batch_of(tokens, step)
        per = GLOBAL_BATCH // ranks
        total = 0.0
        for r in range(ranks):
            part = batch if ranks == 1 else {
                n: t[r * per:(r + 1) * per] for n, t in batch.items()}
            loss = module(**part) / ranks
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        losses.append(total)
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
    return {p.name: full_blob(ranks, p.name, "shard", list(p.shape))
            for p in manifest.params}


def full_blob(ranks, name, what, shape):
    """Param `name`'s blob `what` ("shard", "exp_avg", "exp_avg_sq") put
    back together from every rank's (read_rank_checkpoint), in rank order,
    the last rank's padding dropped, shaped `shape`."""
    shards = [torch.frombuffer(bytearray(b[f"param/{name}/{what}"]),
                               dtype=torch.float32) for b in ranks]
    numel = 1
    for d in shape:
        numel *= d
    return torch.cat(shards)[:numel].view(*shape)


def job_yaml(archive, world, ckpt_dir, model_extra, data, batch_extra,
             grad_accum=1, train=None, every=STEPS, micro_batch=None,
             clip=CLIP):
    """The job spec the numerics tests train: the archive (None: a builtin
    model, all in `model_extra`), `data` (the section's lines), and the
    optimizer and batch every reference uses (`micro_batch` sequences per
    rank; default: the global batch split over the ranks). `train`: the
    train keys before the optimizer's (default: STEPS steps at LR);
    `every`: the checkpoint interval; `clip`: train.grad_clip."""
    train = train or {"steps": STEPS, "lr": LR}
    keys = "".join(f"  {k}: {v}\n" for k, v in train.items())
    model = (f"  kind: torchscript\n  path: {archive}\n" if archive
             else "  kind: builtin\n")
    micro_batch = micro_batch or GLOBAL_BATCH // (world * grad_accum)
    return f"""name: exported-numerics
model:
{model}{model_extra}data:
{data}batch:
  micro_batch: {micro_batch}
  grad_accum: {grad_accum}
{batch_extra}train:
{keys}  beta1: {BETAS[0]}
  beta2: {BETAS[1]}
  eps: {EPS}
  weight_decay: {WD}
  grad_clip: {clip}
  seed: 1
parallel:
  world_size: {world}
  zero_stage: 3
checkpoint:
  dir: {ckpt_dir}
  every: {every}
"""


def spec_yaml(archive, tokens_path, vocab, world, ckpt_dir, **extra):
    """A job spec for a language model fed by a token file (`extra`:
    job_yaml's train and every)."""
    return job_yaml(archive, world, ckpt_dir, f"  vocab: {vocab}\n",
                    f"  kind: tokens\n  path: {tokens_path}\n  token_bytes: 2\n",
                    f"  seq_len: {SEQ_LEN}\n", **extra)


def tensors_spec_yaml(archive, data_path, world, ckpt_dir, grad_accum=1):
    """A job spec for an archive fed by a `tensors` file."""
    return job_yaml(archive, world, ckpt_dir, "",
                    f"  kind: tensors\n  path: {data_path}\n", "", grad_accum)


def run_standalone(spec_path, world, schedule=None, timeout_s=120, extra=()):
    """Runs `world` standalone workers on spec_path; returns every rank's
    (returncode, stdout, stderr). `extra`: more worker flags, "{rank}" in
    them replaced by the rank (e.g. "--profile-out", "p.{rank}")."""
    port = free_port()
    procs = []
    for r in range(world):
        cmd = [WORKER, "--standalone", "--spec", str(spec_path), "--rank",
               str(r), "--world", str(world), "--rendezvous",
               f"127.0.0.1:{port}", "--threads", "1", "--timeout-s",
               str(timeout_s)]
        if schedule:
            cmd += ["--schedule", schedule]
        cmd += [a.format(rank=r) for a in extra]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def train(tmp_path, archive, tokens_path, vocab, world, schedule=None,
          spec_text=None, tag=""):
    """Trains the archive at `world`; returns (rank 0's losses, checkpoint
    dir). The spec is spec_yaml's (the token file) unless spec_text(ckpt)
    gives another."""
    ckpt = tmp_path / f"ckpt-w{world}{tag}"
    spec = tmp_path / f"spec-w{world}{tag}.yaml"
    spec.write_text(spec_text(ckpt) if spec_text else
                    spec_yaml(archive, tokens_path, vocab, world, ckpt))
    runs = run_standalone(spec, world, schedule)
    for r, (rc, _, err) in enumerate(runs):
        assert rc == 0, f"rank {r} failed:\n{err[-3000:]}"
    lines = [json.loads(l) for l in runs[0][1].splitlines()
             if l.startswith('{"step"')]
    return [l["loss"] for l in lines], str(ckpt)


def rel_err(a, b):
    """Norm-wise relative error of a tensor, ||a - b|| / ||b||. Not
    element-wise: AdamW divides each element's gradient by its own running
    RMS, so an element whose true gradient is ~0 (a LayerNorm bias's share
    that feeds the keys, which softmax ignores) takes steps made of rounding
    noise, and any two summation orders (one process against a sum over
    ranks) disagree on such elements at the scale of lr."""
    return (a - b).norm().item() / max(b.norm().item(), 1e-12)


def key_biases(module):
    """{param name: the elements of it whose true gradient is exactly zero}:
    the key third of every nn.MultiheadAttention's in_proj_bias (softmax
    ignores a constant shift of a query's scores)."""
    out = {}
    for path, m in module.named_modules():
        if (isinstance(m, torch.nn.MultiheadAttention) and
                isinstance(m.in_proj_bias, torch.nn.Parameter)):
            d = m.embed_dim
            out[f"{path}.in_proj_bias"] = slice(d, 2 * d)
    return out


def split_noise(params, noise):
    """(params with the `noise` elements taken out, those elements)."""
    kept, taken = dict(params), {}
    for n, sl in noise.items():
        t = params[n]
        taken[n] = t[sl]
        kept[n] = torch.cat([t[:sl.start], t[sl.stop:]])
    return kept, taken


def check_matches(what, losses, ref_losses, got_params, ref_params,
                  init_params, manifest, noise=None, steps=STEPS,
                  unchecked=None):
    """Losses step by step within RTOL of PyTorch's; all parameters as one
    vector within RTOL, each tensor within 10 * RTOL; and the run trained.
    `noise` ({param: slice}, key_biases) names elements whose true gradient
    is exactly zero: AdamW divides their rounding noise by its own RMS and
    steps them by up to lr each step, in directions no two summation orders
    agree on. They are checked to have stayed small instead: an element with
    a real gradient moves by about lr per step (AdamW normalizes its step),
    while noise far below eps = 1e-8 moves it by a fraction of that."""
    assert len(losses) == steps, f"{what}: {len(losses)} steps reported"
    for step, (got, want) in enumerate(zip(losses, ref_losses)):
        assert abs(got - want) <= RTOL * abs(want), (
            f"{what} step {step}: loss {got} vs PyTorch {want}")
    assert set(got_params) == {p.name for p in manifest.params}
    if unchecked:
        # Elements whose true gradient is exactly zero but whose rounding
        # noise is large enough for AdamW to step them by about lr (a bias
        # that a BatchNorm after it removes): not compared at all.
        got_params, _ = split_noise(got_params, unchecked)
        ref_params, _ = split_noise(ref_params, unchecked)
        init_params, _ = split_noise(
            {n: p.detach() for n, p in init_params.items()}, unchecked)
    if noise:
        init_params = {n: p.detach() for n, p in init_params.items()}
        got_params, got_noise = split_noise(got_params, noise)
        ref_params, ref_noise = split_noise(ref_params, noise)
        init_params, init_noise = split_noise(init_params, noise)
        for n in noise:
            for which, t in (("worker", got_noise[n]), ("PyTorch", ref_noise[n])):
                drift = (t - init_noise[n]).abs().max().item()
                assert drift <= 0.25 * steps * LR, (
                    f"{what}: {which}'s {n}[{noise[n].start}:{noise[n].stop}] "
                    f"moved {drift:.3g}, a quarter of {steps} AdamW steps of "
                    f"lr {LR} or more: its gradient was not zero")
    # All parameters as one vector: relative error 1e-5. Per tensor, 1e-4:
    # a tensor initialized at zero (a LayerNorm or linear bias) has a norm of
    # only a few AdamW steps, which its elements' noise-driven steps (see
    # rel_err) are measured against.
    names = sorted(got_params)
    flat_got = torch.cat([got_params[n].flatten() for n in names])
    flat_ref = torch.cat([ref_params[n].flatten() for n in names])
    total = rel_err(flat_got, flat_ref)
    worst = max((rel_err(got_params[n], ref_params[n]), n) for n in names)
    print(f"{what}: all params {total:.2e}, worst tensor {worst[1]} "
          f"{worst[0]:.2e}")
    assert total <= RTOL, f"{what}: parameters' relative error {total:.2e}"
    assert worst[0] <= 10 * RTOL, (
        f"{what}: {worst[1]} relative error {worst[0]:.2e}")
    # The run trained: every parameter moved away from its initial value.
    still = [n for n in names if got_params[n].numel() > 0 and
             torch.equal(got_params[n], init_params[n].detach())]
    assert not still, f"{what}: parameters did not train: {still[:5]}"


def assert_no_dropout(module):
    """Exact numerics need dropout 0: the worker's random numbers are not
    PyTorch's."""
    for path, m in module.named_modules():
        p = m.p if isinstance(m, torch.nn.Dropout) else \
            m.dropout if isinstance(m, torch.nn.MultiheadAttention) else 0
        assert p == 0, f"{path or '<root>'} has dropout {p}; set it to 0"


def export_model(tmp_path_factory, name, build="build"):
    """(the model's file as a module, archive path, manifest) of the model
    tests/models/<name>.py's `build` function returns."""
    d = tmp_path_factory.mktemp(name)
    mod = load_model(name)
    module, batch = getattr(mod, build)()
    path = str(d / f"{name}.tandem")
    manifest = tandem.export(module, batch, path=path)
    return mod, path, manifest


@pytest.fixture(scope="module")
def gpt_archive(tmp_path_factory):
    return export_model(tmp_path_factory, "gpt")


@pytest.fixture(scope="module")
def encoder_lm_archive(tmp_path_factory):
    return export_model(tmp_path_factory, "encoder_lm")


def check_token_model(tmp_path, model_archive, world, vocab=512):
    mod, archive, manifest = model_archive
    tokens_path = tmp_path / "tokens.bin"
    tokens = write_tokens(tokens_path, vocab, STEPS * GLOBAL_BATCH * SEQ_LEN + 1)

    module, _ = mod.build()
    ref_losses, ref_params = reference(module, tokens)
    losses, ckpt = train(tmp_path, archive, str(tokens_path), vocab, world)
    init, _ = mod.build()
    # nn.MultiheadAttention's key biases (the encoder LM's) get an exact-zero
    # gradient: checked for staying small, not for equality (check_matches).
    check_matches(f"{manifest.name} world {world}", losses, ref_losses,
                  final_params(ckpt, world, manifest), ref_params,
                  dict(init.named_parameters()), manifest,
                  noise=key_biases(init))


@pytest.mark.skipif(not os.path.exists(WORKER), reason=f"no {WORKER}")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_gpt_matches_pytorch_eager(tmp_path, gpt_archive, world):
    check_token_model(tmp_path, gpt_archive, world)


@pytest.mark.skipif(not os.path.exists(WORKER), reason=f"no {WORKER}")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_encoder_lm_matches_pytorch_eager(tmp_path, encoder_lm_archive, world):
    """nn.TransformerEncoder's layers run as leaf units (scripted whole, their
    params bound as the module's attributes); the causal mask made in the
    embed unit is read by both. Dropout is 0 (encoder_lm.py)."""
    mod, _, manifest = encoder_lm_archive
    assert [u.leaf for u in manifest.units] == [False, True, True, False]
    assert_no_dropout(mod.build()[0])
    check_token_model(tmp_path, encoder_lm_archive, world)


# ------------------------------------------------------ the `tensors` source

VIT_SAMPLES = 40  # not a multiple of GLOBAL_BATCH: step 6 wraps


def write_vit_tensors(path, samples=VIT_SAMPLES, seed=11):
    """Images float32 [N, 3, 16, 16] and labels int64 [N], written with
    tandem.export's safetensors writer; returns them."""
    g = torch.Generator().manual_seed(seed)
    arrays = {"images": torch.randn(samples, 3, 16, 16, generator=g),
              "labels": torch.randint(0, 10, (samples,), generator=g)}
    with open(path, "wb") as f:
        tandem.export.write_safetensors(list(arrays.items()), f)
    return arrays


@pytest.fixture(scope="module")
def vit_archive(tmp_path_factory):
    return export_model(tmp_path_factory, "vit")


@pytest.mark.skipif(not os.path.exists(WORKER), reason=f"no {WORKER}")
@pytest.mark.parametrize("world,grad_accum", [(1, 1), (2, 1), (3, 1), (2, 3)])
def test_vit_matches_pytorch_eager(tmp_path, vit_archive, world, grad_accum):
    """torchvision's VisionTransformer: the class token and the position
    embedding (params read directly in forward) in the embed unit, each
    EncoderBlock (nn.MultiheadAttention inside) a leaf unit. Images and labels
    come from a `tensors` file, wrapping at its end. Dropout is 0
    (torchvision's default)."""
    mod, archive, manifest = vit_archive
    assert [(i.name, list(i.dynamic_dims)) for i in manifest.inputs] == [
        ("images", [0]), ("labels", [0])]
    data = tmp_path / "vit.safetensors"
    arrays = write_vit_tensors(data)

    module, _ = mod.build()
    assert_no_dropout(module)
    ref_losses, ref_params = reference(module, arrays,
                                       batch_of=tensors_global_batch)
    losses, ckpt = train(
        tmp_path, archive, None, None, world, tag=f"-a{grad_accum}",
        spec_text=lambda ckpt: tensors_spec_yaml(archive, data, world, ckpt,
                                                 grad_accum))
    init, _ = mod.build()
    check_matches(f"ViT world {world} grad_accum {grad_accum}", losses,
                  ref_losses, final_params(ckpt, world, manifest), ref_params,
                  dict(init.named_parameters()), manifest,
                  noise=key_biases(init))


# ---------------------------------------------------- the `synthetic` source

SYNTHETIC_SEED = 3


@pytest.mark.skipif(not os.path.exists(WORKER), reason=f"no {WORKER}")
@pytest.mark.parametrize("world,grad_accum", [(1, 1), (3, 2)])
def test_vit_synthetic_inputs_match_pytorch_eager(tmp_path, world,
                                                  grad_accum):
    """`data.kind: synthetic` for a model with named inputs: the worker draws
    images and labels from the archive's description (the example batch's
    mean and std, labels 0..9 from input_ranges), and PyTorch eager trains
    on the batches tandem.synthetic rebuilds from the seed, as documented."""
    import tandem.synthetic

    mod = load_model("vit")
    module, batch = mod.build()
    archive = str(tmp_path / "vit.tandem")
    manifest = tandem.export(module, batch, path=archive,
                             input_ranges={"labels": (0, 9)})
    images, labels = manifest.inputs
    assert (labels.synthetic.low, labels.synthetic.high) == (0, 9)
    assert images.synthetic.std == pytest.approx(
        batch["images"].double().std(unbiased=False).item())

    def batch_of(_, step):
        return tandem.synthetic.global_batch(manifest, SYNTHETIC_SEED, step,
                                             GLOBAL_BATCH, seq_len=0)

    first = batch_of(None, 0)
    assert first["images"].shape == (GLOBAL_BATCH, 3, 16, 16)
    assert first["images"].dtype == torch.float32
    assert set(first["labels"].tolist()) <= set(range(10))

    module, _ = mod.build()
    ref_losses, ref_params = reference(module, None, batch_of=batch_of)
    losses, ckpt = train(
        tmp_path, archive, None, None, world, tag=f"-syn{grad_accum}",
        spec_text=lambda ckpt: job_yaml(
            archive, world, ckpt, "",
            f"  kind: synthetic\n  seed: {SYNTHETIC_SEED}\n", "", grad_accum))
    init, _ = mod.build()
    check_matches(f"ViT synthetic world {world} grad_accum {grad_accum}",
                  losses, ref_losses, final_params(ckpt, world, manifest),
                  ref_params, dict(init.named_parameters()), manifest,
                  noise=key_biases(init))
