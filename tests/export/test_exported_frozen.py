"""Frozen parameters end to end (issue 12): fine-tuning with some params at
requires_grad=False. The exported archive marks them (`requires_grad:
false`), and the worker gathers them for their uses but gives them no
gradient, no reduce-scatter and no optimizer state.

Trained by real `tandem-worker --standalone` processes at worlds 1, 2 and 3
and compared with PyTorch eager: torch.optim.AdamW and clip_grad_norm_ over
the trainable params only (test_exported_numerics.py's reference), the same
global batches. Losses and trained params within relative error 1e-5;
frozen params exactly their initial values, in the worker's checkpoint and
in PyTorch.

- GPT (tests/models/gpt.py:build_frozen): the token and position embeddings
  frozen, the lm_head tied to the token embedding (frozen with it). The
  first unit reads nothing trainable, so no gradient leaves it.
- LoRA (tests/models/lora.py): a base MLP language model whose Linear
  weights and embedding are frozen, with trainable low-rank adapters.

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export
"""

import os
import pathlib
import sys
import types

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import test_exported_numerics as numerics  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(numerics.WORKER),
                                reason=f"no {numerics.WORKER}")


def export_frozen(tmp_path_factory, model, build):
    """(build(), archive path, manifest) of tests/models/<model>.py."""
    mod = numerics.load_model(model)
    module, batch = getattr(mod, build)()
    path = str(tmp_path_factory.mktemp(model) / f"{model}.tandem")
    manifest = numerics.tandem.export(module, batch, path=path)
    return getattr(mod, build), path, manifest


@pytest.fixture(scope="module")
def gpt_frozen(tmp_path_factory):
    return export_frozen(tmp_path_factory, "gpt", "build_frozen")


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    return export_frozen(tmp_path_factory, "lora", "build")


def check_frozen_model(tmp_path, model_archive, world, vocab=512,
                       expect_frozen=()):
    build, archive, manifest = model_archive
    frozen = sorted(p.name for p in manifest.params if not p.requires_grad)
    assert frozen == sorted(expect_frozen), (
        f"the manifest's frozen params {frozen}, expected {expect_frozen}")
    tokens_path = tmp_path / "tokens.bin"
    tokens = numerics.write_tokens(
        tokens_path, vocab, numerics.STEPS * numerics.GLOBAL_BATCH *
        numerics.SEQ_LEN + 1)

    module, _ = build()
    # The reference steps and clips only what requires grad.
    ref_losses, ref_params = numerics.reference(module, tokens)
    losses, ckpt = numerics.train(tmp_path, archive, str(tokens_path), vocab,
                                  world)
    got = numerics.final_params(ckpt, world, manifest)
    init_module, _ = build()
    init = {n: p.detach() for n, p in init_module.named_parameters()}

    # Frozen: bit for bit where they started, in the worker and in PyTorch.
    for name in frozen:
        assert torch.equal(ref_params[name], init[name]), name
        assert torch.equal(got[name], init[name]), (
            f"world {world}: frozen {name} changed by "
            f"{(got[name] - init[name]).abs().max().item():.3g}")
    # The worker keeps no optimizer state for them in its checkpoint.
    blobs = numerics.read_rank_checkpoint(
        os.path.join(ckpt, sorted(os.listdir(ckpt))[-1], "rank-0.ckpt"))
    for name in frozen:
        assert f"param/{name}/exp_avg" not in blobs, name
        assert f"param/{name}/shard" in blobs, name
    trained = [p for p in manifest.params if p.requires_grad]
    assert trained
    for p in trained:
        assert f"param/{p.name}/exp_avg" in blobs, p.name

    # Trained: losses and params as PyTorch's (and every one moved).
    numerics.check_matches(
        f"{manifest.name} frozen world {world}", losses, ref_losses,
        {p.name: got[p.name] for p in trained},
        {p.name: ref_params[p.name] for p in trained},
        {p.name: init[p.name] for p in trained},
        types.SimpleNamespace(params=trained))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_gpt_frozen_embeddings_match_pytorch_eager(tmp_path, gpt_frozen,
                                                    world):
    check_frozen_model(tmp_path, gpt_frozen, world,
                       expect_frozen=["tok_emb.weight", "pos_emb.weight"])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_lora_adapters_match_pytorch_eager(tmp_path, lora, world):
    build, _, manifest = lora
    module, _ = build()
    base = [n for n, p in module.named_parameters() if not p.requires_grad]
    assert all(".base." in n or n.startswith("emb") for n in base), base
    assert any(".lora_a" in p.name for p in manifest.params)
    check_frozen_model(tmp_path, lora, world, expect_frozen=base)
