"""bf16 mixed precision for exported models (issue 13, item 2, "these apply
to exported models alike").

`model.dtype: bf16` on an archive runs the user's module as
`module.to(torch.bfloat16)` would (worker/README.md, "Mixed precision"):
the params gathered in bf16 from f32 masters (AdamW's moments f32 too),
float buffers and float batch inputs cast to bf16, the module's own code
deciding everything else (the GPT of tests/models/gpt.py computes its
cross-entropy, and so its loss, in bf16); gradients reduced in
`train.reduce_dtype`. This is PyTorch FSDP's MixedPrecision(param_dtype=
bf16) policy with buffers cast as `.to()` casts them.

The reference, sharing no code with the worker: tests/reference/
hf_models.train, the f32-master policy written out (each rank's loss and
bf16 gradients computed separately on its slice, cast to reduce_dtype,
summed in rank order, divided by the world size, AdamW on the f32 masters),
run on the user's module itself; float inputs cast to bf16 by batch_of.

Tolerances follow tests/export/test_mixed_precision.py (its docstring says
why a bf16 run cannot be held to a fixed tolerance): every gap is measured
in units of the bf16 effect, the distance between the f32 and the bf16
reference in the same run. What differs here is the loss: the GPT's is a
bf16 value (a mean cross-entropy rounded to 8 bits: near 6.2 its values
are 2^-5 = 0.031 apart), so a step's loss is compared in bf16 ulps, not in
absolute terms. The bounds are test_mixed_precision's, which a faithful
implementation summing in another order meets; measured on this worker
(figures printed with -s), the worker and the reference run the same ops
on the same values and agree far closer:

  - the first gradient (a 1-step job, clipping off, from the checkpoint's
    exp_avg) within FIRST_RATIO = 1/2 of the bf16 effect of the bf16
    reference's; measured 1.5e-6 to 3.9e-6 (the f32 rounding of exp_avg /
    (1 - beta1)) at worlds 1-3; at reduce_dtype bf16 every element a bf16
    value, at f32 and world > 1 many not;
  - every step's loss within LOSS_ULPS = 1 bf16 ulp of the reference's
    (measured: equal at every step);
  - after STEPS steps the params within TRAJECTORY_RATIO = 1.25 of the
    effect (measured 0 to 4e-6), few of them bf16 values (f32 masters);
  - test_vit_bf16_matches_reference: the ViT's float images come from a
    `tensors` file and are cast to bf16 before the first unit (conv_proj's
    bf16 weight refuses f32 images);
  - test_gpt_bf16_loss_curve: 50 steps on learnable tokens, every bf16
    loss within 1% of the f32 run's (measured 0.12%).
  - test_gpt_bf16_predicted_peak_within_10_percent: the planned bf16
    job's predicted peak against its counted one, every step;
  - test_gpt_bf16_with_activation_checkpointing_equals_without: both
    features at once, bit for bit the run without checkpointing, at a
    lower peak (measured 2746676 B against 3145268 B).

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q -s \
        tests/export/test_exported_mixed_precision.py
"""

import json
import os
import re
import subprocess
import pathlib
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reference"))
import hf_models  # noqa: E402
import test_exported_numerics as numerics  # noqa: E402
import test_mixed_precision as mp  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                reason=f"no {numerics.WORKER}")

STEPS = numerics.STEPS
STEPS_CURVE = mp.STEPS_CURVE
VOCAB = 512
# test_mixed_precision's bounds (the module docstring).
FIRST_RATIO = mp.FIRST_RATIO
TRAJECTORY_RATIO = mp.TRAJECTORY_RATIO
CURVE_RTOL = mp.CURVE_RTOL
LOSS_ULPS = 1
CURVE_LR = 1e-3


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    return numerics.export_model(tmp_path_factory, "gpt")


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    return numerics.export_model(tmp_path_factory, "vit")


def cast_inputs(batch, dtype):
    return {k: v.to(dtype) if v.is_floating_point() else v
            for k, v in batch.items()}


def worker_run(tmp_path, archive, data, world, dtype, reduce_dtype=None,
               steps=STEPS, clip=numerics.CLIP, tag="", lr=numerics.LR):
    """(losses, checkpoint dir) of the standalone workers training the
    archive on `data` (a token file path, or {"tensors": path})."""
    train = {"steps": steps, "lr": lr}
    if dtype != "f32":
        train["master_dtype"] = "f32"
        if reduce_dtype:
            train["reduce_dtype"] = reduce_dtype

    def spec(ckpt):
        if isinstance(data, dict):
            model, batch = "", ""
            source = f"  kind: tensors\n  path: {data['tensors']}\n"
        else:
            model = f"  vocab: {VOCAB}\n"
            source = f"  kind: tokens\n  path: {data}\n  token_bytes: 2\n"
            batch = f"  seq_len: {numerics.SEQ_LEN}\n"
        return numerics.job_yaml(archive, world, ckpt,
                                 model + f"  dtype: {dtype}\n", source, batch,
                                 train=train, every=steps, clip=clip)

    return numerics.train(tmp_path, archive, None, None, world,
                          tag=f"-{dtype}-{reduce_dtype}-{steps}{tag}",
                          spec_text=spec)


def reference_run(build, batch_of, world, dtype, reduce_dtype=None,
                  steps=STEPS, clip=numerics.CLIP, grads=None,
                  lr=numerics.LR):
    """(losses, final f32 masters) of hf_models.train on the user's module
    under the policy; float inputs cast to the compute dtype."""
    module, _ = build()
    compute = mp.DTYPES[dtype]
    return hf_models.train(
        module, lambda step: cast_inputs(batch_of(step), compute), steps,
        dict(mp.ADAMW, lr=lr), clip, world=world, dtype=compute,
        reduce_dtype=mp.DTYPES[reduce_dtype or dtype], grads=grads)


def bf16_ulp(x):
    """The distance between bf16 values at |x|."""
    return 2.0 ** (torch.tensor(abs(x)).log2().floor().item() - 7)


def check(what, tmp_path, build, archive, manifest, data, batch_of, world,
          reduce_dtype):
    """The module docstring's three checks; prints the figures."""
    # 1. The first gradient and the step-0 loss.
    losses, ckpt = worker_run(tmp_path, archive, data, world, "bf16",
                              reduce_dtype, steps=1, clip=mp.NO_CLIP,
                              tag="-first")
    got = mp.first_gradient(ckpt)
    refs = {}
    for dtype, rd in (("f32", None), ("bf16", reduce_dtype)):
        grads = []
        ref_losses, _ = reference_run(build, batch_of, world, dtype, rd,
                                      steps=1, clip=mp.NO_CLIP, grads=grads)
        refs[dtype] = ref_losses[0], grads[0]
    (f32_loss, f32_grad), (ref_loss, ref_grad) = refs["f32"], refs["bf16"]
    names = sorted(ref_grad)
    assert sorted(got) == names, f"{what}: names differ"
    effect = mp.gap(ref_grad, f32_grad, names)
    first = mp.gap(got, ref_grad, names) / effect
    loss_ulps = abs(losses[0] - ref_loss) / bf16_ulp(ref_loss)
    print(f"\n{what}: first gradient {first:.2e} of the bf16 effect from "
          f"the bf16 reference ({mp.gap(got, f32_grad, names) / effect:.3f} "
          f"from the f32 one); step-0 loss {losses[0]:.6f}, bf16 ref "
          f"{ref_loss:.6f} ({loss_ulps:.2f} ulp), f32 ref {f32_loss:.6f}")
    assert first <= FIRST_RATIO, (
        f"{what}: the first gradient is {first:.2f} of the bf16 effect from "
        f"the bf16 reference's (at most {FIRST_RATIO})")
    assert mp.gap(got, f32_grad, names) >= (1 - FIRST_RATIO) * effect > 0, (
        f"{what}: the gradient is the f32 one: did the units run in f32?")
    off, ref_off = mp.not_bf16(mp.flat(got, names)), mp.not_bf16(
        mp.flat(ref_grad, names))
    if (reduce_dtype or "bf16") == "bf16":
        bad = {n: mp.not_bf16(got[n]) for n in names if mp.not_bf16(got[n])}
        assert not bad, f"{what}: gradients reduced in bf16 have non-bf16 " \
                        f"values: {bad}"
    elif world > 1:
        # Summed in f32, the ranks' bf16 gradients leave bf16's grid.
        assert ref_off > 0.05 and off > 0.5 * ref_off, (
            f"{what}: reduced in f32, yet only {off:.2e} of the gradient's "
            f"elements are not bf16 values (the reference's {ref_off:.2e})")
    assert loss_ulps <= LOSS_ULPS, (
        f"{what}: step-0 loss {losses[0]} vs the bf16 reference's {ref_loss}")

    # 2. STEPS steps: losses and params.
    f32_losses, f32_params = reference_run(build, batch_of, world, "f32")
    ref_losses, ref_params = reference_run(build, batch_of, world, "bf16",
                                           reduce_dtype)
    losses, ckpt = worker_run(tmp_path, archive, data, world, "bf16",
                              reduce_dtype)
    assert len(losses) == STEPS
    module, _ = build()
    init = {n: p.detach() for n, p in module.named_parameters()}
    params = numerics.final_params(ckpt, world, manifest)
    scale = mp.gap(f32_params, init, names)
    effect = mp.gap(ref_params, f32_params, names, scale)
    p_gap = mp.gap(params, ref_params, names, scale) / effect
    ulps = [abs(a - b) / bf16_ulp(b) for a, b in zip(losses, ref_losses)]
    masters_bf16 = 1 - mp.not_bf16(mp.flat(params, names), slack=0)
    print(f"  {STEPS} steps: params {p_gap:.1e} of the bf16 effect from the "
          f"bf16 reference; loss gaps in ulps {['%.2f' % u for u in ulps]};"
          f" exported params that are bf16 values {masters_bf16:.2e}")
    for step, u in enumerate(ulps):
        assert u <= LOSS_ULPS, (
            f"{what} step {step}: loss {losses[step]} vs the bf16 "
            f"reference's {ref_losses[step]} (f32 {f32_losses[step]})")
    assert p_gap <= TRAJECTORY_RATIO, (
        f"{what}: the params after {STEPS} steps are {p_gap:.2f} of the bf16"
        f" effect from the bf16 reference's (at most {TRAJECTORY_RATIO})")
    assert masters_bf16 < 0.05, (
        f"{what}: {masters_bf16:.1%} of the params are bf16 values: the "
        f"master weights are not f32")
    still = [n for n in names if torch.equal(params[n], init[n])]
    assert not still, f"{what}: parameters did not train: {still[:5]}"


@pytest.mark.parametrize("world,reduce_dtype", [
    (1, None), (2, "bf16"), (2, "f32"), (3, "f32")])
def test_gpt_bf16_matches_reference(tmp_path, gpt, world, reduce_dtype):
    mod, archive, manifest = gpt
    assert [(c.dtype, c.error) for c in manifest.precision_checks] == [
        ("bfloat16", "")]
    tokens = numerics.write_tokens(
        tmp_path / "tokens.bin", VOCAB,
        STEPS * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1)
    check(f"GPT world {world} reduce {reduce_dtype or 'default'}", tmp_path,
          mod.build, archive, manifest, str(tmp_path / "tokens.bin"),
          lambda step: numerics.global_batch(tokens, step), world,
          reduce_dtype)


def test_vit_bf16_matches_reference(tmp_path, vit):
    mod, archive, manifest = vit
    data = tmp_path / "vit.safetensors"
    arrays = numerics.write_vit_tensors(data)
    check("ViT world 2 reduce f32", tmp_path, mod.build, archive, manifest,
          {"tensors": data},
          lambda step: numerics.tensors_global_batch(arrays, step), 2, "f32")


def test_gpt_bf16_loss_curve(tmp_path, tmp_path_factory):
    """STEPS_CURVE steps of the GPT whose loss is taken in f32
    (gpt.build_f32_loss) in f32 and in bf16 on learnable tokens
    (test_mixed_precision.markov_tokens), at CURVE_LR: the loss falls, every
    step's bf16 loss is within CURVE_RTOL of the f32 loss, and the bf16
    curve is PyTorch's own under the policy (hf_models.train).

    The loss in f32 and lr 1e-3 (AdamW's default): this is the policy's
    property, and PyTorch's own bf16 run of the GPT of `build` (cross-entropy
    in bf16, its loss a bf16 value) is 1.2% from its f32 run at worst over
    these 50 steps, at lr 1e-3 and 3e-3 alike; with the loss in f32, 0.16%
    at lr 1e-3 and 0.96% at the numerics tests' 3e-3.
    """
    mod, archive, _ = numerics.export_model(tmp_path_factory, "gpt",
                                            "build_f32_loss")
    tokens_path = tmp_path / "markov.bin"
    tokens = mp.markov_tokens(
        tokens_path, STEPS_CURVE * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1)
    f32, _ = worker_run(tmp_path, archive, tokens_path, 1, "f32",
                        steps=STEPS_CURVE, lr=CURVE_LR)
    bf16, _ = worker_run(tmp_path, archive, tokens_path, 1, "bf16",
                         steps=STEPS_CURVE, lr=CURVE_LR)
    ref, _ = reference_run(mod.build_f32_loss,
                           lambda step: numerics.global_batch(tokens, step),
                           1, "bf16", steps=STEPS_CURVE, lr=CURVE_LR)
    assert len(f32) == len(bf16) == STEPS_CURVE
    rel = [abs(b - a) / abs(a) for a, b in zip(f32, bf16)]
    worst = max(range(STEPS_CURVE), key=lambda s: rel[s])
    to_ref = max(abs(b - r) / abs(r) for b, r in zip(bf16, ref))
    print(f"\nGPT loss curve at lr {CURVE_LR}: f32 {f32[0]:.3f} -> "
          f"{f32[-1]:.3f}, bf16 {bf16[0]:.3f} -> {bf16[-1]:.3f}; worst "
          f"relative gap {rel[worst]:.2e} at step {worst}; bf16 - PyTorch's "
          f"bf16 {to_ref:.1e}")
    assert f32[-1] < 0.85 * f32[0], "the f32 run did not learn"
    assert f32 != bf16, "the bf16 run computed the f32 losses"
    assert rel[worst] <= CURVE_RTOL, (
        f"step {worst}: bf16 loss {bf16[worst]} vs f32 {f32[worst]}")
    # Measured 4.4e-4: 50 steps of bf16 let the f32 last-bit differences
    # grow (test_mixed_precision's docstring); a fifth of CURVE_RTOL.
    assert to_ref <= CURVE_RTOL / 5, "the bf16 curve is not PyTorch's"


def run_workers(spec, world, tag, *extra):
    """Every rank's step lines of standalone workers on `spec` (extra:
    worker flags, {rank} replaced by the rank)."""
    lines = []
    for r, (rc, out, err) in enumerate(
            numerics.run_standalone(spec, world, extra=extra)):
        assert rc == 0, f"{tag} rank {r}:\n{err[-3000:]}"
        lines += [json.loads(l) for l in out.splitlines()
                  if l.startswith('{"step"')]
    return lines


def test_gpt_bf16_predicted_peak_within_10_percent(tmp_path, gpt):
    """The memory model counts a bf16 job's sizes as the worker holds them
    (bf16 gathered params and gradients, f32 masters and moments): a bf16
    GPT job at world 2 is profiled under on-demand (--profile-out,
    --graph-out), tandem-plan plans it from that profile as the coordinator
    does, and the planned schedule's predicted peak is within 10% of every
    rank's counted peak, at every step, when it runs. The f32 job's counted
    peak is higher (its params, gathered and sharded, take twice the bytes).

    Measured: predicted 3255348 B, counted 3255348 B at every step of both
    ranks (f32: 4966968 B, the same). Before the communicator waited for
    Gloo to let go of a finished collective's buffers (Communicator's
    WaitReleased), a step now and then counted a gathered group's packed
    buffers more (149376 B, +4.6%, in most runs; 559104 B, +17%, in some).
    """
    _, archive, _ = gpt
    plan = os.path.join(os.path.dirname(numerics.WORKER), "..", "coordinator",
                        "tandem-plan")
    peaks = {}
    for dtype in ("f32", "bf16"):
        spec = tmp_path / f"spec-{dtype}.yaml"
        spec.write_text(f"""name: peak-{dtype}
model:
  kind: torchscript
  path: {archive}
  vocab: {VOCAB}
  dtype: {dtype}
data:
  kind: synthetic
batch:
  micro_batch: 4
  seq_len: {numerics.SEQ_LEN}
train:
  steps: 8
parallel:
  world_size: 2
""")
        profile = tmp_path / f"{dtype}.profile.{{rank}}"
        graph = tmp_path / f"{dtype}.graph.{{rank}}"
        baseline = run_workers(spec, 2, f"{dtype} baseline",
                               "--profile-out", str(profile),
                               "--graph-out", str(graph))
        schedule = tmp_path / f"{dtype}.schedule"
        out = subprocess.run(
            [plan, "--graph", str(graph).format(rank=0), "--profile",
             str(profile).format(rank=0), "--hw", "memory=64GiB",
             "--schedule-out", str(schedule)],
            capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        predicted = int(re.search(r"^peak .*?\((\d+) B\)", out.stdout,
                                  re.M).group(1))
        planned = run_workers(spec, 2, f"{dtype} planned",
                              "--schedule", str(schedule))
        measured = max(l["peak_bytes"] for l in planned)
        lowest = min(l["peak_bytes"] for l in planned)
        peaks[dtype] = measured
        print(f"\n{dtype}: on-demand counted "
              f"{max(l['peak_bytes'] for l in baseline)} B; planned: "
              f"predicted {predicted} B, counted {lowest}-{measured} B "
              f"({predicted / measured - 1:+.1%} of the highest)")
        if dtype == "bf16":
            for l in planned:
                assert abs(predicted - l["peak_bytes"]) <= 0.1 * l[
                    "peak_bytes"], (f"rank {l['rank']} step {l['step']}: "
                                    f"counted {l['peak_bytes']} B, "
                                    f"predicted {predicted} B")
    assert peaks["bf16"] < peaks["f32"]


def test_gpt_bf16_with_activation_checkpointing_equals_without(tmp_path, gpt):
    """bf16 and activation checkpointing together: the recompute runs the
    units on the same bf16 params and inputs, so losses and final params
    equal the run without checkpointing exactly (world 2, reduce f32), at a
    lower counted peak."""
    _, archive, manifest = gpt
    tokens_path = tmp_path / "tokens.bin"
    numerics.write_tokens(tokens_path, VOCAB,
                          STEPS * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1)
    runs = {}
    for checkpointing in (False, True):
        extra = "  activation_checkpointing: true\n" if checkpointing else ""
        ckpt = tmp_path / f"ckpt-{int(checkpointing)}"
        spec = tmp_path / f"spec-{int(checkpointing)}.yaml"
        spec.write_text(numerics.job_yaml(
            archive, 2, ckpt, f"  vocab: {VOCAB}\n  dtype: bf16\n{extra}",
            f"  kind: tokens\n  path: {tokens_path}\n  token_bytes: 2\n",
            f"  seq_len: {numerics.SEQ_LEN}\n",
            train={"steps": STEPS, "lr": numerics.LR, "master_dtype": "f32",
                   "reduce_dtype": "f32"}))
        lines = run_workers(spec, 2, f"checkpointing {checkpointing}")
        losses = [l["loss"] for l in sorted(lines, key=lambda l: l["step"])
                  if l["rank"] == 0]
        runs[checkpointing] = (losses, max(l["peak_bytes"] for l in lines),
                               numerics.final_params(str(ckpt), 2, manifest))
    (plain, plain_peak, plain_params) = runs[False]
    (ckpt, ckpt_peak, ckpt_params) = runs[True]
    print(f"\nbf16 peak {ckpt_peak} B with checkpointing, {plain_peak} B "
          f"without")
    assert len(plain) == STEPS
    assert ckpt == plain
    for name in plain_params:
        assert torch.equal(ckpt_params[name], plain_params[name]), name
    assert ckpt_peak < plain_peak
