"""Activation checkpointing of exported models (issue 13, item 1).

`model.activation_checkpointing: true` on an exported archive recomputes
every unit but the last (the one returning the loss) in backward
(worker/README.md, "Activation checkpointing"). Checked with the real
`tandem-worker --standalone` processes:

- the GPT of tests/models/gpt.py trains under it as PyTorch eager trains it
  (test_exported_numerics.py's independent reference: torch.optim.AdamW,
  clip_grad_norm_, the same global batches) at worlds 1, 2 and 3, losses
  and parameters within 1e-5, and its measured peak is lower than the run
  without checkpointing;
- a GPT with dropout repeats itself: `train.seed` seeds the generators
  dropout draws from (unseeded, libtorch seeds them from /dev/urandom);
- with dropout, the recompute draws the same random numbers as the
  forward did (the generator's state is kept per node, as
  torch.utils.checkpoint's preserve_rng_state), so losses and parameters
  equal the run without checkpointing. The reference here is the worker
  itself: PyTorch's random numbers are not the worker's (see
  test_exported_numerics.py), and this checks that the recompute changes
  nothing.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export
"""

import json
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import test_exported_numerics as numerics  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                reason=f"no {numerics.WORKER}")

VOCAB = 512


def export(tmp_path_factory, build):
    """(tests/models/gpt.py's `build` function, archive path, manifest)."""
    mod, path, manifest = numerics.export_model(tmp_path_factory, "gpt", build)
    return getattr(mod, build), path, manifest


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    return export(tmp_path_factory, "build")


@pytest.fixture(scope="module")
def gpt_dropout(tmp_path_factory):
    return export(tmp_path_factory, "build_dropout")


def run(tmp_path, archive, tokens_path, world, checkpointing, tag):
    """Trains the archive; returns (rank 0's step lines, checkpoint dir)."""
    ckpt = tmp_path / f"ckpt-{tag}"
    extra = f"  vocab: {VOCAB}\n"
    if checkpointing:
        extra += "  activation_checkpointing: true\n"
    spec = tmp_path / f"spec-{tag}.yaml"
    spec.write_text(numerics.job_yaml(
        archive, world, ckpt, extra,
        f"  kind: tokens\n  path: {tokens_path}\n  token_bytes: 2\n",
        f"  seq_len: {numerics.SEQ_LEN}\n"))
    runs = numerics.run_standalone(spec, world)
    for r, (rc, _, err) in enumerate(runs):
        assert rc == 0, f"{tag} rank {r} failed:\n{err[-3000:]}"
    lines = [json.loads(l) for l in runs[0][1].splitlines()
             if l.startswith('{"step"')]
    assert len(lines) == numerics.STEPS, f"{tag}: {len(lines)} steps"
    return lines, str(ckpt)


def tokens_file(tmp_path):
    path = tmp_path / "tokens.bin"
    tokens = numerics.write_tokens(
        path, VOCAB,
        numerics.STEPS * numerics.GLOBAL_BATCH * numerics.SEQ_LEN + 1)
    return str(path), tokens


@pytest.mark.parametrize("world", [1, 2, 3])
def test_gpt_checkpointed_matches_pytorch_eager(tmp_path, gpt, world):
    build, archive, manifest = gpt
    tokens_path, tokens = tokens_file(tmp_path)
    module, _ = build()
    ref_losses, ref_params = numerics.reference(module, tokens)
    lines, ckpt = run(tmp_path, archive, tokens_path, world, True, "ckpt")
    init, _ = build()
    numerics.check_matches(
        f"{manifest.name} world {world}, activation checkpointing",
        [l["loss"] for l in lines], ref_losses,
        numerics.final_params(ckpt, world, manifest), ref_params,
        dict(init.named_parameters()), manifest)
    if world == 1:
        # What it is for: the blocks' activations are not kept.
        plain, _ = run(tmp_path, archive, tokens_path, world, False, "plain")
        peak = max(l["peak_bytes"] for l in lines)
        plain_peak = max(l["peak_bytes"] for l in plain)
        print(f"peak {peak} B with checkpointing, {plain_peak} B without")
        assert peak < plain_peak, (peak, plain_peak)


def test_dropout_recompute_draws_the_forwards_numbers(tmp_path, gpt_dropout):
    _, archive, manifest = gpt_dropout
    tokens_path, _ = tokens_file(tmp_path)
    world = 2
    plain, plain_ckpt = run(tmp_path, archive, tokens_path, world, False,
                            "plain")
    again, _ = run(tmp_path, archive, tokens_path, world, False, "again")
    assert [l["loss"] for l in again] == [l["loss"] for l in plain], (
        "the same job with dropout did not repeat its losses")
    lines, ckpt = run(tmp_path, archive, tokens_path, world, True, "ckpt")
    for step, (got, want) in enumerate(zip(lines, plain)):
        assert abs(got["loss"] - want["loss"]) <= numerics.RTOL * abs(
            want["loss"]), (f"step {step}: loss {got['loss']} with "
                             f"checkpointing, {want['loss']} without")
    got = numerics.final_params(ckpt, world, manifest)
    want = numerics.final_params(plain_ckpt, world, manifest)
    for name in sorted(want):
        err = numerics.rel_err(got[name], want[name])
        assert err <= numerics.RTOL, f"{name}: relative error {err:.2e}"
