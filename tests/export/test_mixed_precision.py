"""bf16 mixed precision in the worker against an independent reference.

The job spec `model.dtype: bf16`, `train.master_dtype: f32` and
`train.reduce_dtype` (f32 or bf16; default model.dtype) ask the worker for
this policy: f32 master weights and AdamW moments; each step the params
computed with are the masters rounded to bf16; forward and backward in bf16
in Hugging Face's conventions (RMSNorm, rotary tables and the softmaxes in
f32, cast back to bf16; the logits cast to f32 for the cross-entropy); each
rank's bf16 gradients cast to reduce_dtype, summed over the ranks in
reduce_dtype and divided by the world size, then used as the f32 gradient
for clipping and AdamW.

tests/reference/hf_models.py applies the same policy to its own Llama and
Mixtral (`hf_models.train`, written from the policy, sharing nothing with
the worker): every rank's loss and bf16 gradient computed separately on its
slice of the batch, the reduction done in reduce_dtype.

test_bf16_matches_reference: the built-in `llama` and `moe` presets
(test_builtin_reference.CONFIGS) from one safetensors init (`model.init_from`),
STEPS steps at worlds 1 and 2, reduce_dtype bf16 and f32, trained by the real
`tandem-worker --standalone`; its losses and the final params `tandem
export-weights` writes are compared with the bf16-policy reference. bf16
keeps 8 bits of mantissa, so two implementations of one policy that round
at different points differ by ~2^-9 relative per op, and training amplifies
that: no fixed tolerance separates "the same policy" from "another policy".
So the test measures, in the same run, the size of the bf16 effect (the
f32 reference against the bf16 reference on the same world) and requires
the worker's gap to the bf16 reference to be a small fraction of it
(RATIO) and within absolute bounds (LOSS_ATOL, PARAM_ATOL); the gap to the
f32 reference must then be most of the effect: the worker rounds, and
rounds where the policy says.

test_bf16_loss_curve: the same llama job, STEPS_CURVE steps, in f32 and in
bf16 (both worker runs) on tokens the model can learn (a Markov chain where
each token has two successors: the loss falls from ln 256 = 5.5 toward ln 2
= 0.69); every step's bf16 loss within CURVE_RTOL of the f32 loss, and the
two runs not identical.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q -s tests/export/test_mixed_precision.py
"""

import os
import pathlib
import struct
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reference"))
import hf_models  # noqa: E402
import test_builtin_reference as builtin  # noqa: E402
import test_exported_numerics as numerics  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                reason=f"no {numerics.WORKER}")

STEPS = numerics.STEPS
STEPS_CURVE = 50
ADAMW = dict(lr=numerics.LR, betas=numerics.BETAS, eps=numerics.EPS,
             weight_decay=numerics.WD)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

# Tolerances (see the module docstring; calibrated in the test's output).
RATIO = 0.25        # worker-vs-bf16-reference gap / bf16-vs-f32 gap, at most
LOSS_ATOL = 2e-4    # |worker - bf16 reference| loss, every step
PARAM_ATOL = 0.01   # ||worker - bf16 reference|| / ||f32 reference's update||
CURVE_RTOL = 0.01   # bf16 loss vs f32 loss, every step of the curve


def job_yaml(preset, init_from, tokens_path, world, ckpt_dir, dtype,
             reduce_dtype=None, steps=STEPS):
    """test_builtin_reference's builtin job with `model.dtype` and, for
    bf16, `train.master_dtype: f32` and `train.reduce_dtype` (None: left
    out, the default model.dtype)."""
    c = builtin.CONFIGS[preset]
    moe = (f"  experts: {c.experts}\n  top_k: {c.top_k}\n"
           if c.experts else "")
    model = (f"  preset: {preset}\n  layers: {c.layers}\n"
             f"  d_model: {c.d_model}\n  heads: {c.heads}\n"
             f"  kv_heads: {c.kv_heads}\n  ffn: {c.ffn}\n"
             f"  vocab: {c.vocab}\n{moe}  init_from: {init_from}\n"
             f"  dtype: {dtype}\n")
    train = {"steps": steps, "lr": numerics.LR}
    if dtype != "f32":
        train["master_dtype"] = "f32"
        if reduce_dtype:
            train["reduce_dtype"] = reduce_dtype
    data = f"  kind: tokens\n  path: {tokens_path}\n  token_bytes: 2\n"
    return numerics.job_yaml(None, world, ckpt_dir, model, data,
                             f"  seq_len: {numerics.SEQ_LEN}\n",
                             train=train, every=steps)


def worker_run(tmp_path, preset, init_path, tokens_path, world, dtype,
               reduce_dtype=None, steps=STEPS, tag=""):
    """(losses, checkpoint dir) of the standalone workers."""
    return numerics.train(
        tmp_path, None, None, None, world, tag=f"-{preset}-{dtype}{tag}",
        spec_text=lambda ckpt: job_yaml(preset, init_path, tokens_path,
                                        world, ckpt, dtype, reduce_dtype,
                                        steps))


def reference_run(preset, init, tokens, world, dtype, reduce_dtype=None,
                  steps=STEPS):
    """(losses, final f32 masters) of hf_models.train under the policy."""
    model = hf_models.CausalLM(builtin.CONFIGS[preset])
    model.load_state_dict(init)
    return hf_models.train(
        model, lambda step: numerics.global_batch(tokens, step), steps,
        ADAMW, numerics.CLIP, world=world, dtype=DTYPES[dtype],
        reduce_dtype=DTYPES[reduce_dtype or dtype])


def flat(params, names):
    return torch.cat([params[n].float().flatten() for n in names])


def loss_gap(a, b):
    """The largest absolute difference of two loss curves."""
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def param_gap(a, b, names, scale):
    """||a - b|| over every param as one vector, over `scale`."""
    return (flat(a, names) - flat(b, names)).norm().item() / scale


@pytest.mark.parametrize("preset,world,reduce_dtype", [
    ("llama", 1, None), ("llama", 2, "bf16"), ("llama", 2, "f32"),
    ("moe", 1, None), ("moe", 2, None)])
def test_bf16_matches_reference(tmp_path, preset, world, reduce_dtype):
    """bf16 compute, f32 masters, gradients reduced in reduce_dtype: the
    worker's losses and exported params against the bf16-policy reference,
    the gap a small fraction of the bf16 effect (the f32 reference against
    the bf16 one)."""
    what = f"{preset} world {world} reduce {reduce_dtype or 'default'}"
    tokens_path, tokens = builtin.tokens_file(tmp_path,
                                              builtin.CONFIGS[preset].vocab)
    _, init, init_path = builtin.initial_weights(tmp_path, preset)
    f32_losses, f32_params = reference_run(preset, init, tokens, world, "f32")
    ref_losses, ref_params = reference_run(preset, init, tokens, world,
                                           "bf16", reduce_dtype)

    losses, ckpt = worker_run(tmp_path, preset, init_path, tokens_path,
                              world, "bf16", reduce_dtype)
    got, meta = builtin.export_weights(ckpt, tmp_path / "out.safetensors")
    assert meta["tandem.step"] == str(STEPS)
    assert len(losses) == STEPS, f"{what}: {len(losses)} steps reported"
    assert sorted(got) == sorted(ref_params), f"{what}: names differ"
    names = sorted(ref_params)
    for n in names:
        assert tuple(got[n].shape) == tuple(ref_params[n].shape), n
    # The masters are f32; were the export bf16, the masters' rounding is
    # what it would hold.
    if any(got[n].dtype != torch.float32 for n in names):
        ref_params = {n: ref_params[n].to(got[n].dtype) for n in names}
        f32_params = {n: f32_params[n].to(got[n].dtype) for n in names}

    # Gaps in params are measured against the size of the training update
    # (the f32 reference's final params minus the init): the init, common
    # to all runs, would otherwise dilute them.
    scale = (flat(f32_params, names) - flat(init, names)).norm().item()
    effect_loss = loss_gap(ref_losses, f32_losses)
    effect_param = param_gap(ref_params, f32_params, names, scale)
    gap_loss = loss_gap(losses, ref_losses)
    gap_param = param_gap(got, ref_params, names, scale)
    to_f32_loss = loss_gap(losses, f32_losses)
    to_f32_param = param_gap(got, f32_params, names, scale)
    steps = [abs(a - b) for a, b in zip(losses, ref_losses)]
    per_tensor = sorted(
        ((got[n].float() - ref_params[n].float()).norm().item() /
         max((f32_params[n].float() - init[n]).norm().item(), 1e-12), n)
        for n in names)
    print(f"\n{what}: bf16 effect (bf16 ref - f32 ref): loss {effect_loss:.2e}"
          f", params {effect_param:.2e} of the update\n"
          f"  worker - bf16 ref: loss {gap_loss:.2e} "
          f"({gap_loss / effect_loss:.3f} of the effect), params "
          f"{gap_param:.2e} ({gap_param / effect_param:.3f})\n"
          f"  worker - f32 ref: loss {to_f32_loss:.2e}, params "
          f"{to_f32_param:.2e}\n"
          f"  per-step loss gaps {['%.1e' % g for g in steps]}\n"
          f"  worst tensors (gap / its update) "
          f"{[(n, '%.2e' % g) for g, n in per_tensor[-3:]]}")

    for step, g in enumerate(steps):
        assert g <= LOSS_ATOL, (
            f"{what} step {step}: loss {losses[step]} vs the bf16 "
            f"reference's {ref_losses[step]} (f32 reference "
            f"{f32_losses[step]})")
    assert gap_loss <= RATIO * effect_loss, (
        f"{what}: the worker's losses are {gap_loss:.2e} from the bf16 "
        f"reference's, {gap_loss / effect_loss:.2f} of the bf16 effect "
        f"{effect_loss:.2e}; per step {steps}")
    assert gap_param <= PARAM_ATOL, (
        f"{what}: params {gap_param:.2e} of the update from the bf16 "
        f"reference's; worst tensors {per_tensor[-3:]}")
    assert gap_param <= RATIO * effect_param, (
        f"{what}: params {gap_param:.2e} from the bf16 reference's, "
        f"{gap_param / effect_param:.2f} of the bf16 effect "
        f"{effect_param:.2e}; worst tensors {per_tensor[-3:]}")
    # Not an f32 run: far from the f32 reference, beyond the f32 tests'
    # tolerance (numerics.RTOL) by orders of magnitude.
    assert to_f32_param >= (1 - RATIO) * effect_param > 100 * numerics.RTOL


def markov_tokens(path, count, vocab=256, successors=2, seed=3):
    """A token file the model can learn: token t is followed by one of
    `successors` tokens drawn for t, picked at random (the loss's floor is
    ln successors)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, vocab, (vocab, successors), generator=g)
    picks = torch.randint(0, successors, (count,), generator=g).tolist()
    tokens, t = [], 0
    for p in picks:
        tokens.append(t)
        t = table[t, p].item()
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{count}H", *tokens))
    return torch.tensor(tokens)


def test_bf16_loss_curve(tmp_path):
    """STEPS_CURVE steps of llama in f32 and in bf16 on learnable tokens:
    the loss falls, and every step's bf16 loss is within CURVE_RTOL of the
    f32 loss."""
    tokens_path = tmp_path / "markov.bin"
    count = STEPS_CURVE * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1
    tokens = markov_tokens(tokens_path, count)
    _, init, init_path = builtin.initial_weights(tmp_path, "llama")
    f32, _ = worker_run(tmp_path, "llama", init_path, tokens_path, 1, "f32",
                        steps=STEPS_CURVE)
    bf16, _ = worker_run(tmp_path, "llama", init_path, tokens_path, 1,
                         "bf16", steps=STEPS_CURVE)
    ref_f32, _ = reference_run("llama", init, tokens, 1, "f32",
                               steps=STEPS_CURVE)
    ref_bf16, _ = reference_run("llama", init, tokens, 1, "bf16",
                                steps=STEPS_CURVE)
    assert len(f32) == len(bf16) == STEPS_CURVE
    rel = [abs(b - a) / abs(a) for a, b in zip(f32, bf16)]
    worst = max(range(STEPS_CURVE), key=lambda s: rel[s])
    ref_rel = max(abs(b - a) / abs(a) for a, b in zip(ref_f32, ref_bf16))
    print(f"\nloss curve: f32 {f32[0]:.3f} -> {f32[-1]:.3f}, bf16 "
          f"{bf16[0]:.3f} -> {bf16[-1]:.3f}; worst relative gap "
          f"{rel[worst]:.2e} at step {worst} (the references': {ref_rel:.2e})"
          f"; worker bf16 vs reference bf16 {loss_gap(bf16, ref_bf16):.2e}")
    assert f32[-1] < 0.5 * f32[0], f"the loss did not fall: {f32}"
    assert bf16 != f32, "the bf16 run is the f32 run: bf16 ignored"
    for step in range(STEPS_CURVE):
        assert rel[step] <= CURVE_RTOL, (
            f"step {step}: bf16 loss {bf16[step]} vs f32 {f32[step]}")
