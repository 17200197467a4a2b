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
import torch

from test_exported_numerics import (WORKER, assert_no_dropout,
                                    check_matches, check_token_model,
                                    export_model, final_params, key_biases,
                                    load_model, reference, tandem,
                                    tensors_global_batch, tensors_spec_yaml,
                                    train)


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


# ------------------------------------------- third-party models, unchanged

SAMPLES = 40  # not a multiple of the global batch: step 6 wraps

THIRD_PARTY = {
    # model file: (unit names, glues as (name, first unit, unit count))
    "conformer": (["conformer.conformer_layers.0",
                   "conformer.conformer_layers.1", "head"],
                  [("conformer", 0, 2)]),
    "wav2vec2": (["wav2vec2.feature_extractor.conv_layers.0",
                  "wav2vec2.feature_extractor.conv_layers.1",
                  "wav2vec2.encoder.feature_projection",
                  "wav2vec2.encoder.transformer.pos_conv_embed",
                  "wav2vec2.encoder.transformer.layer_norm",
                  "wav2vec2.encoder.transformer.layers.0",
                  "wav2vec2.encoder.transformer.layers.1", "head"],
                 [("wav2vec2.feature_extractor", 0, 2),
                  ("wav2vec2.encoder", 2, 5)]),
    "roberta": (["roberta.encoder.transformer.token_embedding",
                 "roberta.encoder.transformer.positional_embedding",
                 "roberta.encoder.transformer.embedding_layer_norm",
                 "roberta.encoder.transformer.layers.layers.0",
                 "roberta.encoder.transformer.layers.layers.1", "head"],
                [("roberta.encoder", 0, 5)]),
    # torch.fx captures torchvision's containers: every block a unit, no glue.
    "swin": (["embed", "swin.features.1.0", "after.swin.features.1.0",
              "swin.features.3.0", "head"], []),
    "convnext": (["embed", "convnext.features.1.0",
                  "after.convnext.features.1.0", "convnext.features.3.0",
                  "head"], []),
}


def normalized_away(module):
    """{param: all of it} for every bias right before a BatchNorm (the
    Conformer's depthwise convolution): the normalization removes it, so its
    true gradient is zero and it steps on rounding noise."""
    out = {}
    for path, m in module.named_modules():
        if isinstance(m, torch.nn.Sequential):
            layers = list(m.named_children())
            for (name, a), (_, b) in zip(layers, layers[1:]):
                if (isinstance(b, torch.nn.modules.batchnorm._BatchNorm) and
                        isinstance(getattr(a, "bias", None),
                                   torch.nn.Parameter)):
                    out[f"{path}.{name}.bias"] = slice(0, a.bias.numel())
    return out


def zero_gradient_elements(module):
    """key_biases, plus the key projection's bias of torchaudio's own
    attention (wav2vec2's SelfAttention), which softmax ignores as well."""
    out = key_biases(module)
    for path, m in module.named_modules():
        if type(m).__name__ == "SelfAttention" and hasattr(m, "k_proj"):
            bias = m.k_proj.bias
            if isinstance(bias, torch.nn.Parameter):
                out[f"{path}.k_proj.bias"] = slice(0, bias.numel())
    return out


@pytest.fixture(scope="module", params=sorted(THIRD_PARTY))
def third_party(request, tmp_path_factory):
    return (request.param,) + export_model(tmp_path_factory, request.param)


def test_third_party_model_is_one_unit_per_layer(third_party):
    name, mod, _, manifest = third_party
    units, glues = THIRD_PARTY[name]
    assert [u.name for u in manifest.units] == units
    assert [(g.name, g.first_unit, g.unit_count)
            for g in manifest.glues] == glues
    owned = [p for u in manifest.units for p in u.params]
    assert sorted(owned) == sorted(p.name for p in manifest.params)


def test_weight_norm_exports_without_touching_the_module():
    """wav2vec2's position convolution is under weight norm: the archive
    trains weight_g and weight_v, and exporting leaves the user's module
    as it was (torchaudio's __prepare_scriptable__ would remove the hook in
    place)."""
    mod = load_model("wav2vec2")
    module, batch = mod.build()
    manifest = tandem.export(module, batch)
    conv = module.wav2vec2.encoder.transformer.pos_conv_embed.conv
    assert hasattr(conv, "weight_g") and hasattr(conv, "weight_v")
    names = {p.name for p in manifest.params}
    assert ("wav2vec2.encoder.transformer.pos_conv_embed.conv.weight_g"
            in names)
    assert "wav2vec2.encoder.transformer.pos_conv_embed.conv.weight" \
        not in names


@pytest.mark.skipif(not os.path.exists(WORKER), reason=f"no {WORKER}")
def test_third_party_model_matches_pytorch_eager(tmp_path, third_party):
    name, mod, archive, manifest = third_party
    arrays = mod.data(SAMPLES)
    data = tmp_path / f"{name}.safetensors"
    with open(data, "wb") as f:
        tandem.export.write_safetensors(list(arrays.items()), f)
    module, _ = mod.build()
    assert_no_dropout(module)
    # BatchNorm (the Conformer's) normalizes over each rank's slice, as DDP
    # and FSDP do: the reference runs the slices apart.
    batch_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                     for m in module.modules())
    ref_losses, ref_params = reference(module, arrays,
                                       batch_of=tensors_global_batch,
                                       ranks=2 if batch_norm else 1)
    losses, ckpt = train(
        tmp_path, archive, None, None, 2,
        spec_text=lambda ckpt: tensors_spec_yaml(archive, data, 2, ckpt))
    init, _ = mod.build()
    check_matches(f"{name} world 2", losses, ref_losses,
                  final_params(ckpt, 2, manifest), ref_params,
                  dict(init.named_parameters()), manifest,
                  noise=zero_gradient_elements(init),
                  unchecked=normalized_away(init))
