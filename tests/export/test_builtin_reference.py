"""The built-in models against an independent Hugging Face-style reference
(issue "Training features", items 6 and 7).

Tandem's built-in `llama` and `moe` (worker/models/builtin_models.cc) are
trained by the real `tandem-worker --standalone` at worlds 1 and 2 and, in
this process, by tests/reference/hf_models.py: Llama and Mixtral written in
plain PyTorch from Hugging Face's modeling code, sharing nothing with the
worker, trained in eager mode with torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_ on the same global batches
(test_exported_numerics.py's data layout, optimizer settings and
tolerances). Both start from one set of weights drawn here (normal(0, 0.02),
norms ones) and written as a safetensors file under Hugging Face names,
which the job reads through `model.init_from`; the job's final checkpoint is
turned back into a safetensors file by `tandem export-weights` (the CLI, run
as a subprocess) and compared with the reference's params name by name. So
one comparison checks init_from, the export, the Hugging Face names and
layouts, and the models' math: losses step by step and the final params to
relative error 1e-5.

A second test exports a job's weights mid-run and starts a new job from
them: the AdamW moments are not in the file, so the new job is not the
uninterrupted run; it is the reference started from the exported weights
with a fresh optimizer (its first loss, the exported weights' loss on that
step's batch, to 1e-5).

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export/test_builtin_reference.py
"""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reference"))
import hf_models  # noqa: E402
import test_exported_numerics as numerics  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                reason=f"no {numerics.WORKER}")

# Grouped-query attention (kv_heads < heads), a head dim of 16.
CONFIGS = {
    "llama": hf_models.Config(layers=2, d_model=64, heads=4, kv_heads=2,
                              ffn=96, vocab=256),
    "moe": hf_models.Config(layers=2, d_model=64, heads=4, kv_heads=2,
                            ffn=96, vocab=256, experts=4, top_k=2),
}
STEPS = numerics.STEPS
RTOL = numerics.RTOL
INIT_SEED = 5


def builtin_yaml(preset, init_from, tokens_path, world, ckpt_dir,
                 steps=STEPS, micro_batch=None):
    """A builtin job spec: CONFIGS[preset] starting from `init_from`, fed
    by the token file, with the numerics tests' batch (or `micro_batch`
    sequences per rank) and optimizer, one checkpoint at the end."""
    c = CONFIGS[preset]
    moe = (f"  experts: {c.experts}\n  top_k: {c.top_k}\n"
           if c.experts else "")
    model = (f"  preset: {preset}\n  layers: {c.layers}\n"
             f"  d_model: {c.d_model}\n  heads: {c.heads}\n"
             f"  kv_heads: {c.kv_heads}\n  ffn: {c.ffn}\n"
             f"  vocab: {c.vocab}\n{moe}  init_from: {init_from}\n")
    data = f"  kind: tokens\n  path: {tokens_path}\n  token_bytes: 2\n"
    return numerics.job_yaml(None, world, ckpt_dir, model, data,
                             f"  seq_len: {numerics.SEQ_LEN}\n",
                             train={"steps": steps, "lr": numerics.LR},
                             every=steps, micro_batch=micro_batch)


def tokens_file(tmp_path, vocab):
    path = tmp_path / "tokens.bin"
    count = STEPS * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1
    return path, numerics.write_tokens(path, vocab, count)


def initial_weights(tmp_path, preset):
    """(the reference model, its initial state dict, the safetensors file
    holding it under Hugging Face names)."""
    model = hf_models.CausalLM(CONFIGS[preset])
    init = hf_models.draw_init(model, INIT_SEED)
    model.load_state_dict(init)
    path = tmp_path / f"init-{preset}.safetensors"
    hf_models.write_safetensors(init, path)
    return model, init, path


def export_weights(ckpt_dir, out):
    """`tandem export-weights CKPT -o OUT` as a user runs it; returns the
    file's tensors and metadata (read by the reference's own reader)."""
    env = dict(os.environ,
               PYTHONPATH=os.path.join(numerics.ROOT, "client", "python"))
    r = subprocess.run([sys.executable, "-m", "tandem", "export-weights",
                        str(ckpt_dir), "-o", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, f"export-weights failed:\n{r.stderr}"
    assert r.stdout.startswith("wrote "), r.stdout
    return hf_models.read_safetensors(out)


def compare(what, losses, ref_losses, got, ref, init=None):
    """Losses step by step within RTOL of the reference's; the params by
    Hugging Face name, all as one vector within RTOL and each tensor within
    10 * RTOL (test_exported_numerics.check_matches's bounds); and, given
    `init`, every param trained. Returns the worst errors."""
    assert len(losses) == len(ref_losses), f"{what}: {len(losses)} steps"
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= RTOL * abs(b), (
            f"{what} step {step}: loss {a} vs the reference's {b}")
    assert sorted(got) == sorted(ref), (
        f"{what}: names differ: only in the export "
        f"{sorted(set(got) - set(ref))[:5]}, only in the reference "
        f"{sorted(set(ref) - set(got))[:5]}")
    for n in ref:
        assert tuple(got[n].shape) == tuple(ref[n].shape), (
            f"{what}: {n} is {list(got[n].shape)}, the reference's "
            f"{list(ref[n].shape)}")
    names = sorted(ref)
    total = numerics.rel_err(torch.cat([got[n].flatten() for n in names]),
                             torch.cat([ref[n].flatten() for n in names]))
    worst = max((numerics.rel_err(got[n], ref[n]), n) for n in names)
    print(f"{what}: worst loss {loss_err:.2e}, all params {total:.2e}, "
          f"worst tensor {worst[1]} {worst[0]:.2e}")
    assert total <= RTOL, f"{what}: parameters' relative error {total:.2e}"
    assert worst[0] <= 10 * RTOL, (
        f"{what}: {worst[1]} relative error {worst[0]:.2e}")
    if init is not None:
        still = [n for n in names if torch.equal(got[n], init[n])]
        assert not still, f"{what}: parameters did not train: {still[:5]}"
    return loss_err, total, worst


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("preset", ["llama", "moe"])
def test_builtin_matches_hf_reference(tmp_path, preset, world):
    """init_from (Hugging Face names in) -> STEPS steps on the workers ->
    export-weights (Hugging Face names out) == the reference trained the
    same way."""
    tokens_path, tokens = tokens_file(tmp_path, CONFIGS[preset].vocab)
    model, init, init_path = initial_weights(tmp_path, preset)
    ref_losses, ref_params = numerics.reference(model, tokens)

    losses, ckpt = numerics.train(
        tmp_path, None, None, None, world, tag=f"-{preset}",
        spec_text=lambda ckpt: builtin_yaml(preset, init_path, tokens_path,
                                            world, ckpt))
    got, meta = export_weights(ckpt, tmp_path / "out.safetensors")
    assert meta["format"] == "pt" and meta["tandem.step"] == str(STEPS)
    compare(f"{preset} world {world}", losses, ref_losses, got, ref_params,
            init)


@pytest.mark.parametrize("preset", ["llama", "moe"])
def test_exported_weights_start_a_new_job(tmp_path, preset):
    """A job trains half the steps at world 2 and checkpoints; its export
    starts a new job at world 1 (init_from), which trains on from exactly
    those weights with a fresh optimizer."""
    half = STEPS // 2
    vocab = CONFIGS[preset].vocab
    tokens_path, tokens = tokens_file(tmp_path, vocab)
    model, init, init_path = initial_weights(tmp_path, preset)
    ref_losses, ref_params = numerics.reference(model, tokens, steps=half)

    losses, ckpt = numerics.train(
        tmp_path, None, None, None, 2, tag=f"-{preset}-first",
        spec_text=lambda ckpt: builtin_yaml(preset, init_path, tokens_path,
                                            2, ckpt, steps=half))
    mid_path = tmp_path / "mid.safetensors"
    mid, meta = export_weights(ckpt, mid_path)
    assert meta["tandem.step"] == str(half)
    compare(f"{preset} first {half} steps", losses, ref_losses, mid,
            ref_params, init)

    # The new job: the reference from the exported weights, fresh AdamW.
    model = hf_models.CausalLM(CONFIGS[preset])
    model.load_state_dict(mid)
    with torch.no_grad():
        start_loss = model(**numerics.global_batch(tokens, 0)).item()
    ref_losses, ref_params = numerics.reference(model, tokens, steps=half)
    assert ref_losses[0] == start_loss
    losses, ckpt = numerics.train(
        tmp_path, None, None, None, 1, tag=f"-{preset}-second",
        spec_text=lambda ckpt: builtin_yaml(preset, mid_path, tokens_path,
                                            1, ckpt, steps=half))
    assert abs(losses[0] - start_loss) <= RTOL * abs(start_loss), (
        f"the new job's first loss {losses[0]} is not the exported weights' "
        f"{start_loss}: the weights did not come in intact")
    got, _ = export_weights(ckpt, tmp_path / "end.safetensors")
    compare(f"{preset} from the export", losses, ref_losses, got, ref_params,
            mid)
