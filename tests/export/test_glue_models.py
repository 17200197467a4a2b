"""Models whose containers torch.fx cannot capture train per layer (issue
35): the container runs as glue (proto/tandem/v1/archive.proto,
ArchiveGlue), scripted with TorchScript, and calls its layers, which stay
units of their own, through tandem::call_unit. Each model is exported
unchanged, trained by real `tandem-worker --standalone` processes at world
2, and compared with PyTorch eager training of the same module
(test_exported_numerics.py's reference: AdamW, clipping, the same global
batches, 8 steps, 1e-5).

    TANDEM_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/export
"""

import os

import pytest

from test_exported_numerics import (WORKER, assert_no_dropout,
                                    check_token_model, export_model)


@pytest.fixture(scope="module")
def seq2seq_archive(tmp_path_factory):
    return export_model(tmp_path_factory, "seq2seq")


def test_seq2seq_glue_keeps_every_layer_a_unit(seq2seq_archive):
    """nn.Transformer checks its inputs' shapes in forward: it is the glue,
    and its encoder's and decoder's layers and final norms are its units,
    in the order it calls them."""
    _, _, manifest = seq2seq_archive
    assert [u.name for u in manifest.units] == [
        "embed",
        "transformer.encoder.layers.0", "transformer.encoder.layers.1",
        "transformer.encoder.norm",
        "transformer.decoder.layers.0", "transformer.decoder.layers.1",
        "transformer.decoder.norm",
        "head"]
    [glue] = manifest.glues
    assert (glue.name, glue.first_unit, glue.unit_count) == (
        "transformer", 1, 6)
    # Every param belongs to one unit; the glue holds none.
    owned = [p for u in manifest.units for p in u.params]
    assert sorted(owned) == sorted(p.name for p in manifest.params)


@pytest.mark.skipif(not os.path.exists(WORKER), reason=f"no {WORKER}")
def test_seq2seq_matches_pytorch_eager(tmp_path, seq2seq_archive):
    mod, _, _ = seq2seq_archive
    assert_no_dropout(mod.build()[0])
    check_token_model(tmp_path, seq2seq_archive, 2)
