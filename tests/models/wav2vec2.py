"""torchaudio's wav2vec 2.0 model, small, as an utterance classifier, for
`tandem export`. Nothing here knows about Tandem.

torchaudio.models.wav2vec2_model, unchanged: a convolutional feature
extractor (whose forward checks its input's rank, so it runs as glue over
its conv blocks), then an encoder (glue too) over a feature projection, a
convolutional position embedding under weight norm (its weight_g and
weight_v are the params; the unit computes the weight from them as the
hook does), a layer norm and two transformer layers. Each is a unit of its
own. The feature extractor uses layer norm ("layer_norm" mode), not group
norm: torch 1.13's GroupNorm backward on CPU gives different gradients from
run to run for these shapes, in PyTorch eager alone. Dropout and layer
drop are 0, so training is deterministic.

Batch inputs: waveforms float32 [n, 400], labels int64 [n] (0 to 4); the
`tensors` data source feeds them.

    tandem export tests/models/wav2vec2.py:build -o wav2vec2.tandem
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchaudio.models import wav2vec2_model

SAMPLES, CLASSES = 400, 5


class Wav2Vec2Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.wav2vec2 = wav2vec2_model(
            extractor_mode="layer_norm",
            extractor_conv_layer_config=[(8, 10, 5), (8, 3, 2)],
            extractor_conv_bias=False, encoder_embed_dim=16,
            encoder_projection_dropout=0.0, encoder_pos_conv_kernel=4,
            encoder_pos_conv_groups=2, encoder_num_layers=2,
            encoder_num_heads=2, encoder_attention_dropout=0.0,
            encoder_ff_interm_features=32, encoder_ff_interm_dropout=0.0,
            encoder_dropout=0.0, encoder_layer_norm_first=False,
            encoder_layer_drop=0.0, aux_num_out=CLASSES)

    def forward(self, waveforms, labels):
        logits, _ = self.wav2vec2(waveforms)
        return F.cross_entropy(logits.mean(1), labels)


def data(n, seed=11):
    g = torch.Generator().manual_seed(seed)
    return {"waveforms": torch.randn(n, SAMPLES, generator=g),
            "labels": torch.randint(0, CLASSES, (n,), generator=g)}


def build():
    """(module, example_batch) from a fixed seed."""
    torch.manual_seed(0)
    return Wav2Vec2Classifier(), data(4, seed=2)
